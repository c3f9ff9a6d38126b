"""A decided resize written into a job record: the next generation and the plan the
restarter carries out; and elastic jobs admitted past their ``min``."""

from datetime import UTC, datetime

from resurge.cluster import NodeInfo
from resurge.control.decisions.admission import place
from resurge.control.decisions.elastic_decision import Kind, Resize
from resurge.control.decisions.recovery_policy import Verdict, apply_fault
from resurge.control.state.records import JobRecord, Placement, status_view
from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.local import job_factory
from resurge_scaler.resize_plan import apply_resize, removed_nodes

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
ADDRESSES = {f"n{i}": f"10.0.0.{i}" for i in range(6)}


def running(
    replicas: int = 2, *, in_process: bool = False, discrete: list[int] | None = None
) -> JobRecord:
    sizes: dict[str, object] = {"min": 1, "max": 4}
    if discrete:
        sizes["discrete"] = discrete
    spec = job_factory.job("e", nproc=2, replicas=sizes, preload=None)
    return JobRecord(
        name="e",
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=3,
        placements=[
            Placement(replica=i, node=f"n{i}", address=f"10.0.0.{i}") for i in range(replicas)
        ],
        in_process_capable=in_process,
    )


def grow(to: int, nodes: tuple[str, ...], before: int = 2) -> Resize:
    return Resize(job="e", kind=Kind.GROW, from_replicas=before, to_replicas=to,
                  why="free slots", add=nodes)  # fmt: skip


def test_a_grow_of_restartable_workers_is_the_next_generation_in_process() -> None:
    record = running(in_process=True)
    assert apply_resize(record, grow(4, ("n2", "n3")), generation=3, addresses=ADDRESSES, now=NOW)
    assert record.generation == 4
    assert record.phase is JobPhase.RESIZING
    assert [(p.replica, p.node, p.address) for p in record.placements] == [
        (0, "n0", "10.0.0.0"), (1, "n1", "10.0.0.1"), (2, "n2", "10.0.0.2"), (3, "n3", "10.0.0.3"),
    ]  # fmt: skip
    plan = record.pending_recovery
    assert plan is not None
    assert plan.resize == "grow" and plan.level is RecoveryLevel.IN_PROCESS
    assert plan.stop_placements == [], "staying workers re-enter in-process: nobody is stopped"
    assert plan.recreate == [2, 3]
    assert (plan.from_generation, plan.to_generation) == (3, 4)
    assert record.incarnations == {2: 1, 3: 1}
    assert record.restarts == {} and record.history == [], "a resize is not a restart"
    view = status_view(record)
    assert view["phase"] == "Resizing"
    assert view["replicas"] == {"current": 4, "target": 4}
    assert view["lastResize"] == {
        "resize": "grow", "from": 2, "to": 4, "why": "free slots",
        "time": NOW.isoformat(), "seconds": None,
    }  # fmt: skip


def test_a_shrink_stops_only_the_replicas_that_go_and_keeps_the_others_indices() -> None:
    record = running(3, in_process=True)
    shrink = Resize(job="e", kind=Kind.SHRINK, from_replicas=3, to_replicas=2, why="room",
                    remove=(1,), nodes=("n0", "n2"))  # fmt: skip
    assert removed_nodes(record, shrink) == ["n1"]
    assert apply_resize(record, shrink, generation=3, addresses=ADDRESSES, now=NOW)
    assert [(p.replica, p.node) for p in record.placements] == [(0, "n0"), (2, "n2")]
    assert record.incarnations == {1: 0}
    plan = record.pending_recovery
    assert plan is not None
    assert [(p.replica, p.node) for p in plan.stop_placements] == [(1, "n1")]
    assert plan.recreate == []


def test_workers_that_cannot_re_enter_are_all_restarted_as_processes() -> None:
    record = running(2, in_process=False)
    assert apply_resize(record, grow(3, ("n2",)), generation=3, addresses=ADDRESSES, now=NOW)
    plan = record.pending_recovery
    assert plan is not None and plan.level is RecoveryLevel.PROCESS
    assert [p.replica for p in plan.stop_placements] == [0, 1]


def test_an_added_replica_takes_an_index_the_job_never_used() -> None:
    record = running(3)
    shrink = Resize(job="e", kind=Kind.SHRINK, from_replicas=3, to_replicas=2, why="room",
                    remove=(1,), nodes=("n0", "n2"))  # fmt: skip
    assert apply_resize(record, shrink, generation=3, addresses=ADDRESSES, now=NOW)
    assert record.incarnations == {1: 0}, "replica 1's index is used"
    record.phase, record.pending_recovery = JobPhase.RUNNING, None
    assert apply_resize(record, grow(3, ("n4",)), generation=4, addresses=ADDRESSES, now=NOW)
    assert [(p.replica, p.node) for p in record.placements] == [(0, "n0"), (2, "n2"), (3, "n4")]
    assert record.incarnations == {1: 0, 3: 1}


