"""Pure decisions over job records, no I/O and no bus: what the restarter, the scaler
and the goodput simulator all decide with the same code: the recovery ladder
(:mod:`.ladder`, :mod:`.recovery_policy`), a job's lifecycle (:mod:`.lifecycle`),
admission (:mod:`.admission`), the elastic resize (:mod:`.elastic_decision`, over
:mod:`.free_slots`), rank planning (:mod:`.planner`), the worker groups a record asks
for (:mod:`.worker_groups`), checkpoint completeness (:mod:`.checkpoint_count`), where
a generation's state came from (:mod:`.restore_reports`) and a finished job's last steps
(:mod:`.job_end`)."""
