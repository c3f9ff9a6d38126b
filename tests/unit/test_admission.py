from resurge.events import JobPhase
from resurge.jobspec import parse_job
from resurge_scaler.admission import admit, mark_replica_finished


def job(replicas: int):  # type: ignore[no-untyped-def]
    return parse_job(
        {"metadata": {"name": "j"}, "spec": {"command": ["x"], "replicas": {"min": replicas}}}
    )


def test_admit_places_min_replicas_round_robin() -> None:
    rec = admit(job(3), ["a", "b"], previous=None)
    assert [(p.replica, p.node) for p in rec.placements] == [(0, "a"), (1, "b"), (2, "a")]
    assert rec.generation == 0 and rec.phase is JobPhase.RUNNING


def test_resubmitted_name_starts_past_the_old_generation() -> None:
    old = admit(job(1), ["a"], previous=None)
    old.generation = 4
    assert admit(job(1), ["a"], previous=old).generation == 5


def test_job_succeeds_once_every_replica_finished_in_current_generation() -> None:
    rec = admit(job(2), ["a"], previous=None)
    assert not mark_replica_finished(rec, 0, generation=1)  # not the current generation
    assert mark_replica_finished(rec, 0, generation=0)
    assert not mark_replica_finished(rec, 0, generation=0)
    assert rec.phase is JobPhase.RUNNING
    assert mark_replica_finished(rec, 1, generation=0)
    assert rec.phase is JobPhase.SUCCEEDED
