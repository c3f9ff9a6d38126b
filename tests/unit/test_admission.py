from datetime import UTC, datetime, timedelta

from resurge.cluster import NodeInfo
from resurge.events import JobPhase
from resurge.jobspec import TrainingJob, parse_job
from resurge_scaler.admission import (
    admission_order,
    mark_replica_finished,
    new_record,
    place,
    start,
    update_live,
)


def job(name: str = "j", replicas: int = 2, nproc: int = 2) -> TrainingJob:
    return parse_job(
        {
            "metadata": {"name": name},
            "spec": {"command": ["x"], "nprocPerNode": nproc, "replicas": {"min": replicas}},
        }
    )


def nodes(*slots: int) -> list[NodeInfo]:
    return [NodeInfo(name=f"n{i}", slots=s, address=f"10.0.0.{i}") for i, s in enumerate(slots)]


def test_replicas_spread_over_nodes_with_the_most_free_slots() -> None:
    used: dict[str, int] = {}
    placements = place(job(replicas=3, nproc=2), nodes(4, 4, 2), used)
    assert placements is not None
    assert sorted(p.node for p in placements) == ["n0", "n1", "n2"]
    assert used == {"n0": 2, "n1": 2, "n2": 2}
    assert {p.address for p in placements} == {"10.0.0.0", "10.0.0.1", "10.0.0.2"}


def test_a_job_that_does_not_fit_takes_nothing() -> None:
    used = {"n0": 3}
    assert place(job(replicas=2, nproc=2), nodes(4, 1), used) is None
    assert used == {"n0": 3}


def test_cordoned_and_unhealthy_nodes_get_no_replicas() -> None:
    pool = nodes(4, 4, 4)
    pool[0].cordoned = True
    pool[1].healthy = False
    placements = place(job(replicas=2, nproc=2), pool, {})
    assert placements is not None and {p.node for p in placements} == {"n2"}


def test_pending_jobs_are_admitted_by_priority_then_submission() -> None:
    now = datetime.now(UTC)
    first, second, urgent = (new_record(job(n), None) for n in ("a", "b", "c"))
    first.submitted, second.submitted = now, now + timedelta(seconds=1)
    urgent.submitted = now + timedelta(seconds=2)
    urgent.spec = urgent.spec.model_copy(
        update={"spec": urgent.spec.spec.model_copy(update={"priority": 10})}
    )
    running = new_record(job("d"), None)
    running.phase = JobPhase.RUNNING
    order = admission_order([second, running, first, urgent])
    assert [r.name for r in order] == ["c", "a", "b"]


def test_start_and_finish() -> None:
    record = new_record(job(replicas=2), None)
    assert record.phase is JobPhase.PENDING and record.generation == 0
    placements = place(record.spec, nodes(2, 2), {})
    assert placements is not None and start(record, placements)
    assert record.phase is JobPhase.RUNNING and not start(record, placements)
    assert not mark_replica_finished(record, 0, generation=1)  # not the current generation
    assert mark_replica_finished(record, 0, generation=0)
    assert not mark_replica_finished(record, 0, generation=0)
    assert mark_replica_finished(record, 1, generation=0)
    assert record.phase is JobPhase.SUCCEEDED


def test_resubmitted_name_starts_past_the_old_generation() -> None:
    old = new_record(job(), None)
    old.generation = 4
    assert new_record(job(), old).generation == 5


def test_resubmitting_a_running_job_updates_only_its_monitoring() -> None:
    record = new_record(job(), None)
    changed = parse_job({
        "metadata": {"name": "j"},
        "spec": {"command": ["other"], "nprocPerNode": 2, "replicas": {"min": 2},
                 "monitoring": {"heartbeatTimeoutSeconds": 30}},
    })  # fmt: skip
    assert update_live(record, changed)
    assert record.spec.spec.monitoring.heartbeat_timeout_seconds == 30
    assert record.spec.spec.command == ["x"]
    assert not update_live(record, changed)
