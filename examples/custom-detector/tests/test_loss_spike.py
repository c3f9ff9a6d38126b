"""LossSpikeDetector as pure logic: progress events in, faults out, no bus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from resurge_loss_spike import FACTOR_ENV, WARMUP_ENV, WINDOW_ENV, LossSpikeDetector
from resurge_loss_spike.detector import ALERT_ONLY_ENV, FORGET_AFTER, METRIC_ENV, PRUNE_EVERY

from resurge.detection import Detector, DetectorContext
from resurge.events import FaultDetected, FaultScope, Progress, RecoveryLevel, Severity, Source

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SOURCE = Source(service="detector", instance="test:1")


def ctx(seconds: float = 0) -> DetectorContext:
    return DetectorContext(now=T0 + timedelta(seconds=seconds), source=SOURCE)


def progress(
    step: int,
    loss: float | None,
    *,
    rank: int = 0,
    generation: int = 0,
    job: str = "train",
    metric: str = "loss",
) -> Progress:
    return Progress(
        id=f"p-{job}-g{generation}-r{rank}-s{step}",
        source=Source(service="node-agent", instance="node-0:7"),
        job=job,
        replica=0,
        node="node-0",
        rank=rank,
        generation=generation,
        local_rank=rank,
        step=step,
        metrics={} if loss is None else {metric: loss},
    )


def feed(
    detector: LossSpikeDetector, losses: list[float], *, rank: int = 0, generation: int = 0
) -> list[FaultDetected]:
    out = []
    for step, loss in enumerate(losses, start=1):
        event = progress(step, loss, rank=rank, generation=generation)
        out.extend(detector.observe(event, ctx(step)))
    return out


def test_is_a_detector_made_with_no_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (FACTOR_ENV, WARMUP_ENV, WINDOW_ENV, METRIC_ENV, ALERT_ONLY_ENV):
        monkeypatch.delenv(name, raising=False)
    detector = LossSpikeDetector()
    assert isinstance(detector, Detector)
    assert detector.name == "loss_spike" and detector.kinds == {"progress"}
    assert (detector.factor, detector.warmup, detector.window) == (10.0, 5, 20)
    assert detector.metric == "loss" and detector.alert_only is False


def test_a_spike_after_warmup_is_one_process_fault_with_evidence() -> None:
    detector = LossSpikeDetector({})
    [fault] = feed(detector, [1.0] * 5 + [1000.0])
    assert fault.reason == "loss_spike"
    assert fault.scope is FaultScope.PROCESS and fault.severity is Severity.ERROR
    assert fault.suggested_level is RecoveryLevel.PROCESS and not fault.alert_only
    assert (fault.job, fault.replica, fault.node, fault.rank, fault.generation) == (
        "train", 0, "node-0", 0, 0
    )  # fmt: skip
    assert fault.fault_id == "loss_spike:train:g0:r0:s6"
    assert fault.id == "fault-p-train-g0-r0-s6"
    assert fault.evidence["loss"] == 1000.0 and fault.evidence["mean"] == 1.0
    assert fault.evidence["factor"] == 10.0 and fault.evidence["window"] == 5
    assert "1000" in fault.message and "10x" in fault.message
    assert fault.source == SOURCE


def test_nothing_is_judged_during_warmup() -> None:
    assert feed(LossSpikeDetector({}), [1.0, 1.0, 1.0, 1.0, 1000.0]) == []


def test_growth_below_the_factor_is_no_spike() -> None:
    assert feed(LossSpikeDetector({}), [1.0] * 5 + [9.9, 5.0, 9.0]) == []


def test_a_spike_that_lasts_is_reported_once_and_a_later_one_again() -> None:
    detector = LossSpikeDetector({})
    faults = feed(detector, [1.0] * 5 + [500.0, 800.0, 900.0, 1.0, 1.0, 700.0])
    assert [f.fault_id for f in faults] == [
        "loss_spike:train:g0:r0:s6",
        "loss_spike:train:g0:r0:s11",
    ]
    # the spike's losses stayed out of the window: the second is judged against 1.0
    assert faults[1].evidence["mean"] == 1.0


def test_a_redelivered_report_changes_nothing() -> None:
    detector = LossSpikeDetector({})
    feed(detector, [1.0] * 5)
    spike = progress(6, 1000.0)
    assert len(detector.observe(spike, ctx(6))) == 1
    assert detector.observe(spike, ctx(7)) == []
    assert detector.observe(progress(3, 5000.0), ctx(8)) == []  # late, older step


def test_ranks_and_generations_are_judged_apart() -> None:
    detector = LossSpikeDetector({})
    feed(detector, [1.0] * 5, rank=0)
    # rank 1 runs at a loss of 100: that is its normal, not a spike of rank 0's scale
    assert feed(detector, [100.0] * 6, rank=1) == []
    # a new generation starts its warm-up again; the old one is forgotten
    assert feed(detector, [1.0, 1000.0], generation=1) == []
    assert detector.observe(progress(9, 1000.0, generation=0), ctx(9)) == []


def test_reports_without_the_metric_or_a_place_are_ignored() -> None:
    detector = LossSpikeDetector({})
    assert feed(detector, [1.0] * 5) == []
    assert detector.observe(progress(6, None), ctx(6)) == []
    unplaced = progress(7, 1000.0).model_copy(update={"rank": None})
    assert detector.observe(unplaced, ctx(7)) == []


def test_settings_come_from_the_environment() -> None:
    detector = LossSpikeDetector(
        {FACTOR_ENV: "3", WARMUP_ENV: "2", WINDOW_ENV: "4", METRIC_ENV: "nll",
         ALERT_ONLY_ENV: "true"}
    )  # fmt: skip
    reports = [progress(step, loss, metric="nll") for step, loss in enumerate([2, 2, 7], 1)]
    [fault] = [f for p in reports for f in detector.observe(p, ctx())]
    assert fault.alert_only and fault.severity is Severity.WARNING
    assert fault.evidence["metric"] == "nll" and fault.evidence["factor"] == 3.0


def test_the_window_holds_at_least_the_warmup() -> None:
    assert LossSpikeDetector({WARMUP_ENV: "30", WINDOW_ENV: "10"}).window == 30


@pytest.mark.parametrize(
    ("name", "text"),
    [(FACTOR_ENV, "0.5"), (FACTOR_ENV, "ten"), (FACTOR_ENV, "nan"), (WARMUP_ENV, "0"),
     (WARMUP_ENV, "2.5"), (WINDOW_ENV, "-1"), (ALERT_ONLY_ENV, "maybe")],
)  # fmt: skip
def test_a_bad_setting_fails_naming_the_variable(name: str, text: str) -> None:
    with pytest.raises(ValueError, match=name):
        LossSpikeDetector({name: text})


def test_silent_workers_are_forgotten_on_tick() -> None:
    detector = LossSpikeDetector({})
    feed(detector, [1.0] * 5)
    assert detector.tick(ctx(60)) == []
    assert detector.observe(progress(6, 1000.0), ctx(61)) != []
    silent = 61 + FORGET_AFTER.total_seconds() + 1
    detector.tick(ctx(silent - PRUNE_EVERY.total_seconds() / 2))
    assert detector.tick(ctx(silent)) == []  # a pass at most every PRUNE_EVERY
    assert len(detector._workers) == 1
    assert detector.tick(ctx(silent + PRUNE_EVERY.total_seconds())) == []
    assert detector._workers == {} and detector._newest == {}
