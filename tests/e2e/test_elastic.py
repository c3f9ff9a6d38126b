"""Elastic jobs on the local cluster: real DDP training (examples/ddp, gloo on CPU) grows
into free GPUs, shrinks for a higher-priority job and grows back, and each resize
resumes from a checkpoint taken for it. A plain torch script (it never imports
resurge) grows into two nodes added one after the other in one resize, and while a
grow waits (the snooze after a restart) its status says why and until when.

Everything is real: nats-server, the services and virtual nodes as processes, torch
workers under ``resurge.worker.restartable`` (staying ranks re-enter in-process at the
new world size), DCP checkpoints, the ``resurge`` CLI.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from resurge.control.effects.client import submit_job
from resurge.control.state.records import JobRecord, JobStore
from resurge.events import (
    Assign,
    FaultDetected,
    JobPhase,
    PhaseChanged,
    ProcessStarted,
    Progress,
    RecoveryStarted,
    ScaleDecided,
)
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import EXAMPLE, python_job
from resurge.local.story import Observed, StoryResult, Watch, run_job
from resurge.runtime.bus import Bus

pytestmark = pytest.mark.e2e


REPO = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).parent / "workers" / "progress_worker.py")
PLAIN = str(Path(__file__).parent / "workers" / "plain_ddp_worker.py")
EVERY = 10


def elastic_ddp(
    tmp_path: Path, steps: int, step_seconds: float = 0.05, **spec: object
) -> TrainingJob:
    """The DDP example as an elastic job of one worker per replica, 1 to 4 replicas; its
    global batch of 48 splits evenly at every world size from 1 to 4."""
    script = EXAMPLE.parent / "train.py"
    args = ["--steps", str(steps), "--checkpoint-every", str(EVERY)]
    args += ["--step-seconds", str(step_seconds)]
    args += ["--global-batch", "48", "--micro-batch", "4", "--log-every", "50"]
    return python_job(
        "grower", script, *args, nproc=1, preload=None,
        replicas={"min": 1, "max": 4}, elastic={"cooldownSeconds": 1},
        env={"OMP_NUM_THREADS": "1", "RESURGE_CHECKPOINT_DIR": str(tmp_path / "ckpt")},
        workingDir=str(REPO), **spec,
    )  # fmt: skip


def world_sizes(seen: list[Observed], job: str) -> list[int]:
    """The world size of each generation of ``job`` that was assigned, in order."""
    sizes: dict[int, int] = {}
    for o in seen:
        if isinstance(o.event, Assign) and o.event.job == job:
            sizes[o.event.generation] = o.event.world_size
    return [sizes[g] for g in sorted(sizes)]


def stepping_at(seen: list[Observed], job: str, world: int) -> bool:
    """A generation of ``job`` assigned at ``world`` ranks has completed a step."""
    generations = {
        o.event.generation
        for o in seen
        if isinstance(o.event, Assign) and o.event.job == job and o.event.world_size == world
    }
    return any(
        isinstance(o.event, Progress) and o.event.job == job and o.event.generation in generations
        for o in seen
    )


def resizes(result: StoryResult, job: str) -> list[ScaleDecided]:
    return [e for e in result.events(ScaleDecided) if e.job == job]


def steps_lost_at_resizes(result: StoryResult, job: str) -> list[int]:
    """Per resize: the last step the old generation reached minus the step resumed from."""
    lost = []
    for decided in resizes(result, job):
        reached = max(
            (e.step for e in result.events(Progress)
             if e.job == job and e.generation == decided.from_generation),
            default=0,
        )  # fmt: skip
        resumed = {e.resume_step or 0 for e in result.events(Assign)
                   if e.job == job and e.generation == decided.to_generation}  # fmt: skip
        assert len(resumed) == 1, f"one resume point per generation, got {resumed}"
        lost.append(reached - resumed.pop())
    return lost


def final_step_seen(seen: list[Observed]) -> int:
    return max((o.event.step for o in seen if isinstance(o.event, Progress)), default=0)


def final_step(result: StoryResult, job: str) -> int:
    return max((e.step for e in result.events(Progress) if e.job == job), default=0)


async def test_a_higher_priority_job_shrinks_an_elastic_one_which_grows_back(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    steps = 400
    low = elastic_ddp(tmp_path, steps, priority=0)
    high = python_job(
        "urgent", WORKER, "--steps", "40", "--step-seconds", "0.1",
        nproc=1, replicas=2, priority=10,
    )  # fmt: skip

    async def submit_urgent_once_grown(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, low.name, 4), 120)
        await submit_job(bus, high)

    result = await run_job(
        low, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=4,
        gpus_per_node=1, wait_seconds=240, during=submit_urgent_once_grown,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result, low.name) == steps
    assert [e for e in result.events(FaultDetected)] == [], "a resize raises no fault"
    assert result.events(RecoveryStarted) == [], "a resize is not a recovery"
    assert world_sizes(result.observed, low.name) == [4, 2, 4]
    shrink, grow = resizes(result, low.name)
    assert (shrink.resize, shrink.from_replicas, shrink.to_replicas) == ("shrink", 4, 2)
    assert "higher-priority job urgent" in shrink.why
    assert (grow.resize, grow.from_replicas, grow.to_replicas) == ("grow", 2, 4)
    urgent = [e for e in result.events(PhaseChanged) if e.job == high.name]
    assert [e.phase for e in urgent][-1] is JobPhase.SUCCEEDED
    running = [o.received for o in result.observed if isinstance(o.event, PhaseChanged)
               and o.event.job == high.name and o.event.phase is JobPhase.RUNNING]  # fmt: skip
    shrunk = [o.received for o in result.observed if o.event is shrink]
    assert running and shrunk and running[0] > shrunk[0], "admitted once the room was made"
    assert all(0 <= lost <= EVERY for lost in steps_lost_at_resizes(result, low.name))
    print(f"steps lost per resize: {steps_lost_at_resizes(result, low.name)}", file=sys.stderr)


async def test_an_elastic_job_shrinks_after_losing_a_node_with_no_spare_and_finishes(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    # The node dies at step 20 or so (at once, no command to wait for): 150 steps leave
    # it well inside the run, and what follows only has to finish.
    steps = 150
    job = elastic_ddp(tmp_path, steps, recovery={"faultyScaleDownTimeoutSeconds": 5})
    lost: list[str] = []

    async def kill_a_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 3), 120)
        await watch.wait_for(lambda seen: final_step_seen(seen) >= 2 * EVERY)
        node = next(o.event.node for o in watch.observed
                    if isinstance(o.event, Assign) and o.event.replica == 2)  # fmt: skip
        assert watch.supervisor is not None and node is not None
        assert watch.supervisor.fail_node(node), "the node had processes to kill"
        lost.append(node)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=3,
        gpus_per_node=1, wait_seconds=240, during=kill_a_node,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED, "it shrank instead of failing"
    assert final_step(result, job.name) == steps
    sizes = world_sizes(result.observed, job.name)
    assert sizes[0] == 3 and sizes[-1] == 2, sizes
    [node] = lost
    last = max(e.generation for e in result.events(Assign) if e.job == job.name)
    assert node not in {e.node for e in result.events(Assign) if e.generation == last}
    lost_at = next(o.received for o in result.observed if isinstance(o.event, FaultDetected))
    smaller = min(o.received for o in result.observed
                  if isinstance(o.event, Assign) and o.event.world_size == 2)  # fmt: skip
    assert smaller - lost_at >= 5 - 1, "it waited faultyScaleDownTimeoutSeconds for a node"
    print([(f.reason, f.scope.value, f.generation) for f in result.faults], file=sys.stderr)


async def resurge_cli(state_dir: Path, *argv: str) -> str:
    """Run ``resurge --state-dir STATE_DIR ARGV...`` as a user does; its stdout."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "resurge"), "--state-dir", str(state_dir), *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, f"resurge {' '.join(argv)}: {err.decode()}"
    return out.decode()


