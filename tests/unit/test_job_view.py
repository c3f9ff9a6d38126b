"""Detectors get read-only views of the jobs they judge: the runtime hands them a
FrozenJob, which no detector can change, kept current as the records change."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from resurge.control.state.records import JobRecord, Placement
from resurge.detection import DetectorContext, FrozenJob
from resurge.events import JobPhase, Source
from resurge.local.job_factory import job
from resurge_detector.runtime import DetectorRuntime, Partition


def record(generation: int = 0) -> JobRecord:
    return JobRecord(
        name="j",
        spec=job("j", nproc=2),
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
    )


def test_a_detector_sees_the_job_but_cannot_change_it() -> None:
    runtime = DetectorRuntime([], Source.here("detector"), Partition())
    runtime.set_job("j", record())
    now = datetime.now(UTC)
    seen = DetectorContext(now=now, source=runtime.source, jobs=runtime.jobs).job("j")
    assert isinstance(seen, FrozenJob)
    assert (seen.generation, seen.world_size, [p.node for p in seen.placements]) == (
        0,
        4,
        ["n0", "n1"],
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.generation = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        seen.placements.append(Placement(replica=2, node="n2"))  # type: ignore[attr-defined]


def test_the_view_follows_the_record() -> None:
    runtime = DetectorRuntime([], Source.here("detector"), Partition())
    runtime.set_job("j", record(0))
    runtime.set_job("j", record(3))
    assert runtime.jobs["j"].generation == 3
