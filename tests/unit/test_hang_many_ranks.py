"""The hang detector's durable facts for a job of thousands of ranks: each replica's entry
holds exactly its ranks (gathered from them alone, not from a scan of the job's, which
made a new generation's first reports quadratic in the ranks), and a generation its
record already left, read late by a detector behind, is not made again (it was, for
every batch, each time rewriting every rank's entry: the detector fell further behind).
Pure, through the runtime, as the service drives it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.control.state.records import JobRecord, Placement
from resurge.events import FaultDetected, JobPhase, ProcessExited, ProcessStarted, Progress, Source
from resurge.local import job_factory
from resurge_detector.facts import RanksByEntry, unpack
from resurge_detector.hang import HangDetector
from resurge_detector.runtime import DetectorRuntime, Partition

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
REPLICAS = 2048
NPROC = 2  # 4,096 ranks: rank r is local rank r % 2 of replica r // 2
RANKS = REPLICAS * NPROC


def record(generation: int) -> JobRecord:
    spec = job_factory.job(
        "big",
        nproc=NPROC,
        replicas=REPLICAS,
        monitoring={"heartbeatTimeoutSeconds": 2},
        preload=None,
    )
    placements = [Placement(replica=r, node=f"n{r}") for r in range(REPLICAS)]
    return JobRecord(
        name="big",
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=placements,
    )


def where(rank: int, generation: int) -> dict[str, Any]:
    replica = rank // NPROC
    return {
        "source": SOURCE,
        "job": "big",
        "replica": replica,
        "node": f"n{replica}",
        "rank": rank,
        "generation": generation,
        "local_rank": rank % NPROC,
    }


def progress(rank: int, generation: int, step: int) -> Progress:
    return Progress(step=step, **where(rank, generation))


def started(rank: int, generation: int) -> ProcessStarted:
    return ProcessStarted(pid=100 + rank, local_world_size=NPROC, **where(rank, generation))


def exited(rank: int, generation: int) -> ProcessExited:
    return ProcessExited(
        pid=100 + rank, local_world_size=NPROC, exit_code=1, **where(rank, generation)
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def every_rank_reports(rt: DetectorRuntime, generation: int, second: int) -> None:
    """One report of every rank, in batches of 500 (as the service reads them under load)."""
    events = [progress(rank, generation, second) for rank in range(RANKS)]
    for start in range(0, RANKS, 500):
        rt.observe_all(events[start : start + 500], at(second + start / RANKS))


def stored_ranks(changes: dict[tuple[str, str, str], bytes | None]) -> dict[str, set[int]]:
    """Entry key -> the ranks its stored facts hold (the hang detector's replica entries)."""
    out: dict[str, set[int]] = {}
    for (detector, job, key), value in changes.items():
        assert detector == "hang" and job == "big"
        if key != "learned" and value is not None:
            out[key] = {int(rank) for rank in unpack(value)["ranks"]}
    return out


def test_each_replica_s_entry_holds_its_ranks_as_they_start_report_and_exit() -> None:
    rt = DetectorRuntime([HangDetector()], SOURCE, Partition())
    rt.set_job("big", record(0))
    rt.observe_all([started(rank, 0) for rank in range(RANKS)], at(0))
    every_rank_reports(rt, 0, 1)
    entries = stored_ranks(rt.state_changes())
    assert entries == {f"r{r}": {r * NPROC, r * NPROC + 1} for r in range(REPLICAS)}

    # Local rank 1 of every even replica exits: those entries are rewritten without it.
    gone = [r * NPROC + 1 for r in range(0, REPLICAS, 2)]
    rt.observe_all([exited(rank, 0) for rank in gone], at(1.5))
    entries = stored_ranks(changes := rt.state_changes())
    assert set(changes) == {("hang", "big", f"r{r}") for r in range(0, REPLICAS, 2)}
    assert entries == {f"r{r}": {r * NPROC} for r in range(0, REPLICAS, 2)}

    # They start again (a process-level restart in the generation): back in their entries.
    rt.observe_all([started(rank, 0) for rank in gone], at(2))
    entries = stored_ranks(rt.state_changes())
    assert entries == {f"r{r}": {r * NPROC, r * NPROC + 1} for r in range(0, REPLICAS, 2)}
    assert not faults(rt.tick(at(2.5)))  # every rank reported within the timeout


def test_a_generation_its_record_left_read_late_is_not_made_again() -> None:
    """A detector behind reads generation 1's reports after the record moved to 2: they
    arm nothing and change no entry, and the one silent rank of generation 2 is blamed."""
    rt = DetectorRuntime([HangDetector()], SOURCE, Partition())
    rt.set_job("big", record(1))
    every_rank_reports(rt, 1, 1)
    assert len(stored_ranks(rt.state_changes())) == REPLICAS

    rt.set_job("big", record(2))  # a restart: generation 1 is over
    assert not faults(rt.tick(at(2.1)))  # the tick drops generation 1 ...
    deleted = {k: v for k, v in rt.state_changes().items() if k[2] != "learned"}
    assert len(deleted) == REPLICAS and set(deleted.values()) == {None}  # ... and its entries

    for second in range(2, 6):  # its reports, read late, batch after batch, tick after tick
        every_rank_reports(rt, 1, second)
        assert rt.state_changes() == {}
        assert not faults(rt.tick(at(second + 0.9)))

    # Generation 2 is judged as ever: rank 7 goes silent, and is blamed.
    for second in range(6, 9):
        rt.observe_all(
            [progress(rank, 2, second) for rank in range(RANKS) if rank != 7 or second == 6],
            at(second),
        )
    found = faults(rt.tick(at(8.5)))
    assert [(f.generation, f.rank, f.reason) for f in found] == [(2, 7, "hang")]


def test_ranks_by_entry_files_moves_and_removes() -> None:
    entries = RanksByEntry()
    for rank in range(6):
        entries.file(rank, rank // 2)
    entries.file(3, None)  # rank 3 moves to an entry of no replica
    entries.remove(4)
    entries.remove(99)  # never filed: nothing to do
    assert entries.ranks("r0") == [0, 1]
    assert entries.ranks("r1") == [2]
    assert entries.ranks("r2") == [5]
    assert entries.ranks("r_") == [3]
    entries.remove(2)
    assert entries.ranks("r1") == []


def faults(out: list[Any]) -> list[FaultDetected]:
    return [e for e in out if isinstance(e, FaultDetected)]
