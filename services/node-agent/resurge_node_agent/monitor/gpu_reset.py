"""What a node monitor does for a ResetGpu command: reset each GPU it names, answer each.

The restarter sends ResetGpu between stopping a job's workers and starting them again,
for an XID whose action is ``reset_gpu``. :func:`reset_gpus` resets the GPUs one after
another through the node's :class:`~resurge_node_agent.monitor.gpus.GpuSource` (in a
thread: a real reset waits for the GPU's processes to exit and runs
``RESURGE_GPU_RESET_COMMAND``, each wait bounded by ``RESURGE_GPU_RESET_TIMEOUT_SECONDS``)
and answers each with a GpuReset whose ``request`` is the command's id. A GPU that is
not out of use needs no reset (another job's recovery reset it first): answered ok,
``reset`` false. A reset that fails also gives a ``reset_failed`` GPU error, which the
monitor publishes like any other; the detector makes it a node fault, so the job moves
off the node.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from resurge.events import GpuReset, ResetGpu, Source
from resurge_node_agent.monitor.gpus import GpuErrorReport, GpuSource

__all__ = ["ResetAnswer", "reset_gpus"]


@dataclass(frozen=True)
class ResetAnswer:
    """One GPU's answer, and the GPU error to publish where its reset failed."""

    answer: GpuReset
    failure: GpuErrorReport | None


async def reset_gpus(
    command: ResetGpu,
    gpus: GpuSource,
    *,
    source: Source,
    node: str,
    reset_command: str,
    bound: float,
) -> list[ResetAnswer]:
    """Reset each GPU ``command`` names on ``node`` (see the module docstring)."""
    answers: list[ResetAnswer] = []
    uuids = gpus.uuids
    for gpu in command.gpus:
        began = time.monotonic()
        outcome = await asyncio.to_thread(gpus.reset, gpu, reset_command, bound)
        uuid = uuids[gpu] if 0 <= gpu < len(uuids) else ""
        answer = GpuReset(
            source=source,
            node=node,
            request=command.id,
            gpu=gpu,
            uuid=uuid,
            ok=outcome.ok,
            reset=outcome.reset,
            seconds=round(time.monotonic() - began, 3),
            message=outcome.message,
        )
        failure = None
        if not outcome.ok:
            failure = GpuErrorReport(
                gpu=gpu, uuid=uuid, error="reset_failed", message=outcome.message
            )
        answers.append(ResetAnswer(answer, failure))
    return answers
