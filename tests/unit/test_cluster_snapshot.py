"""One snapshot of the cluster for every placement: a grow in flight and another job's
held spare are slots in use for the next decision, whoever makes it."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from resurge.cluster import NodeInfo, WorkerGroupSpec
from resurge.control.decisions.elastic_decision import plan
from resurge.control.decisions.recovery_policy import Verdict, apply_fault
from resurge.control.state.allocations import Claim
from resurge.control.state.records import JobRecord, Placement
from resurge.control.views.cluster_snapshot import build_snapshot, move_view
from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.local import job_factory
from resurge_scaler.shapes import shapes_from

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=1)


def running(
    name: str, nodes: list[str], *, priority: int = 0, spares: list[str] | None = None
) -> JobRecord:
    spec = job_factory.job(name, nproc=4, replicas={"min": 1, "max": 2}, preload=None)
    spec = spec.model_copy(update={"spec": spec.spec.model_copy(update={"priority": priority})})
    return JobRecord(
        name=name,
        spec=spec,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=i, node=n, address=n) for i, n in enumerate(nodes)],
        spare_nodes=spares or [],
        submitted=NOW - timedelta(hours=1),
    )


def group(job: str, replica: int, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=replica, node=node, nproc=4, command=["train"])


def nodes(*names: str) -> list[NodeInfo]:
    return [NodeInfo(name=name, slots=4, address=name) for name in names]


def test_a_grow_warming_up_is_in_use_for_the_next_decision() -> None:
    """Job a's grow onto n2 is in flight (its replica's agent warming up, up to
    scalingTimeoutSeconds; its record still says one replica). One tick later the
    decision must not grow job b onto n2 too."""
    a, b = running("a", ["n0"], priority=1), running("b", ["n1"])
    cluster_nodes = nodes("n0", "n1", "n2")
    first = build_snapshot(cluster_nodes, [a, b], [group("a", 0, "n0"), group("b", 0, "n1")])
    cluster, shapes = shapes_from([a, b], first.nodes, NOW.timestamp(), reserved=first.reserved())
    grows = {r.job: r.add for r in plan(cluster, shapes, NOW.timestamp()).resizes}
    assert grows == {"a": ("n2",)}, "the first decision grows the higher-priority job onto n2"

    claim = Claim(job="a", replica=1, node="n2", slots=4, holder="scaler-0", until=LATER)
    groups = [group("a", 0, "n0"), group("b", 0, "n1"), group("a", 1, "n2")]
    second = build_snapshot(cluster_nodes, [a, b], groups, [claim])
    assert second.used() == {"n0": 4, "n1": 4, "n2": 4}
    assert second.reserved() == {"n2": 4}
    assert second.claimed_jobs() == {"a"}
    cluster, shapes = shapes_from([a, b], second.nodes, NOW.timestamp(), reserved=second.reserved())
    shapes = [replace(s, busy=s.name in second.claimed_jobs()) for s in shapes]
    decided = plan(cluster, shapes, NOW.timestamp())
    assert [r for r in decided.resizes if "n2" in r.add] == [], decided.resizes


def xid_on(node: str) -> FaultDetected:
    return FaultDetected(
        source=Source(service="detector", instance="t"),
        job="a",
        generation=0,
        node=node,
        fault_id="xid-1",
        scope=FaultScope.NODE,
        reason="gpu_xid_79",
        suggested_level=RecoveryLevel.NODE,
        time=NOW,
    )


def test_an_xid_never_moves_a_replica_onto_the_spare_another_job_holds() -> None:
    """Job b holds n3 as its spare (no worker group there: it is held, not used). An
    XID on n0 under job a finds no other room: a is requeued, b's spare stays b's."""
    a = running("a", ["n0", "n1"])
    b = running("b", ["n2"], spares=["n3"])
    groups = [group("a", 0, "n0"), group("a", 1, "n1"), group("b", 0, "n2")]
    snapshot = build_snapshot(nodes("n0", "n1", "n2", "n3"), [a, b], groups)
    assert snapshot.used(exclude_job="a") == {"n2": 4, "n3": 4}
    decision = apply_fault(a, xid_on("n0"), now=NOW, cluster=move_view(snapshot, "a"))
    assert decision.verdict is not Verdict.IGNORE
    plan_ = a.pending_recovery
    assert plan_ is not None
    assert [m.to_node for m in plan_.moves] == [], "moved onto job b's spare n3"
    assert plan_.requeue


def test_its_own_spare_is_where_a_replica_moves_first() -> None:
    a = running("a", ["n0", "n1"], spares=["n3"])
    groups = [group("a", 0, "n0"), group("a", 1, "n1")]
    snapshot = build_snapshot(nodes("n0", "n1", "n2", "n3"), [a], groups)
    apply_fault(a, xid_on("n0"), now=NOW, cluster=move_view(snapshot, "a"))
    assert a.pending_recovery is not None
    assert [m.to_node for m in a.pending_recovery.moves] == ["n3"]


def test_one_replica_counts_once_however_many_sources_name_it() -> None:
    """A placement, its worker group and its claim are one use; a Pending or finished
    record's placements are none; a finished job's group still on a node is one."""
    a = running("a", ["n0"])
    done = running("done", ["n1"])
    done.phase = JobPhase.SUCCEEDED
    waiting = running("waiting", ["n1"])
    waiting.phase = JobPhase.PENDING
    claim = Claim(job="a", replica=0, node="n0", slots=4, holder="s", until=LATER)
    groups = [group("a", 0, "n0"), group("done", 0, "n1")]
    snapshot = build_snapshot(nodes("n0", "n1"), [a, done, waiting], groups, [claim])
    assert snapshot.used() == {"n0": 4, "n1": 4}
    assert snapshot.reserved() == {"n1": 4}, "the finished job's group is no record's"
    assert snapshot.free() == {"n0": 0, "n1": 0}
    assert snapshot.jobs_on("n1") == ["done"]
    spare = build_snapshot(nodes("n0", "n1"), [running("s", ["n0"], spares=["n1"])])
    assert spare.used() == {"n0": 4, "n1": 4}
    assert spare.jobs_on("n1") == [], "a spare held is slots in use, not a job running"


def test_other_pods_and_the_templates_nodes_shape_every_placement() -> None:
    """What other pods hold of a node is in use for every decision (and no job's), and
    a job's moves and grows go only to the nodes it may use (``unfit``: on Kubernetes,
    those its template keeps its pods off)."""
    held = [*nodes("n0", "n1", "n2"), NodeInfo(name="n3", slots=4, in_use_elsewhere=4)]
    a = running("a", ["n0", "n1"])
    unfit = {"a": {"n2": "nodeSelector pool=train (node has pool=serve)"}}
    groups = [group("a", 0, "n0"), group("a", 1, "n1")]
    snapshot = build_snapshot(held, [a], groups, unfit=unfit)
    assert snapshot.used(exclude_job="a") == {"n3": 4}
    assert snapshot.reserved() == {"n3": 4}
    assert snapshot.jobs_on("n3") == [], "other pods are no job of resurge's"
    assert [n.name for n in snapshot.nodes_for("a")] == ["n0", "n1", "n3"]
    assert [n.name for n in snapshot.nodes_for("b")] == ["n0", "n1", "n2", "n3"]
    # n3 is full and n2 refuses a's pods: the XID on n0 finds no node to move to.
    apply_fault(a, xid_on("n0"), now=NOW, cluster=move_view(snapshot, "a"))
    assert a.pending_recovery is not None
    assert [m.to_node for m in a.pending_recovery.moves] == []
    # Nor does a grow of an elastic job go there: b grows onto n0 or n2 where it may use
    # them, and not at all where it may use neither.
    b = running("b", ["n1"])

    def grows(unfit: dict[str, set[str]]) -> list[tuple[str, ...]]:
        now = NOW.timestamp()
        cluster, shapes = shapes_from([b], held, now, reserved={"n3": 4}, unfit=unfit)
        return [r.add for r in plan(cluster, shapes, now).resizes if r.add]

    assert grows({}) != []
    assert grows({"b": {"n0", "n2"}}) == []
