"""The GPU resets of a recovery plan: asked of the nodes' monitors, their answers awaited.

A plan whose fault was an XID that asks for a reset (``PendingRecovery.reset_gpus``)
restarts the job where it was, once the GPU is reset. Between the Stops and the Assigns
the dispatcher calls :func:`reset_plan_gpus`: one ResetGpu per node the record still
places (id derived from job, node and generation, so a repeat is de-duplicated), then
the GpuReset answers (a core subscription made before the commands go out), at most
``bound`` seconds. It returns False when a reset failed: the monitor also reported
the failure as a GPU error, whose fault moves the job off the node, so the plan is left
for that fault to replace. No answer in time is logged and counts as done: the new
generation starts, and a GPU still broken faults it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from resurge.contract.subscriptions import RESTARTER_GPU_RESETS, Scope
from resurge.control.decisions.planner import command_id
from resurge.control.state.records import JobRecord
from resurge.events import Event, GpuReset, ResetGpu
from resurge.runtime.bus import Bus

__all__ = ["reset_plan_gpus"]


def _commands(bus: Bus, record: JobRecord) -> list[ResetGpu]:
    """One ResetGpu per node of the plan's resets that the record still places."""
    plan = record.pending_recovery
    assert plan is not None
    first_replica: dict[str, int] = {}
    for p in sorted(record.placements, key=lambda p: p.replica):
        first_replica.setdefault(p.node, p.replica)
    gpus: dict[str, set[int]] = {}
    for one in plan.reset_gpus:
        if one.node in first_replica:
            gpus.setdefault(one.node, set()).add(one.gpu)
    return [
        ResetGpu(
            id=command_id("reset-gpu", record.name, first_replica[node], plan.to_generation,
                          record.uid),
            source=bus.source,
            node=node,
            job=record.name,
            generation=plan.to_generation,
            gpus=sorted(wanted),
            reason=f"{plan.reason} ({plan.fault_id})",
        )
        for node, wanted in sorted(gpus.items())
    ]  # fmt: skip


async def reset_plan_gpus(bus: Bus, record: JobRecord, bound: float, log: logging.Logger) -> bool:
    """Reset the GPUs of ``record``'s plan and await the answers (module docstring):
    False if a reset failed."""
    commands = _commands(bus, record)
    if not commands:
        return True
    wanted = {(c.node, gpu): c.id for c in commands for gpu in c.gpus}
    answers: dict[tuple[str | None, int], GpuReset] = {}
    all_in = asyncio.Event()

    async def on_answer(event: Event, _subject: str) -> None:
        if not isinstance(event, GpuReset) or wanted.get((event.node, event.gpu)) != event.request:
            return
        answers[(event.node, event.gpu)] = event
        if len(answers) == len(wanted):
            all_in.set()

    subscriptions = []
    try:
        for command in commands:
            subscriptions += await bus.bind(
                RESTARTER_GPU_RESETS, on_answer, Scope(node=command.node)
            )
        for command in commands:
            assert command.node is not None
            await bus.publish(bus.subjects.node_cmd(command.node), command)
        async with asyncio.timeout(bound):
            await all_in.wait()
    except TimeoutError:
        missing = sorted(f"GPU {gpu} on {node}" for node, gpu in set(wanted) - set(answers))
        log.warning(
            "%s: no answer to the reset of %s within %g s; starting generation %d anyway",
            record.name,
            ", ".join(missing),
            bound,
            commands[0].generation or 0,
            extra={"job": record.name},
        )
    finally:
        for sub in subscriptions:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    failed = [a for a in answers.values() if not a.ok]
    for answer in answers.values():
        log.log(
            logging.WARNING if not answer.ok else logging.INFO,
            "%s: GPU %d on %s: %s (%.2f s)",
            record.name,
            answer.gpu,
            answer.node,
            answer.message,
            answer.seconds,
            extra={"job": record.name},
        )
    return not failed