def test_a_suspension_requeues_the_job_with_its_checkpoint() -> None:
    record = running(2)
    suspend = Resize(job="e", kind=Kind.SUSPEND, from_replicas=2, to_replicas=0, why="priority",
                     remove=(0, 1))  # fmt: skip
    assert apply_resize(record, suspend, generation=3, addresses=ADDRESSES, now=NOW)
    assert record.phase is JobPhase.PENDING and record.placements == []
    plan = record.pending_recovery
    assert plan is not None and plan.requeue and plan.resize == "suspend"
    assert [p.replica for p in plan.stop_placements] == [0, 1]


def test_a_record_that_moved_on_since_the_decision_is_left_alone() -> None:
    record = running(2)
    assert not apply_resize(record, grow(3, ("n2",)), generation=2, addresses=ADDRESSES, now=NOW)
    assert not apply_resize(record, grow(4, ("n2", "n3"), before=3), generation=3,
                            addresses=ADDRESSES, now=NOW)  # fmt: skip
    record.phase = JobPhase.RECOVERING
    assert not apply_resize(record, grow(3, ("n2",)), generation=3, addresses=ADDRESSES, now=NOW)
    admit = Resize(job="e", kind=Kind.ADMIT, from_replicas=2, to_replicas=2, why="")
    record.phase = JobPhase.RUNNING
    assert not apply_resize(record, admit, generation=3, addresses=ADDRESSES, now=NOW)
    assert record.generation == 3 and record.pending_recovery is None


def nodes(*slots: int) -> list[NodeInfo]:
    return [NodeInfo(name=f"n{i}", slots=s, address=f"10.0.0.{i}") for i, s in enumerate(slots)]


def test_an_elastic_job_starts_with_as_many_replicas_as_fit_up_to_max() -> None:
    spec = job_factory.job("e", nproc=2, replicas={"min": 1, "max": 4}, preload=None)
    fit = place(spec, nodes(2, 2, 2), {})
    assert fit is not None and len(fit[0]) == 3
    assert [p.replica for p in fit[0]] == [0, 1, 2]
    fit = place(spec, nodes(2, 2, 2, 2, 2, 2), {})
    assert fit is not None and len(fit[0]) == 4


def test_an_elastic_job_starts_at_an_allowed_size_only() -> None:
    spec = job_factory.job("e", nproc=2, replicas={"min": 2, "max": 8, "discrete": [2, 4, 8]},
                           preload=None)  # fmt: skip
    used: dict[str, int] = {}
    fit = place(spec, nodes(2, 2, 2, 2, 2, 2, 2), used)
    assert fit is not None and len(fit[0]) == 4
    assert sum(used.values()) == 8


def test_extra_replicas_leave_room_for_the_spares() -> None:
    spec = job_factory.job("e", nproc=2, replicas={"min": 1, "max": 4}, recovery={"spares": 1},
                           preload=None)  # fmt: skip
    fit = place(spec, nodes(2, 2, 2), {})
    assert fit is not None
    placements, spares = fit
    assert len(placements) == 2 and len(spares) == 1
    assert not {p.node for p in placements} & set(spares)


def crash(fault_id: str, generation: int) -> FaultDetected:
    return FaultDetected(
        source=Source(service="detector", instance="t"), job="e", generation=generation,
        rank=1, replica=0, node="n0", fault_id=fault_id, scope=FaultScope.PROCESS,
        reason="process_crash", suggested_level=RecoveryLevel.PROCESS, time=NOW,
    )  # fmt: skip


def test_a_fault_during_a_resize_is_handled_once_as_a_restart_of_the_new_generation() -> None:
    record = running(2, in_process=True)
    assert apply_resize(record, grow(4, ("n2", "n3")), generation=3, addresses=ADDRESSES, now=NOW)
    # the replicas of the old generation failing as it is torn down: not a fault to act on
    stale = apply_fault(record, crash("f-old", 3), now=NOW)
    assert stale.verdict is Verdict.IGNORE
    assert record.generation == 4 and record.pending_recovery is not None
    assert record.pending_recovery.resize == "grow"
    # a fault of the new generation: one restart, which replaces the resize's plan
    first = apply_fault(record, crash("f-new", 4), now=NOW)
    assert first.verdict is Verdict.RESTART
    assert record.generation == 5
    plan = record.pending_recovery
    assert plan is not None and plan.resize == "" and plan.from_generation == 4
    assert len(record.placements) == 4, "the restart keeps the new size"
    again = apply_fault(record, crash("f-new", 4), now=NOW)
    assert again.verdict is Verdict.IGNORE and record.generation == 5
