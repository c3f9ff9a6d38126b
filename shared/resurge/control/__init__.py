"""What the control plane's services share: job records, the rank planner, the
messages sent about a job, the worker groups a record asks for, node views, the client
API the CLI and tests use, and the pure decisions (no I/O, no bus) that the restarter,
the scaler and the goodput simulator all make with the same code: the recovery ladder
(:mod:`.recovery_policy`), admission (:mod:`.admission`) and the elastic resize
decision (:mod:`.elastic_decision`, over :mod:`.free_slots`)."""
