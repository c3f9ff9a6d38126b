"""The GPU health detector: a GPU error on a node becomes each running job's fault there."""

from datetime import UTC, datetime

from resurge.contract.xid import TABLE_VERSION
from resurge.control.state.records import JobRecord, Placement
from resurge.detection import DetectorContext
from resurge.events import (
    FaultDetected,
    FaultScope,
    GpuError,
    JobPhase,
    RecoveryLevel,
    Severity,
    Source,
)
from resurge.local import job_factory
from resurge_detector.gpu_health import GpuHealthDetector

SOURCE = Source(service="detector", instance="here:1")
MONITOR = Source(service="node-monitor", instance="n1:7")


def record(
    name: str,
    nodes: list[str],
    overrides: dict[int, str] | None = None,
    phase: JobPhase = JobPhase.RUNNING,
) -> JobRecord:
    monitoring = {"gpu": {"xidOverrides": overrides}} if overrides else None
    job = job_factory.job(
        name, ["python", "train.py"], nproc=2, monitoring=monitoring, preload=None
    )
    return JobRecord(
        name=name,
        spec=job,
        phase=phase,
        generation=3,
        placements=[Placement(replica=i, node=node) for i, node in enumerate(nodes)],
    )


def context(*records: JobRecord) -> DetectorContext:
    return DetectorContext(now=datetime.now(UTC), source=SOURCE, jobs={r.name: r for r in records})


def xid_error(code: int, gpu: int = 1, node: str = "n1") -> GpuError:
    return GpuError(
        source=MONITOR,
        node=node,
        gpu=gpu,
        uuid=f"GPU-{gpu}",
        error="xid",
        xid=code,
        message=f"XID {code}",
    )


def faults(event: GpuError, ctx: DetectorContext) -> list[FaultDetected]:
    out = GpuHealthDetector().observe(event, ctx)
    assert all(isinstance(f, FaultDetected) for f in out)
    return [f for f in out if isinstance(f, FaultDetected)]


def test_registered_shape() -> None:
    detector = GpuHealthDetector()
    assert detector.name == "gpu_health" and detector.kinds == {"gpu_error"}
    assert list(detector.tick(context())) == []


def test_application_xid_is_a_process_fault_of_each_job_on_the_node() -> None:
    ctx = context(record("a", ["n0", "n1"]), record("b", ["n1"]), record("c", ["n2"]))
    event = xid_error(13)
    found = faults(event, ctx)
    assert len(found) == 2 and {f.job for f in found} == {"a", "b"}
    a = next(f for f in found if f.job == "a")
    assert a.scope is FaultScope.PROCESS and a.suggested_level is RecoveryLevel.PROCESS
    assert a.severity is Severity.ERROR and not a.alert_only
    assert a.reason == "gpu_xid" and a.node == "n1" and a.replica == 1 and a.generation == 3
    assert a.fault_id == f"gpu:n1:1:13:{event.id}"
    assert a.evidence == {
        "node": "n1",
        "gpu": 1,
        "uuid": "GPU-1",
        "error": "xid",
        "xid": 13,
        "action": "restart_process",
        "overridden": False,
        "table_version": TABLE_VERSION,
        "message": "XID 13",
        "replicas": "1",
    }


def test_fatal_xids_are_node_faults() -> None:
    ctx = context(record("a", ["n1"]))
    for code, action in ((79, "replace_node"), (48, "reset_gpu"), (95, "reset_gpu")):
        [fault] = faults(xid_error(code), ctx)
        assert fault.scope is FaultScope.NODE
        assert fault.suggested_level is RecoveryLevel.NODE
        assert fault.severity is Severity.FATAL
        assert fault.evidence["action"] == action and fault.evidence["xid"] == code


def test_ignored_xids_and_finished_jobs_give_nothing() -> None:
    ctx = context(record("a", ["n1"]), record("done", ["n1"], phase=JobPhase.SUCCEEDED))
    assert faults(xid_error(45), ctx) == []  # ignore in the table
    assert [f.job for f in faults(xid_error(79), ctx)] == ["a"]
    no_node = GpuError(source=MONITOR, gpu=0, error="xid", xid=79)
    assert faults(no_node, ctx) == []


def test_job_overrides_decide_first() -> None:
    quiet = record("quiet", ["n1"], overrides={79: "ignore", 45: "restart_process"})
    strict = record("strict", ["n1"], overrides={13: "replace_node"})
    ctx = context(quiet, strict)
    assert [f.job for f in faults(xid_error(79), ctx)] == ["strict"]
    [restart] = faults(xid_error(45), ctx)
    assert restart.job == "quiet" and restart.scope is FaultScope.PROCESS
    assert restart.evidence["overridden"] is True
    by_job = {f.job: f for f in faults(xid_error(13), ctx)}
    assert by_job["strict"].scope is FaultScope.NODE
    assert by_job["quiet"].scope is FaultScope.PROCESS  # no override for 13: the table


def test_fell_off_the_bus_is_a_node_fault_whatever_the_overrides() -> None:
    ctx = context(record("a", ["n1"], overrides={79: "ignore"}))
    event = GpuError(
        source=MONITOR, node="n1", gpu=0, uuid="GPU-0", error="fell_off_bus", message="lost"
    )
    [fault] = faults(event, ctx)
    assert fault.reason == "gpu_fell_off_bus" and fault.scope is FaultScope.NODE
    assert fault.suggested_level is RecoveryLevel.NODE and fault.severity is Severity.FATAL
    assert fault.fault_id == f"gpu:n1:0:fell_off_bus:{event.id}"
    assert fault.evidence["action"] == "replace_node" and fault.evidence["message"] == "lost"


def test_ecc_rise_is_only_an_alert() -> None:
    ctx = context(record("a", ["n1"]))
    event = GpuError(source=MONITOR, node="n1", gpu=0, error="ecc", message="rose from 0 to 1")
    [fault] = faults(event, ctx)
    assert fault.alert_only and fault.severity is Severity.WARNING
    assert fault.reason == "gpu_ecc" and fault.suggested_level is None


def test_ids_are_stable_per_input_and_distinct_per_job() -> None:
    ctx = context(record("a", ["n1"]), record("b", ["n1"]))
    event = xid_error(79)
    first, second = faults(event, ctx), faults(event, ctx)
    assert [f.id for f in first] == [f.id for f in second]  # a redelivery de-duplicates
    assert len({f.id for f in first}) == 2  # two jobs: two messages JetStream keeps
    assert {f.fault_id for f in first} == {f"gpu:n1:1:79:{event.id}"}
