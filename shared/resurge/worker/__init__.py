"""``resurge.worker``: what a training script may use from resurge (standard library only).

A script that never imports this still runs under resurge, as under torchrun. One that
does gets heartbeats, checkpoint discovery and (later) in-process restarts::

    from resurge import worker

    run = worker.connect()            # no-op client when not under a resurge agent
    start = run.resume_step or 0      # the step of the latest checkpoint every rank has
    path = run.resume_checkpoint      # where it is (None: start fresh)
    for step in range(start + 1, steps + 1):
        ...
        run.progress(step, loss=float(loss))
        if step % every == 0:
            save(...)
            run.checkpoint_saved(step, path_of(step))
        if run.stop_pending:          # the agent announced a stop or resize
            ...
    run.close()

Reports never block training: they are sent best-effort, and a missing or dead agent
only turns them into no-ops.
"""

from __future__ import annotations

import os

from resurge.worker_env import AGENT_SOCKET, GENERATION, RESUME_CHECKPOINT, RESUME_STEP

__all__ = ["WorkerRun", "connect"]


class WorkerRun:
    """This worker's link to its agent. Placeholder: reports are dropped (issue 3 fills in)."""

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path
        self.generation = int(os.environ.get(GENERATION, "0"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.resume_checkpoint: str | None = os.environ.get(RESUME_CHECKPOINT) or None
        step = os.environ.get(RESUME_STEP)
        self.resume_step: int | None = int(step) if step else None

    @property
    def connected(self) -> bool:
        return False

    @property
    def stop_pending(self) -> bool:
        return False

    def progress(self, step: int, **metrics: float) -> None:
        return None

    def checkpoint_saved(self, step: int, path: str) -> None:
        return None

    def close(self) -> None:
        return None


def connect() -> WorkerRun:
    """Link to the agent named by ``RESURGE_AGENT_SOCKET`` (a no-op link without one)."""
    return WorkerRun(os.environ.get(AGENT_SOCKET) or None)
