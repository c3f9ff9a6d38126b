"""The GPU warning-sign detector: its windows and thresholds, and one alert per sign and
warning (per job on the node), never one per sample."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from resurge.control.decisions.node_attribution import attribute
from resurge.control.state.records import JobRecord, Placement
from resurge.detection import DetectorContext
from resurge.events import FaultDetected, FaultScope, GpuError, GpuReading, GpuSample, Source
from resurge.local import job_factory
from resurge_detector.gpu_warnings import GpuWarningDetector, GpuWarningSettings

SOURCE = Source(service="detector", instance="here:1")
MONITOR = Source(service="node-monitor", instance="n1:7")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(name: str, nodes: list[str]) -> JobRecord:
    job = job_factory.job(name, ["python", "train.py"], nproc=1, preload=None)
    return JobRecord(
        name=name,
        spec=job,
        generation=2,
        placements=[Placement(replica=i, node=node) for i, node in enumerate(nodes)],
    )


JOBS = {r.name: r for r in (record("a", ["n1", "n2"]), record("b", ["n1"]), record("c", ["n3"]))}


def detector(**settings: object) -> GpuWarningDetector:
    defaults: dict[str, object] = {
        "gpu_warning_ecc_rise": 100,
        "gpu_warning_window_seconds": 60.0,
        "gpu_warning_throttle_seconds": 30.0,
        "gpu_warning_quiet_seconds": 120.0,
    }
    return GpuWarningDetector(GpuWarningSettings.model_validate(defaults | settings))


def sample(gpu: int = 0, node: str = "n1", **reading: object) -> GpuSample:
    return GpuSample(
        source=MONITOR,
        node=node,
        gpus=[GpuReading.model_validate({"index": gpu, "uuid": f"GPU-{gpu}", **reading})],
    )


def at(seconds: float) -> DetectorContext:
    return DetectorContext(now=T0 + timedelta(seconds=seconds), source=SOURCE, jobs=JOBS)


def run(
    d: GpuWarningDetector, steps: Sequence[tuple[float, GpuSample | GpuError]]
) -> list[list[FaultDetected]]:
    out = []
    for seconds, event in steps:
        found = d.observe(event, at(seconds))
        assert all(isinstance(f, FaultDetected) for f in found)
        out.append([f for f in found if isinstance(f, FaultDetected)])
    return out


def test_corrected_ecc_rising_past_the_threshold_within_the_window_warns_once_per_job() -> None:
    d = detector()
    said = run(d, [(0, sample(ecc_corrected=10)), (10, sample(ecc_corrected=60)),
                   (20, sample(ecc_corrected=110)), (30, sample(ecc_corrected=400))])  # fmt: skip
    assert [len(s) for s in said] == [0, 0, 2, 0]  # jobs a and b are on n1; c is not
    a, b = sorted(said[2], key=lambda f: f.job or "")
    assert (a.job, b.job) == ("a", "b")
    assert a.reason == "gpu_warning" and a.scope is FaultScope.NODE and a.alert_only
    assert (a.node, a.replica, a.generation) == ("n1", 0, 2)
    ev = a.evidence
    assert (ev["sign"], ev["gpu"], ev["ecc_corrected"], ev["rise"]) == (
        "corrected_ecc_rising", 0, 110, 100,
    )  # fmt: skip
    assert ev["predictive"] is True and ev["over_seconds"] == 20.0
    assert a.fault_id != b.fault_id and a.id != b.id
    counted = attribute(a)
    assert counted is not None and (counted.rule, counted.weight) == ("ecc_warning_sign", 0.5)


def test_a_slow_rise_that_spreads_past_the_window_is_no_sign() -> None:
    d = detector()
    steps = [(t * 30.0, sample(ecc_corrected=40 * t)) for t in range(8)]  # 80 a minute
    assert all(not s for s in run(d, steps))


def test_a_count_that_falls_starts_over() -> None:
    d = detector()
    said = run(d, [(0, sample(ecc_corrected=500)), (5, sample(ecc_corrected=3)),
                   (10, sample(ecc_corrected=90))])  # fmt: skip
    assert not any(said)  # 500 -> 3 is a reset, not a fall of 497; 3 -> 90 is under 100


def test_a_warning_ends_after_its_quiet_time_and_may_warn_again() -> None:
    d = detector()
    rising = [(t * 10.0, sample(ecc_corrected=100 * t)) for t in range(4)]
    flat = [(40.0 + t * 20.0, sample(ecc_corrected=300)) for t in range(1, 9)]  # to 200 s
    again = [(210.0, sample(ecc_corrected=300)), (220.0, sample(ecc_corrected=450))]
    said = run(d, rising + flat + again)
    counts = [len(s) for s in said]
    assert counts[:4] == [0, 2, 0, 0] and not any(counts[4:-1]) and counts[-1] == 2
    first, second = said[1][0], said[-1][0]
    assert first.evidence["since"] != second.evidence["since"]


def test_retired_pages_growing_is_a_sign_on_that_gpu() -> None:
    d = detector()
    said = run(d, [(0, sample(gpu=3, retired_pages=2)), (3, sample(gpu=3, retired_pages=2)),
                   (6, sample(gpu=3, retired_pages=3))])  # fmt: skip
    assert [len(s) for s in said] == [0, 0, 2]
    assert said[2][0].evidence["sign"] == "retired_pages_growing"
    assert said[2][0].evidence["gpu"] == 3


@pytest.mark.parametrize(
    ("reasons", "sign"),
    [(["sw_thermal"], "thermal_throttling"), (["hw_power_brake"], "power_throttling")],
)
def test_throttling_warns_once_it_lasted(reasons: list[str], sign: str) -> None:
    d = detector()
    steps = [(t * 10.0, sample(throttle_reasons=reasons)) for t in range(5)]
    said = run(d, steps)
    assert [len(s) for s in said] == [0, 0, 0, 2, 0]  # at 30 s, the threshold
    fault = said[3][0]
    assert fault.evidence["sign"] == sign and fault.evidence["predictive"] is False
    counted = attribute(fault)
    assert counted is not None and counted.rule == "thermal_throttling"


def test_throttling_broken_by_a_clear_sample_starts_over_and_a_power_cap_is_no_sign() -> None:
    d = detector()
    hot = ["hw_thermal"]
    steps = [(0, sample(throttle_reasons=hot)), (20, sample(throttle_reasons=[])),
             (25, sample(throttle_reasons=hot)), (50, sample(throttle_reasons=hot)),
             (60, sample(throttle_reasons=["sw_power_cap"])),
             (100, sample(throttle_reasons=["sw_power_cap"]))]  # fmt: skip
    assert [len(s) for s in run(d, steps)] == [0, 0, 0, 0, 0, 0]


def test_an_xid_known_to_precede_failures_warns_and_others_do_not() -> None:
    d = detector()

    def xid(code: int) -> GpuError:
        return GpuError(source=MONITOR, node="n1", gpu=1, error="xid", xid=code, message="x")

    said = run(d, [(0, xid(13)), (1, xid(92)), (2, xid(92)), (3, xid(63))])
    assert [len(s) for s in said] == [0, 2, 0, 0]  # one xid_precursor warning open
    assert said[1][0].evidence["sign"] == "xid_precursor" and said[1][0].evidence["xid"] == 92


def test_no_job_on_the_node_no_fault() -> None:
    d = detector()
    said = run(
        d, [(0, sample(node="n9", retired_pages=0)), (1, sample(node="n9", retired_pages=5))]
    )
    assert not any(said)


def test_the_defaults_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = GpuWarningSettings()
    assert settings.gpu_warning_ecc_rise == 100 and settings.precursor_xids() == {63, 92}
    monkeypatch.setenv("RESURGE_GPU_WARNING_ECC_RISE", "7")
    monkeypatch.setenv("RESURGE_GPU_WARNING_XIDS", "92")
    d = GpuWarningDetector()
    assert d.settings.gpu_warning_ecc_rise == 7 and d.xids == {92}


def test_docs_nodes_lists_each_threshold_with_its_default() -> None:
    from pathlib import Path

    from resurge.runtime.settings import Settings

    text = (Path(__file__).parents[2] / "docs" / "nodes.md").read_text()
    fields = {**GpuWarningSettings.model_fields}
    for name, info in fields.items():
        if not name.startswith("gpu_warning_"):
            continue
        default = info.default
        shown = default if isinstance(default, str) else f"{default:g}"
        assert f"| `RESURGE_{name.upper()}` | `{shown}` |" in text, name
    assert Settings.model_fields["node_proactive_moves"].default is True
    assert "| `RESURGE_NODE_PROACTIVE_MOVES` | `true` |" in text
