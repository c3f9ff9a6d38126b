"""The scaler bench's trace replay (bench/scaler.py, part 2) models work, not durations:
a job on more GPUs does its work sooner, at the scaling efficiency stated; every start and
resize costs the pause stated; a fixed-size job asks for the size its rule gives (the
largest that the daytime queue admits, the middle one, or its min), and its completion
time is its arrival to its work done. Made-up traces, the real ``decide``."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from resurge.control.decisions.elastic_decision import JobShape

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _scaler() -> ModuleType:
    if str(BENCH) not in sys.path:  # its sibling modules, as when it runs as a script
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("scaler_bench", BENCH / "scaler.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaler_bench"] = module
    spec.loader.exec_module(module)
    return module


scaler = _scaler()
HOUR = 3600.0


def test_more_gpus_work_faster_at_the_stated_efficiency() -> None:
    shape = JobShape(name="j", nproc=8, sizes=(2, 4, 8))
    assert scaler.speed(shape, 2, 0.9) == pytest.approx(16.0)  # its min: 16 GPUs' worth
    assert scaler.speed(shape, 4, 0.9) == pytest.approx(32 * 0.9)
    assert scaler.speed(shape, 8, 0.9) == pytest.approx(64 * 0.81)
    assert scaler.speed(shape, 0, 0.9) == 0.0


def test_each_fixed_rule_asks_for_its_size() -> None:
    shape = JobShape(name="j", nproc=8, sizes=(3, 6, 12, 24))  # 24 x 8 = 192 > 160 GPUs
    assert scaler.fixed_size(shape, "max-fit") == 12
    assert scaler.fixed_size(shape, "middle") == 12
    assert scaler.fixed_size(shape, "min") == 3
    small = JobShape(name="k", nproc=4, sizes=(1, 2, 3, 4))
    assert scaler.fixed_size(small, "max-fit") == 4
    assert scaler.fixed_size(small, "middle") == 3


def alone(work_hours_at_min: float) -> list[object]:
    """A trace of one training job of 1 to 4 replicas x 8 GPUs and no reservation."""
    shape = JobShape(name="train-000", nproc=8, sizes=(1, 2, 3, 4), submitted=0.0)
    return [scaler.Arrival(shape, 0.0, work=work_hours_at_min * HOUR * 8)]


def test_a_job_alone_ends_its_work_at_the_speed_of_its_size_after_one_pause() -> None:
    costs = scaler.Costs(efficiency=0.9, pause=60.0)
    fixed = scaler.replay(alone(4.0), 6.0, 30.0, "min", costs)
    assert fixed.unfinished == 0
    assert fixed.completion == [pytest.approx(60.0 + 4 * HOUR)]
    elastic = scaler.replay(alone(4.0), 6.0, 30.0, None, costs)
    assert elastic.unfinished == 0
    # Admitted and grown to its max at once: 32 GPUs at 0.9^2 each, one pause.
    assert elastic.completion == [pytest.approx(60.0 + 4 * HOUR * 8 / (32 * 0.81))]
    assert elastic.resizes == 0  # the admission is not a resize
    assert elastic.work_seconds == pytest.approx(4 * HOUR * 8)


def test_the_replay_runs_past_the_arrivals_until_every_job_is_done() -> None:
    fixed = scaler.replay(alone(20.0), 6.0, 60.0, "min", scaler.Costs(pause=0.0))
    assert fixed.completion == [pytest.approx(20 * HOUR)]
    # Utilisation and work count over the arrival window alone: 6 of the 20 hours.
    assert fixed.work_seconds == pytest.approx(6 * HOUR * 8)
    assert fixed.capacity_seconds == pytest.approx(6 * HOUR * 256)


def test_a_slower_scaling_job_gains_less_from_growing() -> None:
    def mean_completion(efficiency: float) -> float:
        run = scaler.replay(alone(4.0), 6.0, 30.0, None, scaler.Costs(efficiency, 0.0))
        mean, _ = scaler.completion_hours(run)
        return float(mean)

    assert mean_completion(0.5) == pytest.approx(4.0)  # 32 GPUs at 0.25 = 8 GPUs' worth
    assert mean_completion(1.0) == pytest.approx(1.0)
    assert not math.isnan(mean_completion(0.9))
