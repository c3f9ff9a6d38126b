"""What a node monitor does for a CheckNode command: check the node's health, answer once.

The restarter asks a quarantined node for a check once no job runs on it
(:mod:`resurge_restarter.node_checks`). :func:`check_node` (the slow parts in a thread):

1. resets each GPU that awaits a reset (its XID asked for one: a reset may bring it
   back), as for a ResetGpu;
2. reads every GPU: each must answer, and none may still be out of use (one that fell
   off the bus, or whose reset failed, stays out: the node needs a reboot or a repair);
3. runs ``RESURGE_NODE_HEALTH_CHECK_COMMAND`` where one is set (exit 0 passes, at most
   ``RESURGE_NODE_HEALTH_CHECK_TIMEOUT_SECONDS``).

The answer is a NodeChecked whose ``request`` is the command's id, saying what was found.
"""

from __future__ import annotations

import asyncio
import time

from resurge.events import CheckNode, NodeChecked, Source
from resurge_node_agent.monitor.gpus import GpuSource
from resurge_node_agent.monitor.node_commands import run_command

__all__ = ["check_node"]


async def check_node(
    command: CheckNode,
    gpus: GpuSource,
    *,
    source: Source,
    node: str,
    reset_command: str,
    reset_bound: float,
    check_command: str,
    check_bound: float,
) -> NodeChecked:
    """Check ``node``'s health (see the module docstring)."""
    began = time.monotonic()
    found: list[str] = []
    reset: list[int] = []
    for gpu in gpus.resettable():
        outcome = await asyncio.to_thread(gpus.reset, gpu, reset_command, reset_bound)
        if outcome.ok and outcome.reset:
            reset.append(gpu)
        found.append(outcome.message)
    readings = await asyncio.to_thread(gpus.readings)
    out = gpus.unhealthy()
    silent = [r.index for r in readings if not r.healthy and r.index not in out]
    problems = []
    if out:
        problems.append(f"GPU(s) {', '.join(map(str, out))} still out of use")
    if silent:
        problems.append(f"GPU(s) {', '.join(map(str, silent))} do not answer")
    if len(readings) != gpus.count:
        problems.append(f"{len(readings)} of {gpus.count} GPUs read")
    if not problems:
        found.append(f"all {gpus.count} GPUs answer and are in use")
        if check_command:
            failed = await asyncio.to_thread(run_command, check_command, check_bound)
            if failed is not None:
                problems.append(failed)
            else:
                found.append(f"{check_command!r} passed")
    return NodeChecked(
        source=source,
        node=node,
        request=command.id,
        passed=not problems,
        reset_gpus=reset,
        seconds=round(time.monotonic() - began, 3),
        message="; ".join([*found, *problems]),
    )
