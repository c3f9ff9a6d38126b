"""The chaos bench's (bench/chaos.py) count of the steps trained again at each new
generation, on made-up events: measured from progress (the last step any earlier
generation reached less the new one's first step, less one), split into restarts and
resizes, beside the disk checkpoint's bound, and a generation that trained more than a
checkpoint interval again breaks the invariant (a bench that cannot report it would
show zero for nothing)."""

from __future__ import annotations

import importlib.util
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

from resurge.events import (
    Assign,
    Event,
    FaultDetected,
    JobPhase,
    ProcessStarted,
    Progress,
    RecoveryLevel,
    RecoveryStarted,
    ScaleDecided,
    StateRestored,
)
from resurge.events.commands import ReplicaSlot
from resurge.events.envelope import Source
from resurge.local.story import Observed, StoryResult, Watch

BENCH = Path(__file__).resolve().parents[2] / "bench"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = "chaos"


def _chaos() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("chaos_bench", BENCH / "chaos.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["chaos_bench"] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


chaos = _chaos()
SOURCE = Source(service="test", instance="here")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def progress(generation: int, steps: range, start: float) -> list[Event]:
    return [
        Progress(source=SOURCE, job=JOB, rank=rank, generation=generation, local_rank=0,
                 step=step, time=at(start + i))
        for i, step in enumerate(steps)
        for rank in (0, 1)
    ]  # fmt: skip


def assign(generation: int, resume_step: int | None, seconds: float) -> Assign:
    slots = [ReplicaSlot(replica=0, node="node-0", first_rank=0, nproc=1)]
    return Assign(
        source=SOURCE, job=JOB, generation=generation, world_size=1, rank_table=slots,
        master_addr="127.0.0.1", master_port=29500, resume_step=resume_step, time=at(seconds),
    )  # fmt: skip


def restored(generation: int, origin: str, step: int | None, rank: int) -> StateRestored:
    return StateRestored(
        source=SOURCE, job=JOB, generation=generation, rank=rank, local_rank=0, step=step,
        origin=origin, detail="",
    )  # fmt: skip


def restart(generation: int) -> RecoveryStarted:
    return RecoveryStarted(
        source=SOURCE, job=JOB, fault_id=f"f{generation}", level=RecoveryLevel.PROCESS,
        reason="process_exited", from_generation=generation - 1, to_generation=generation,
    )  # fmt: skip


def grow(generation: int) -> ScaleDecided:
    return ScaleDecided(
        source=SOURCE, job=JOB, resize="grow", from_replicas=2, to_replicas=3, why="capacity",
        from_generation=generation - 1, to_generation=generation,
    )  # fmt: skip


def story(events: list[Event]) -> StoryResult:
    observed = [Observed(subject="x", event=event) for event in events]
    return StoryResult(
        job=JOB, phase=JobPhase.SUCCEEDED, observed=observed, services_alive={},
        service_restarts={}, seconds=1.0,
    )  # fmt: skip


def four_generations(redone_by_disk: int) -> StoryResult:
    """Generation 0 to step 25; a rank killed, generation 1 from memory at step 25 (the
    step in flight again); a grow, generation 2 going on after step 40 (nothing again);
    a restart whose state came from the disk at step 40, ``redone_by_disk`` again."""
    reached_2 = 55
    return story([
        *progress(0, range(1, 26), 0), restart(1), assign(1, 20, 30),
        restored(1, "memory", 24, 0), restored(1, "peer", 24, 1), *progress(1, range(25, 41), 31),
        grow(2), assign(2, 20, 50), restored(2, "memory", 40, 0), *progress(2, range(41, 56), 51),
        restart(3), assign(3, 40, 70), restored(3, "disk", None, 0),
        *progress(3, range(reached_2 - redone_by_disk + 1, 61), 71),
    ])  # fmt: skip


def test_each_new_generation_counts_the_steps_progress_shows_it_trained_again() -> None:
    injected = [("kill_rank", at(28)), ("remove_node", at(45)), ("kill_agent", at(69))]
    news = chaos.new_generations(four_generations(15), JOB, injected)
    assert [n.generation for n in news] == [1, 2, 3]
    assert [n.redone for n in news] == [1, 0, 15]
    assert [n.from_disk for n in news] == [5, 20, 15]  # the reached step less resume_step
    assert [n.resize for n in news] == [False, True, False]
    assert [n.cause for n in news] == ["restart (process)", "resize (grow)", "restart (process)"]
    assert [n.disturbance for n in news] == ["kill_rank", "remove_node", "kill_agent"]
    assert news[0].disturbed_seconds_before == 2.0
    assert news[0].restored == {"memory": 1, "peer": 1}
    assert "restored: memory 1, peer 1 at step 24" in str(news[0])


def test_a_step_restored_counts_as_reached_when_its_progress_was_never_seen() -> None:
    """Generation 1 reported step 40 but restored step 41 (its rank killed before it
    reported it): generation 2 going on after step 41 trained nothing again, not -1."""
    result = four_generations(15)
    result.observed[:] = [
        o for o in result.observed
        if not (isinstance(o.event, Progress) and o.event.generation == 1 and o.event.step == 40)
    ] + [Observed(subject="x", event=restored(2, "peer", 40, 1))]  # fmt: skip
    news = chaos.new_generations(result, JOB, [])
    assert [n.redone for n in news] == [1, 0, 15]
    assert [n.progress_unseen for n in news] == [0, 1, 0]
    assert "(1 step(s) reached unseen)" in str(news[1])


@pytest.mark.parametrize(("redone", "broken"), [(15, False), (31, True)])
def test_a_generation_that_trains_more_than_an_interval_again_breaks_the_invariant(
    redone: int, broken: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    job = chaos.chaos_job(Path("/tmp/ckpt"), minutes=0.2, every=20)
    total = int(job.spec.command[job.spec.command.index("--steps") + 1])
    result = four_generations(redone)
    result.observed += [
        Observed(subject="x", event=e) for e in progress(3, range(61, total + 1), 90)
    ]
    code = chaos.report(result, chaos.Chaos(), job, protect=True)
    out = capsys.readouterr().out
    assert "mode: peer recovery" in out
    assert "per restart (2): mean" in out and "per resize (1): mean 0.0, max 0" in out
    assert ("trained more than a checkpoint interval again: [31]" in out) is broken
    assert code == (1 if broken else 0)


def test_no_protect_runs_the_example_disk_only() -> None:
    protected = chaos.chaos_job(Path("/tmp/ckpt"), 1, 20).spec.command
    plain = chaos.chaos_job(Path("/tmp/ckpt"), 1, 20, protect=False).spec.command
    assert "--no-protect" not in protected
    assert plain == [*protected, "--no-protect"]


def test_a_victim_is_named_by_the_rank_its_process_has_now() -> None:
    """A worker restarted in-process after a resize keeps its pid and reports a start
    with its new rank: the faults sent by rank go to that rank, not to the rank it had
    before (which another worker holds now, or nobody: 'rank 3 is not in chaos')."""
    watch = Watch()
    pid = os.getpid()  # a process that runs
    for generation, rank in ((0, 3), (1, 1)):
        start = ProcessStarted(
            source=SOURCE, job=JOB, generation=generation, rank=rank, pid=pid, local_rank=0,
            local_world_size=1, in_process=generation > 0,
        )  # fmt: skip
        watch.observed.append(Observed(subject="x", event=start))
    assert [(w.pid, w.rank) for w in chaos.live_workers(watch)] == [(pid, 1)]


def test_the_next_disturbance_waits_for_a_newer_generation_to_train() -> None:
    """Steps of the generation a fault broke still arrive after it: they are not the job
    training again (a kill_rank 18 s after an XID hit the new generation in its start
    and made one incident of two, a job restart)."""
    watch = Watch()
    watch.observed += [Observed(subject="x", event=e) for e in progress(4, range(1, 5), 0)]
    broken = chaos.training_generation(watch)
    watch.observed += [Observed(subject="x", event=e) for e in progress(4, range(5, 7), 10)]
    assert (broken, chaos.trains_again(watch, broken)) == (4, False)
    watch.observed += [Observed(subject="x", event=e) for e in progress(5, range(6, 7), 20)]
    assert chaos.trains_again(watch, broken)


def test_a_fault_is_detected_only_by_a_detection_before_the_next_disturbance() -> None:
    """A log line sent to a replica that no longer exists is never detected; the kill
    after it is: the log injection is undetected, though a fault came after it."""
    injected = [("log", at(10)), ("kill_service", at(20)), ("kill_rank", at(30))]
    faults = [
        FaultDetected(source=SOURCE, job=JOB, fault_id="f", reason="process_killed",
                      scope="process", message="", time=at(31))
    ]  # fmt: skip
    assert chaos.undetected_faults(injected, faults) == ["log at 00:00:10"]
    assert chaos.undetected_faults(injected[1:], faults) == []
