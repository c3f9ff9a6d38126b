from datetime import UTC, datetime, timedelta

from resurge.cluster import NodeInfo
from resurge.control.decisions.admission import (
    UNHOLDABLE,
    admission_order,
    cannot_hold,
    mark_replica_finished,
    new_record,
    place,
    start,
    update_live,
    wait_reason,
    why_waiting,
)
from resurge.control.state.records import JobRecord
from resurge.events import JobPhase
from resurge.jobspec import TrainingJob
from resurge.local import job_factory


def job(name: str = "j", replicas: int = 2, nproc: int = 2) -> TrainingJob:
    return job_factory.job(name, nproc=nproc, replicas=replicas, preload=None)


def nodes(*slots: int) -> list[NodeInfo]:
    return [NodeInfo(name=f"n{i}", slots=s, address=f"10.0.0.{i}") for i, s in enumerate(slots)]


def test_replicas_spread_over_nodes_with_the_most_free_slots() -> None:
    used: dict[str, int] = {}
    fit = place(job(replicas=3, nproc=2), nodes(4, 4, 2), used)
    assert fit is not None
    placements, spares = fit
    assert spares == []
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
    fit = place(job(replicas=2, nproc=2), pool, {})
    assert fit is not None and {p.node for p in fit[0]} == {"n2"}


def job_with_spares(spares: int) -> TrainingJob:
    return job_factory.job("s", nproc=2, replicas=2, recovery={"spares": spares}, preload=None)


def test_spares_are_held_on_nodes_without_a_replica_and_count_as_taken() -> None:
    used: dict[str, int] = {}
    fit = place(job_with_spares(1), nodes(2, 2, 2), used)
    assert fit is not None
    placements, spares = fit
    assert len(spares) == 1 and spares[0] not in {p.node for p in placements}
    assert used == {"n0": 2, "n1": 2, "n2": 2}
    assert place(job_with_spares(2), nodes(2, 2, 2), {}) is None  # no room for two spares
    record = new_record(job_with_spares(1), None)
    assert start(record, placements, spares) and record.spare_nodes == spares


def test_avoided_nodes_get_no_replicas() -> None:
    fit = place(job(replicas=2, nproc=2), nodes(2, 2, 2), {}, avoid=["n0"])
    assert fit is not None and {p.node for p in fit[0]} == {"n1", "n2"}
    assert place(job(replicas=2, nproc=2), nodes(2, 2), {}, avoid=["n0"]) is None


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


def test_a_held_job_is_never_admitted() -> None:
    """spec.suspend (its owner's, or Kueue's hold on a queued job): not in the order."""
    held, free = new_record(job("h"), None), new_record(job("f"), None)
    held.spec = held.spec.model_copy(
        update={"spec": held.spec.spec.model_copy(update={"suspend": True})}
    )
    assert [r.name for r in admission_order([held, free])] == ["f"]


def phase(record: JobRecord) -> JobPhase:
    """The phase now: start and mark_replica_finished change the record in place."""
    return record.phase


def test_start_and_finish() -> None:
    record = new_record(job(replicas=2), None)
    assert phase(record) is JobPhase.PENDING and record.generation == 0
    fit = place(record.spec, nodes(2, 2), {})
    assert fit is not None and start(record, *fit)
    assert phase(record) is JobPhase.RUNNING and not start(record, *fit)
    assert not mark_replica_finished(record, 0, generation=1)  # not the current generation
    assert mark_replica_finished(record, 0, generation=0)
    assert not mark_replica_finished(record, 0, generation=0)
    assert mark_replica_finished(record, 1, generation=0)
    assert phase(record) is JobPhase.SUCCEEDED


def test_resubmitted_name_starts_past_the_old_generation() -> None:
    old = new_record(job(), None)
    old.generation = 4
    assert new_record(job(), old).generation == 5


def test_resubmitting_a_running_job_updates_only_its_monitoring() -> None:
    record = new_record(job(), None)
    changed = job_factory.job(
        "j",
        ["other"],
        nproc=2,
        replicas=2,
        monitoring={"heartbeatTimeoutSeconds": 30},
        preload=None,
    )
    assert update_live(record, changed)
    assert record.spec.spec.monitoring.heartbeat_timeout_seconds == 30
    assert record.spec.spec.command == ["x"]
    assert not update_live(record, changed)


