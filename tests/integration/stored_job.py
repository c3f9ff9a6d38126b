"""A job's life as the services store it: two crashes recovered at the process level,
then a grow from 2 to 4 replicas, then Succeeded. Times are in the past so the events
read back in a fixed order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from resurge.events import (
    Assign,
    FaultDetected,
    FaultScope,
    JobPhase,
    PhaseChanged,
    ProcessExited,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
    RecoveryStarted,
    ReplicaSlot,
    ScaleDecided,
)
from resurge.events.envelope import Envelope
from resurge.runtime.bus import Bus

JOB = "reported"
START = datetime.now(UTC) - timedelta(minutes=5)


def _at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def _assign(bus: Bus, seconds: float, generation: int, world: int) -> Assign:
    return Assign(
        source=bus.source, job=JOB, replica=0, time=_at(seconds), generation=generation,
        world_size=world, master_port=29500, master_addr="127.0.0.1",
        rank_table=[ReplicaSlot(replica=r, node=f"node-{r}", first_rank=r, nproc=1)
                    for r in range(world)],
    )  # fmt: skip


def _fault(bus: Bus, seconds: float, rank: int, generation: int) -> FaultDetected:
    return FaultDetected(
        source=bus.source, job=JOB, rank=rank, node=f"node-{rank}", generation=generation,
        fault_id=f"crash:{JOB}:g{generation}:r{rank}", scope=FaultScope.PROCESS,
        reason="process_crash", message=f"rank {rank} was killed by SIGKILL",
        suggested_level=RecoveryLevel.PROCESS, time=_at(seconds),
    )  # fmt: skip


async def store_job(bus: Bus, total_steps: int | None = None) -> None:
    """Publish the job's events (rank 0 reports ``total_steps`` when given)."""
    s, src = bus.subjects, bus.source
    events: list[tuple[str, Envelope]] = [
        (s.action(JOB), PhaseChanged(source=src, job=JOB, phase=JobPhase.RUNNING, time=_at(0))),
        (s.cmd(JOB, 0), _assign(bus, 0, 0, 2)),
    ]
    step_times = [(t, t) for t in range(1, 21)]  # steps 1..20 over 20 s
    step_times += [(t, t - 3) for t in range(22, 30)]  # after fault 1: 19..26 (2 redone)
    step_times += [(t, t - 10) for t in range(33, 60)]  # after fault 2: 23..49 (4 redone)
    for t, step in step_times:
        metrics = {} if total_steps is None else {"total_steps": float(total_steps)}
        progress = Progress(
            source=src, job=JOB, rank=0, local_rank=0, step=step, time=_at(t), metrics=metrics
        )
        events.append((s.raw(JOB, "progress", "node-0"), progress))
    for when, rank, generation in ((20.2, 1, 0), (30.1, 0, 1)):
        died = ProcessExited(
            source=src, job=JOB, rank=rank, pid=1, local_rank=0, local_world_size=1,
            exit_code=None, signal="SIGKILL", time=_at(when),
        )  # fmt: skip
        events += [
            (s.raw(JOB, "process_exited", f"node-{rank}"), died),
            (s.fault(JOB, "process"), _fault(bus, when + 0.1, rank, generation)),
            (
                s.action(JOB),
                RecoveryStarted(
                    source=src,
                    job=JOB,
                    fault_id="f",
                    level=RecoveryLevel.PROCESS,
                    reason="process_crash",
                    from_generation=generation,
                    to_generation=generation + 1,
                    time=_at(when + 0.2),
                ),
            ),
            (s.cmd(JOB, 0), _assign(bus, when + 0.3, generation + 1, 2)),
            (
                s.action(JOB),
                RecoveryFinished(
                    source=src,
                    job=JOB,
                    fault_id="f",
                    level=RecoveryLevel.PROCESS,
                    reason="process_crash",
                    duration_seconds=1.5,
                    time=_at(when + 1.6),
                ),
            ),
        ]
    grow = ScaleDecided(
        source=src, job=JOB, resize="grow", from_replicas=2, to_replicas=4,
        why="4 free GPUs", from_generation=2, to_generation=3, time=_at(40),
    )  # fmt: skip
    events += [
        (s.action(JOB), grow),
        (s.cmd(JOB, 0), _assign(bus, 40.5, 3, 4)),
        (s.action(JOB), PhaseChanged(source=src, job=JOB, phase=JobPhase.SUCCEEDED, time=_at(60))),
    ]
    for subject, event in events:
        await bus.publish(subject, event)