async def test_resurge_node_add_twice_grows_a_job_from_2_to_4(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    steps = 400
    # Slower steps: two grows, each warming a new agent up first, fit well inside it even
    # on a loaded machine.
    job = elastic_ddp(tmp_path, steps, step_seconds=0.15)
    added: list[str] = []

    async def add_two_nodes(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 2), 120)
        await watch.wait_for(lambda seen: final_step_seen(seen) >= EVERY)
        for _ in range(2):
            added.append((await resurge_cli(tmp_path, "node", "add", "--gpus", "1")).strip())
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 4), 120)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=add_two_nodes,
    )  # fmt: skip

    assert added == ["node-2", "node-3"]
    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result, job.name) == steps
    assert result.events(FaultDetected) == [] and result.events(RecoveryStarted) == []
    sizes = world_sizes(result.observed, job.name)
    assert sizes[0] == 2 and sizes[-1] == 4 and sizes == sorted(sizes), sizes
    assert all(d.resize == "grow" for d in resizes(result, job.name))
    last = max(e.generation for e in result.events(Assign) if e.job == job.name)
    assert {e.node for e in result.events(Assign) if e.generation == last} == {
        "node-0", "node-1", "node-2", "node-3",
    }  # fmt: skip
    assert all(0 <= lost <= EVERY for lost in steps_lost_at_resizes(result, job.name))


async def test_resurge_node_remove_shrinks_the_job_first_with_no_fault(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    steps = 400
    job = elastic_ddp(tmp_path, steps)
    removed: list[str] = []

    async def remove_a_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 3), 120)
        await watch.wait_for(lambda seen: final_step_seen(seen) >= EVERY)
        removed.append(await resurge_cli(tmp_path, "node", "remove", "node-1", "--timeout", "90"))
        listed = await resurge_cli(tmp_path, "node", "list")
        assert "node-1" not in listed and "node-0" in listed and "node-2" in listed

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=3,
        gpus_per_node=1, wait_seconds=240, during=remove_a_node,
    )  # fmt: skip

    assert removed and "node node-1 removed" in removed[0]
    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result, job.name) == steps
    assert result.events(FaultDetected) == [], "a node removed on purpose is no fault"
    assert world_sizes(result.observed, job.name) == [3, 2]
    [shrink] = resizes(result, job.name)
    assert (shrink.resize, shrink.from_replicas, shrink.to_replicas) == ("shrink", 3, 2)
    assert "node-1" in shrink.why
    assert "node-1" not in {e.node for e in result.events(Assign) if e.generation == 1}
    assert all(0 <= lost <= EVERY for lost in steps_lost_at_resizes(result, job.name))