def test_a_waiting_job_says_which_nodes_are_cordoned_avoided_or_too_small() -> None:
    cluster = nodes(2, 2, 2)
    cluster[0].cordoned, cluster[0].cordon_reason = True, "gpu_xid_79 (xid:node-0:79)"
    cluster[2].healthy = False
    why = why_waiting(job(replicas=2), cluster, {"n1": 1}, avoid=["n0"])
    assert why.startswith("waiting for capacity: needs 2 node(s) with 2 free slot(s)")
    assert "n0 avoided by this job" in why
    assert "n1 has 1 of 2 slot(s) free" in why
    assert "n2 unhealthy (`resurge node uncordon n2` once it is repaired)" in why
    why = why_waiting(job(replicas=2), cluster, {}, silent=["n7"], local=True)
    assert "n7 not reporting (`resurge node up n7` if it was powered off)" in why
    assert "n7 not reporting" in why_waiting(job(replicas=2), cluster, {}, silent=["n7"])
    why = why_waiting(job(replicas=2), cluster, {})
    assert "n0 cordoned: gpu_xid_79 (xid:node-0:79) (`resurge node uncordon n0`)" in why
    assert "no node is reporting" in why_waiting(job(), [], {})


def test_the_wait_reason_keeps_what_a_requeue_said_and_changes_only_when_new() -> None:
    record = new_record(job(), None)
    assert wait_reason(record, "waiting for capacity: n0 cordoned")
    assert record.message == "waiting for capacity: n0 cordoned"
    assert not wait_reason(record, "waiting for capacity: n0 cordoned")
    record.message = "gpu_xid_79 on n0: no node to move to"
    assert wait_reason(record, "waiting for capacity: n1 full")
    assert wait_reason(record, "waiting for capacity: n1 has 0 of 2 slot(s) free")
    assert record.message == (
        "gpu_xid_79 on n0: no node to move to | waiting for capacity: n1 has 0 of 2 slot(s) free"
    )
    record.phase = JobPhase.RUNNING
    assert not wait_reason(record, "anything")


def test_a_job_no_node_could_hold_says_what_it_needs_and_what_the_cluster_has() -> None:
    two_per_node = job(replicas=1, nproc=2)
    why = why_waiting(two_per_node, nodes(1, 1), {}, local=True)
    assert why == (
        "no node of this cluster can hold it: no node has 2 free-able slots for "
        "nprocPerNode 2 (largest node: 1 GPU); add a node with `resurge node add --gpus 2`"
    )
    assert cannot_hold(two_per_node, nodes(1, 1)) == why.replace(
        "`resurge node add --gpus 2`", "2 GPUs"
    )
    # Busy or cordoned nodes can be freed: only their size counts.
    cluster = nodes(2, 1)
    cluster[0].cordoned = True
    assert cannot_hold(two_per_node, cluster) is None
    assert cannot_hold(two_per_node, []) is None, "no node reports yet: nothing to judge"


def test_a_job_the_nodes_together_could_not_hold_says_how_many_more_it_needs() -> None:
    why = cannot_hold(job(replicas=3, nproc=2), nodes(2, 3, 1), local=True)
    assert why == (
        "no node of this cluster can hold it: it needs 3 replica(s) of nprocPerNode 2 "
        "slots, and its 3 node(s) hold at most 2 (largest node: 3 GPUs); add 1 node(s) "
        "with `resurge node add --gpus 2`"
    )
    assert cannot_hold(job(replicas=3, nproc=2), nodes(4, 2, 1)) is None


def test_with_a_node_not_reporting_nobody_says_no_node_could_hold_the_job() -> None:
    why = why_waiting(job(replicas=1, nproc=2), nodes(1), {}, silent=["n9"], local=True)
    assert not why.startswith(UNHOLDABLE), "n9 may come back with room for it"
    assert "n9 not reporting" in why


def test_the_reason_no_node_could_hold_a_job_is_not_repeated_as_it_is_said_again() -> None:
    record = new_record(job(replicas=1, nproc=2), None)
    why = why_waiting(record.spec, nodes(1), {})
    assert wait_reason(record, why)
    assert not wait_reason(record, why)
    assert record.message == why
    assert wait_reason(record, "waiting for capacity: n1 has 0 of 2 slot(s) free")
    assert record.message == "waiting for capacity: n1 has 0 of 2 slot(s) free"
