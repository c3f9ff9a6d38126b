"""The scale curves' numbers (bench/scale_fit.py) and their load's messages
(bench/scale_load.py): percentiles as the other benches take them, the power law an
unreached size is extrapolated by, marked as such, the CSV read back as written, and
every message of the telemetry load a valid event of its kind (a template the event
models no longer take would load the detector with dead letters, not telemetry)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from resurge.contract.subjects import Subjects
from resurge.events import GpuSample, NodeReport, Progress, decode_event

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


fit = _load("scale_fit")
load = _load("scale_load")
agents = _load("scale_agents")


def point(replicas: int, p50: float, p99: float, servers: int = 1, curve: str = "fanout") -> object:
    return fit.Point(curve, servers, replicas, 5, p50, p99, 0.001, 0.002)


def test_p99_of_fewer_than_a_hundred_values_is_their_maximum() -> None:
    assert fit.percentile([3.0, 1.0, 2.0], 0.99) == 3.0
    assert fit.percentile(list(range(1, 201)), 0.99) == 198
    assert fit.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0  # nearest rank: the lower middle


def test_percentile_refuses_no_values_and_a_quantile_outside_0_1() -> None:
    with pytest.raises(ValueError, match="no values"):
        fit.percentile([], 0.5)
    with pytest.raises(ValueError, match="not in"):
        fit.percentile([1.0], 1.5)


def test_a_point_takes_the_median_as_p50_and_says_its_ratios_to_the_baselines() -> None:
    measured = fit.point_of("fanout", 3, 256, [0.1, 0.4, 0.2, 0.3], hop=0.002, trip=0.0)
    assert (measured.p50, measured.p99, measured.samples) == (0.25, 0.4, 4)
    row = measured.row()
    assert row["p50_x_hop"] == "125.0" and row["p99_x_hop"] == "200.0"
    assert row["p50_x_trip"] == "" and row["trip_ms"] == ""  # no baseline: no ratio
    assert row["extrapolated"] == "no"


def test_power_law_through_two_points() -> None:
    a, b = fit.power_law((256, 1.0), (1024, 16.0))
    assert b == pytest.approx(2.0)
    assert a * 4096**b == pytest.approx(256.0)
    with pytest.raises(ValueError):
        fit.power_law((256, 1.0), (256, 2.0))
    with pytest.raises(ValueError):
        fit.power_law((256, 0.0), (1024, 2.0))


def test_unreached_sizes_are_extrapolated_from_the_two_largest_measured_and_marked() -> None:
    measured = [point(256, 0.5, 0.5), point(1024, 1.0, 2.0), point(4096, 4.0, 8.0)]
    every = fit.extrapolate(measured, [256, 1024, 4096, 16384])
    assert [p.replicas for p in every] == [256, 1024, 4096, 16384]
    assert [p.extrapolated for p in every] == [False, False, False, True]
    guessed = every[-1]
    # The top two measured sizes grow as N^1 (not the flatter slope from 256): x4 again.
    assert guessed.p50 == pytest.approx(16.0)
    assert guessed.p99 == pytest.approx(32.0)
    assert guessed.samples == 0
    assert "power law through 1024 and 4096" in guessed.note
    assert guessed.row()["extrapolated"] == "yes"


def test_a_curve_measured_at_one_size_only_is_not_extrapolated() -> None:
    measured = [point(256, 0.5, 0.6, servers=3), point(256, 1.0, 1.0), point(1024, 2.0, 2.0)]
    every = fit.extrapolate(measured, [256, 1024, 4096])
    assert {(p.nats_servers, p.replicas) for p in every if p.extrapolated} == {(1, 4096)}
    assert [p for p in every if p.nats_servers == 3] == [measured[0]]


def test_the_csv_reads_back_as_written_under_its_header() -> None:
    every = fit.extrapolate([point(256, 0.125, 0.25), point(1024, 0.5, 1.0)], [4096])
    text = fit.csv_text(every, ["made by: bench/scale_curves.py --quick", "machine: 2 cores"])
    lines = text.splitlines()
    assert lines[:2] == ["# made by: bench/scale_curves.py --quick", "# machine: 2 cores"]
    assert lines[2] == ",".join(fit.COLUMNS)
    back = fit.parse_csv(text)
    assert [(p.replicas, p.extrapolated) for p in back] == [
        (256, False),
        (1024, False),
        (4096, True),
    ]
    assert back[2].p50 == pytest.approx(every[2].p50, rel=1e-3)
    assert back[0].hop == pytest.approx(0.001) and back[0].trip == pytest.approx(0.002)
    assert back[2].note == every[2].note


def test_every_message_of_the_load_is_a_valid_event_of_its_kind() -> None:
    subjects = Subjects("scale")
    second = load.plans(subjects, "det", 20, 8)
    ranks = [rank for rank, _, _ in second if rank >= 0]
    assert ranks == list(range(20))  # one progress per rank per second
    now = datetime(2026, 1, 1, tzinfo=UTC)
    kinds: dict[str, int] = {}
    for rank, subject, body in second:
        event = decode_event(load.fill(body, f"id{len(kinds)}{rank}", now, b"7", 12))
        kinds[event.kind] = kinds.get(event.kind, 0) + 1
        assert subject == subjects.raw(event.job, event.kind, event.node)
        assert event.time == now
        if isinstance(event, Progress):
            assert (event.rank, event.generation, event.step) == (rank, 7, 12)
            assert event.node == agents.node_of(rank, 8)
        else:
            assert isinstance(event, GpuSample | NodeReport)
    assert kinds == {"progress": 20, "gpu_sample": 3, "node_report": 3}  # 3 nodes of 8


def test_a_grow_adds_its_replicas_on_the_free_node() -> None:
    assert [agents.node_of(r, 8) for r in (0, 7, 8, 255)] == [
        "node-0",
        "node-0",
        "node-1",
        "node-31",
    ]
    assert [agents.node_of(r, 8, spare_from=248) for r in (247, 248, 256, 300)] == [
        "node-30",
        "node-31",
        "node-31",
        "node-31",
    ]


def test_the_extrapolated_values_follow_the_stated_exponent() -> None:
    every = fit.extrapolate([point(256, 1.0, 1.0), point(1024, 2.0, 2.0)], [16384])
    [guessed] = [p for p in every if p.extrapolated]
    exponent = float(guessed.note.split("N^")[1].split(",")[0])
    assert exponent == pytest.approx(0.5)
    assert guessed.p50 == pytest.approx(2.0 * math.sqrt(16384 / 1024))
    assert json.dumps(guessed.row())  # a row is plain strings


def test_no_size_at_or_past_a_failed_measurement_is_extrapolated() -> None:
    measured = [point(256, 1.0, 1.0), point(1024, 2.0, 2.0), point(256, 1.0, 1.0, servers=3)]
    measured.append(point(1024, 2.0, 2.0, servers=3))
    every = fit.extrapolate(measured, [4096, 16384], failed={("fanout", 1): 4096})
    guessed = {(p.nats_servers, p.replicas) for p in every if p.extrapolated}
    assert guessed == {(3, 4096), (3, 16384)}  # NATS 1 broke at 4,096: no trend drawn there


def test_an_extrapolated_p99_is_never_below_its_p50() -> None:
    # p99 flatter than p50 between the two sizes: their power laws cross further out.
    every = fit.extrapolate([point(256, 0.1, 0.3), point(1024, 0.4, 0.6)], [16384])
    [guessed] = [p for p in every if p.extrapolated]
    assert guessed.p50 == pytest.approx(6.4)
    assert guessed.p99 == guessed.p50


def test_the_curves_points_are_recorded_by_name_with_their_csv_s_provenance(
    tmp_path: Path,
) -> None:
    scale_record = _load("scale_record")
    points = [
        fit.Point("fanout", 1, 256, 5, 0.1141, 0.2, 0.0004, 0.0008),
        fit.Point("fanout", 1, 1024, 0, 0.9, 1.2, 0.0, 0.0, extrapolated=True, note="law"),
    ]
    text = fit.csv_text(points, ["made by: bench/scale_curves.py --quick", "on 2026-12-06; load 3"])
    assert scale_record.figures_of(text) == {
        "fanout_nats1_256_p50_ms": (114.1, "ms"),
        "fanout_nats1_256_p99_ms": (200.0, "ms"),
        "fanout_nats1_1024_p50_ms_extrapolated": (900.0, "ms"),
        "fanout_nats1_1024_p99_ms_extrapolated": (1200.0, "ms"),
    }
    assert scale_record.header(text, "made by") == "bench/scale_curves.py --quick"
    note = (
        "medians from the decision (s): warm-up 0.01, last checkpoint sent 0.22, "
        "ScaleDecided 0.25; round 1: waiting"
    )
    assert scale_record.stages(note) == {
        "warm_up": 0.01,
        "last_checkpoint_sent": 0.22,
        "scaledecided": 0.25,
    }
    (tmp_path / "fanout.csv").write_text(text)
    results = tmp_path / "results"
    scale_record.main(["--from", str(tmp_path), "--results", str(results)])
    recorded = json.loads((results / "scale_curves.json").read_text())["figures"]
    assert recorded["fanout_nats1_256_p50_ms"]["command"] == "bench/scale_curves.py --quick"