def plain_elastic(name: str, **spec: object) -> TrainingJob:
    """A plain torch script (it never imports resurge), one worker per replica, 1 to 4
    replicas, with the default cool-down (60 s)."""
    return python_job(
        name, PLAIN, "--step-seconds", "0.1", nproc=1, preload=None,
        replicas={"min": 1, "max": 4}, env={"OMP_NUM_THREADS": "1"}, **spec,
    )  # fmt: skip


def started_at(seen: list[Observed], job: str, world: int) -> bool:
    """Every worker of a generation of ``job`` assigned at ``world`` ranks has started."""
    generations = {
        o.event.generation
        for o in seen
        if isinstance(o.event, Assign) and o.event.job == job and o.event.world_size == world
    }
    started = [
        o for o in seen
        if isinstance(o.event, ProcessStarted) and o.event.job == job
        and o.event.generation in generations
    ]  # fmt: skip
    return len(started) >= world


async def test_two_nodes_added_one_after_the_other_grow_a_plain_job_in_one_resize(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = plain_elastic("together")
    added: list[str] = []

    async def add_two_nodes(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: started_at(seen, job.name, 2), 120)
        for _ in range(2):  # each `node add` returns once its node registered
            added.append((await resurge_cli(tmp_path, "node", "add", "--gpus", "1")).strip())
        await watch.wait_for(lambda seen: started_at(seen, job.name, 4), 120)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=add_two_nodes, end_with_during=True,
    )  # fmt: skip

    assert added == ["node-2", "node-3"]
    [grow] = resizes(result, job.name)
    assert (grow.resize, grow.from_replicas, grow.to_replicas) == ("grow", 2, 4), grow.why
    assert world_sizes(result.observed, job.name) == [2, 4]
    assert result.events(FaultDetected) == [] and result.events(RecoveryStarted) == []


async def held_grow(bus: Bus, job: str) -> JobRecord:
    """``job``'s record once it holds a grow back."""
    store = JobStore(await bus.jobs_bucket())
    watcher = await store.kv.watch(store.key(job))
    try:
        async for entry in watcher:
            if entry is not None and entry.value:
                record = JobRecord.from_entry(entry.value)
                if record.held_grow is not None:
                    return record
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped
    raise AssertionError("the record watch ended")


async def test_status_says_why_a_grow_waits_and_until_when(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    snooze = 45  # longer than a node takes to register, so the snooze is what holds it
    job = plain_elastic("snoozer", elastic={"scaleUpSnoozeSeconds": snooze})
    seen: dict[str, object] = {}

    async def crash_then_add_a_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: started_at(seen, job.name, 2), 120)
        await resurge_cli(tmp_path, "inject", "crash", "--job", job.name, "--rank", "1")
        await watch.wait_for(lambda seen: any(isinstance(o.event, RecoveryStarted)
                                              for o in seen))  # fmt: skip
        seen["node"] = (await resurge_cli(tmp_path, "node", "add", "--gpus", "1")).strip()
        seen["record"] = await asyncio.wait_for(held_grow(bus, job.name), 90)
        seen["json"] = json.loads(await resurge_cli(tmp_path, "status", job.name, "--json"))
        seen["described"] = await resurge_cli(tmp_path, "status", job.name)
        await watch.wait_for(lambda seen: started_at(seen, job.name, 3), 120)
        seen["after"] = json.loads(await resurge_cli(tmp_path, "status", job.name, "--json"))

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=300, during=crash_then_add_a_node, end_with_during=True,
    )  # fmt: skip

    record = seen["record"]
    assert isinstance(record, JobRecord) and record.held_grow is not None
    restarted = record.history[-1].time
    until = restarted + timedelta(seconds=snooze)
    assert (record.held_grow.to_replicas, record.held_grow.why) == (
        3, "the snooze after a restart",
    )  # fmt: skip
    assert abs(record.held_grow.until - until) < timedelta(milliseconds=1)  # via float seconds
    status = seen["json"]
    assert isinstance(status, dict)
    assert status["phase"] == "Running"
    assert status["heldGrow"] == {
        "to": 3, "why": "the snooze after a restart",
        "until": record.held_grow.until.isoformat(),
    }  # fmt: skip
    clock = record.held_grow.until.isoformat()[11:19]
    assert f"Waiting: grow to 3 waits for the snooze after a restart until {clock}" in str(
        seen["described"]
    )
    [grow] = resizes(result, job.name)
    assert (grow.resize, grow.from_replicas, grow.to_replicas) == ("grow", 2, 3)
    assert grow.time >= record.held_grow.until, "it grew once the snooze it named was over"
    after = seen["after"]
    assert isinstance(after, dict) and after["heldGrow"] is None
