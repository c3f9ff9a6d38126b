"""``resurge demo``: the whole story in one command.

Starts an embedded nats-server and the services, runs a two-replica job whose rank 1
crashes once, lets the restarter recover it, and prints what was detected, what was
restarted and how long each step took. Exits 0 only if the job succeeded after exactly
one process-level restart.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from statistics import median

from resurge.client import event_line
from resurge.events import AgentState, JobPhase, LogLine
from resurge.jobspec import TrainingJob, parse_job
from resurge.local.nats_server import NatsServer
from resurge.local.story import Observed, StoryResult, run_job

__all__ = ["demo_job", "run_demo"]


def demo_job(name: str = "demo", replicas: int = 2, nproc: int = 2, steps: int = 40) -> TrainingJob:
    return parse_job(
        {
            "apiVersion": "resurge.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": {
                "command": [
                    sys.executable,
                    "-m",
                    "resurge.local.demo_worker",
                    "--steps",
                    str(steps),
                    "--crash-rank",
                    "1",
                    "--crash-step",
                    "10",
                ],
                "nprocPerNode": nproc,
                "replicas": {"min": replicas, "max": replicas},
                "recovery": {"jobMaxRetryCount": 3, "stopGraceSeconds": 5},
            },
        }
    )


def summarize(result: StoryResult) -> str:
    lines = ["", "=== resurge demo summary ==="]
    lines.append(
        f"job {result.job}: {result.phase.value if result.phase else 'did not finish'}"
        f" in {result.seconds:.1f} s"
    )
    for fault in result.faults:
        lines.append(f"detected: {fault.reason} ({fault.message})")
    for recovery in result.recoveries:
        lines.append(
            f"restarted: level {recovery.level.value}, "
            f"recovered in {recovery.duration_seconds:.3f} s"
        )
    latencies = result.restart_latencies()
    if latencies:
        lines.append(f"worker exit -> restart command: median {median(latencies) * 1000:.1f} ms")
    return "\n".join(lines)


def succeeded_with_one_restart(result: StoryResult) -> bool:
    return (
        result.phase is JobPhase.SUCCEEDED
        and len(result.recoveries) == 1
        and all(state is AgentState.EXITING for state in result.final_agent_states().values())
    )


async def _demo(state_dir: Path) -> int:
    def show(item: Observed) -> None:
        if not isinstance(item.event, LogLine):
            print(event_line(item.event, as_json=False), flush=True)

    with NatsServer(state_dir / "nats") as server:
        print(f"nats-server at {server.url}; logs in {state_dir / 'logs'}", flush=True)
        result = await run_job(
            demo_job(),
            state_dir=state_dir,
            nats_url=server.url,
            namespace="demo",
            nodes=2,
            gpus_per_node=2,
            on_event=show,
        )
    print(summarize(result))
    ok = succeeded_with_one_restart(result)
    print("demo passed" if ok else "demo FAILED: expected success after exactly one restart")
    return 0 if ok else 1


def run_demo(state_dir: Path | None = None) -> int:
    if state_dir is not None:
        return asyncio.run(_demo(state_dir))
    with tempfile.TemporaryDirectory(prefix="resurge-demo-") as tmp:
        return asyncio.run(_demo(Path(tmp)))
