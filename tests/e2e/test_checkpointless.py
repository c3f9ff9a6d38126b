"""Checkpointless recovery end to end: the DDP example (examples/ddp, 2 replicas x 1 gloo
worker, a disk checkpoint every 10 steps) registers its model and optimizer with
``run.protect`` and snapshots them to its nodes' memory every step, on a real local
cluster.

Two ranks, so that "the same result" can mean bit for bit: DDP rebuilds its gradient
buckets after the first step of every generation, so at 3 ranks or more a resumed
generation's first step sums gradients in another order than an uninterrupted run's
(from the disk as from memory: the losses agree to 6 decimals, the bytes do not).

- A rank SIGKILLed in the middle of a checkpoint interval (process rung): the job goes on
  from the step of the fault (at most the step it was in is trained again; from the disk
  it would be 5) and ends with the parameters of an uninterrupted run, bit for bit.
- An exception raised in a rank (in-process rung: no process restarts) and a replica's
  agent SIGKILLed (pod rung: its worker group recreated, its memory gone, when the
  restarter judges the lost agent first): the same, each rank's state from where it is
  live.
- A node SIGKILLed (its processes and its memory gone; the replica moves to a spare
  node): the moved ranks take the step from their peers' memory, with the same result.
- Both nodes lost at once: nothing is live, the job falls back to the newest complete
  disk checkpoint (and trains the rest of the interval again), not to a mix.
- The FSDP example (examples/fsdp: each rank a shard of the model, its buddy on the other
  node holding a copy): a node SIGKILLed mid-interval, its rank moves and takes its shard
  from the buddy's memory, bit-identical to an uninterrupted run.
- Elastic without the disk: a grow (a node added) hands the new rank the survivors' step
  from their memory, and a shrink (a node removed) goes on from the survivors' own; no
  checkpoint is asked for first, and at most the step in flight is trained again.

Scripts that never import resurge cannot register state: they resume from the disk as
before (tests/e2e/test_recovery_ladder.py and the plain-script tests cover them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from resurge.control.effects.client import inject_fault
from resurge.events import (
    AgentStateChanged,
    Assign,
    CheckpointSaved,
    JobPhase,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
    StateRestored,
)
from resurge.jobspec import EnvVar, TrainingJob, load_job
from resurge.local.demo import final_step, steps_lost, total_steps
from resurge.local.job_factory import ddp_example_job
from resurge.local.story import Observed, StoryResult, Watch, run_job
from resurge.runtime.bus import Bus
from tests.e2e.test_elastic import (
    elastic_ddp,
    final_step_seen,
    resizes,
    resurge_cli,
    stepping_at,
    world_sizes,
)
from tests.e2e.test_example_ddp import Finished, free_port, train, worker_env

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EVERY = 10  # the example job's --checkpoint-every


def demo_job(state_dir: Path) -> TrainingJob:
    """The example job, one worker per replica (a world of 2)."""
    return ddp_example_job(state_dir / "ckpt", nproc_per_node=1)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The example job's run without a fault, as torchrun starts it."""
    root = tmp_path_factory.mktemp("uninterrupted")
    command = demo_job(root).spec.command
    steps = str(total_steps(demo_job(root)))
    assert command[command.index("--checkpoint-every") + 1] == str(EVERY)
    args = ["--steps", steps, "--checkpoint-every", str(EVERY), "--checkpoint-dir", str(root / "c")]
    return train(root, args, world=2)


def mid_interval(seen: list[Observed]) -> bool:
    """Generation 0 trained to the middle of its second checkpoint interval."""
    steps = [o.event.step for o in seen if isinstance(o.event, Progress)]
    return max(steps, default=0) >= EVERY + EVERY // 2


def digest(state_dir: Path) -> str:
    """The params-sha256 rank 0 printed at the end (in its replica's agent log)."""
    [line] = [
        line
        for log in sorted((state_dir / "logs").glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "params-sha256 " in line
    ]
    return line.rsplit("params-sha256 ", 1)[1].split()[0]


def replica_node(seen: list[Observed], replica: int) -> str:
    nodes = {
        o.event.node
        for o in seen
        if isinstance(o.event, Progress) and o.event.replica == replica and o.event.node
    }
    [node] = nodes
    return node


def check(result: StoryResult, state_dir: Path, reference: Finished, most_lost: int) -> None:
    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(demo_job(state_dir))
    assert len(result.events(RecoveryFinished)) == 1
    [lost] = steps_lost(result)
    assert 0 <= lost <= most_lost, f"{lost} step(s) trained again"
    assert digest(state_dir) == reference.value("params-sha256")


async def test_a_rank_killed_mid_interval_goes_on_from_the_step_of_the_fault(
    nats_url: str, namespace: str, tmp_path: Path, uninterrupted: Finished
) -> None:
    job = demo_job(tmp_path)

    async def kill(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(mid_interval, wait_seconds=120)
        await inject_fault(bus, job.name, 1, "crash")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=kill,
    )  # fmt: skip

    check(result, tmp_path, uninterrupted, most_lost=1)
    assert origins(result, 1) == {0: "memory", 1: "memory"}  # both nodes kept theirs


async def test_an_exception_restarts_in_process_from_the_ranks_own_memory(
    nats_url: str, namespace: str, tmp_path: Path, uninterrupted: Finished
) -> None:
    job = demo_job(tmp_path)

    async def raise_in_rank_1(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(mid_interval, wait_seconds=120)
        await inject_fault(bus, job.name, 1, "exception")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=raise_in_rank_1,
    )  # fmt: skip

    check(result, tmp_path, uninterrupted, most_lost=1)
    [recovery] = result.events(RecoveryFinished)
    assert recovery.level is RecoveryLevel.IN_PROCESS
    assert origins(result, 1) == {0: "memory", 1: "memory"}


async def test_a_killed_agent_s_ranks_resume_from_where_their_state_is_live(
    nats_url: str, namespace: str, tmp_path: Path, uninterrupted: Finished
) -> None:
    job = demo_job(tmp_path)

    async def kill_agent_of_replica_1(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(mid_interval, wait_seconds=120)
        [agent] = {o.event.source.instance for o in watch.observed
                   if isinstance(o.event, AgentStateChanged) and o.event.replica == 1}  # fmt: skip
        os.kill(int(agent.rsplit(":", 1)[1]), signal.SIGKILL)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=kill_agent_of_replica_1,
    )  # fmt: skip

    check(result, tmp_path, uninterrupted, most_lost=1)
    [recovery] = result.events(RecoveryFinished)
    # As in test_agent_killed: the lost agent's replica recreated (pod: a new worker group,
    # an empty memory) or, judged first, replica 0's failed collective (process: the
    # monitor starts the agent again, and its group's memory is as it was).
    if recovery.level is RecoveryLevel.POD:
        assert origins(result, recovery.generation or 0) == {0: "memory", 1: "peer"}
    else:
        assert set(origins(result, recovery.generation or 0).values()) == {"memory"}


def origins(result: StoryResult, generation: int) -> dict[int, str]:
    """Rank -> where it took its state from as ``generation`` began (its report)."""
    return {
        e.rank: e.origin
        for e in result.events(StateRestored)
        if e.generation == generation and e.rank is not None
    }


def node_killer(
    nodes: Callable[[list[Observed]], list[str]],
) -> Callable[[Bus, Watch], Coroutine[Any, Any, None]]:
    async def kill(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(mid_interval, wait_seconds=120)
        assert watch.supervisor is not None
        for node in nodes(watch.observed):
            assert watch.supervisor.fail_node(node), "the node had processes to kill"

    return kill


async def test_a_node_killed_mid_interval_moves_and_takes_the_step_from_its_peers(
    nats_url: str, namespace: str, tmp_path: Path, uninterrupted: Finished
) -> None:
    result = await run_job(
        demo_job(tmp_path), state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
        nodes=3, gpus_per_node=1, wait_seconds=240,
        during=node_killer(lambda seen: [replica_node(seen, 1)]),
    )  # fmt: skip

    check(result, tmp_path, uninterrupted, most_lost=1)
    last = max(result.events(StateRestored), key=lambda e: e.generation or 0).generation
    assert last is not None and origins(result, last) == {0: "memory", 1: "peer"}


async def test_both_nodes_lost_fall_back_to_the_disk_checkpoint(
    nats_url: str, namespace: str, tmp_path: Path, uninterrupted: Finished
) -> None:
    result = await run_job(
        demo_job(tmp_path), state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
        nodes=4, gpus_per_node=1, wait_seconds=240,
        during=node_killer(lambda seen: [replica_node(seen, 0), replica_node(seen, 1)]),
    )  # fmt: skip

    check(result, tmp_path, uninterrupted, most_lost=EVERY)
    [lost] = steps_lost(result)
    assert lost >= EVERY // 2  # back to the step-10 checkpoint: the rest of the interval again


def resize_lost(result: StoryResult, job: str) -> list[int]:
    """Per resize: the steps trained again (the old generation's last step less the new
    one's first step, less one)."""
    lost = []
    for decided in resizes(result, job):
        before = [
            e.step for e in result.events(Progress) if e.generation == decided.from_generation
        ]
        after = [e.step for e in result.events(Progress) if e.generation == decided.to_generation]
        lost.append(max(before) - (min(after) - 1))
    return lost


def no_checkpoint_asked(result: StoryResult, every: int) -> bool:
    """Every disk checkpoint was a periodic one (a requested one lands between)."""
    return all(e.step % every == 0 for e in result.events(CheckpointSaved))


async def test_a_grow_hands_the_new_rank_its_state_from_the_survivors_memory(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = elastic_ddp(tmp_path, 300, step_seconds=0.1)

    async def add_a_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 2), 120)
        await watch.wait_for(lambda seen: final_step_seen(seen) >= EVERY + EVERY // 2)
        await resurge_cli(tmp_path, "node", "add", "--gpus", "1")
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 3), 120)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=add_a_node,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert world_sizes(result.observed, job.name) == [2, 3]
    assert [lost <= 1 for lost in resize_lost(result, job.name)] == [True]
    assert no_checkpoint_asked(result, EVERY)
    grown = max(e.generation for e in result.events(Assign))
    # Ranks go by the replicas' order, so which rank is the new one depends on the
    # replica number the grow gave it; every rank took a live copy, the new from a peer.
    taken = origins(result, grown)
    assert len(taken) == 3 and set(taken.values()) == {"memory", "peer"}, taken
    assert len({e.step for e in result.events(StateRestored) if e.generation == grown}) == 1


async def test_a_shrink_goes_on_from_the_survivors_memory(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = elastic_ddp(tmp_path, 300, step_seconds=0.1)

    async def remove_a_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 3), 120)
        await watch.wait_for(lambda seen: final_step_seen(seen) >= EVERY + EVERY // 2)
        await resurge_cli(tmp_path, "node", "remove", "node-1", "--timeout", "90")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=3,
        gpus_per_node=1, wait_seconds=240, during=remove_a_node,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert world_sizes(result.observed, job.name) == [3, 2]
    assert [lost <= 1 for lost in resize_lost(result, job.name)] == [True]
    assert no_checkpoint_asked(result, EVERY)
    shrunk = max(e.generation for e in result.events(Assign))
    assert set(origins(result, shrunk).values()) == {"memory"}


FSDP = REPO / "examples" / "fsdp" / "job.yaml"


def fsdp_job(state_dir: Path) -> TrainingJob:
    example = load_job(FSDP)
    env = [*example.spec.env, EnvVar(name="RESURGE_CHECKPOINT_DIR", value=str(state_dir / "c"))]
    update = {"env": env, "working_dir": str(REPO)}
    return example.model_copy(update={"spec": example.spec.model_copy(update=update)})


def fsdp_uninterrupted(root: Path, steps: int) -> str:
    """params-sha256 of the FSDP example run without a fault, 2 ranks as torchrun starts them."""
    port = free_port()
    script = REPO / "examples" / "fsdp" / "train_fsdp.py"
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), "--steps", str(steps), "--checkpoint-dir", str(root)],
            env=worker_env(rank, port, {}),
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    [line] = [text for text in outputs[0].splitlines() if text.startswith("params-sha256 ")]
    return line.split()[1]


async def test_fsdp_a_node_killed_mid_interval_takes_its_shard_from_the_buddy(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = fsdp_job(tmp_path)
    steps = total_steps(job)
    reference = fsdp_uninterrupted(tmp_path / "reference", steps)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=3,
        gpus_per_node=1, wait_seconds=240,
        during=node_killer(lambda seen: [replica_node(seen, 1)]),
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == steps
    [lost] = steps_lost(result)
    assert 0 <= lost <= 1, f"{lost} step(s) trained again"
    last = max(result.events(StateRestored), key=lambda e: e.generation or 0).generation
    assert last is not None and origins(result, last) == {0: "memory", 1: "peer"}
    assert digest(tmp_path) == reference


async def test_fsdp_a_shrink_re_cuts_the_shards_from_memory_without_a_checkpoint(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = fsdp_job(tmp_path).model_dump(mode="json", by_alias=True, exclude_none=True)
    command = spec["spec"]["command"]
    command[command.index("--steps") + 1] = "300"
    command[command.index("--step-seconds") + 1] = "0.1"
    spec["spec"]["replicas"]["min"] = 1
    spec["spec"]["elastic"] = {"cooldownSeconds": 1}
    job = TrainingJob.model_validate(spec)

    async def remove_a_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: stepping_at(seen, job.name, 2), 120)
        await watch.wait_for(lambda seen: final_step_seen(seen) >= EVERY + EVERY // 2)
        await resurge_cli(tmp_path, "node", "remove", "node-1", "--timeout", "90")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=240, during=remove_a_node,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert world_sizes(result.observed, job.name) == [2, 1]
    assert [lost <= 1 for lost in resize_lost(result, job.name)] == [True]
    assert no_checkpoint_asked(result, EVERY)  # FSDP2's shards said they can be re-cut
    shrunk = max(e.generation for e in result.events(Assign))
    [restored] = [e for e in result.events(StateRestored) if e.generation == shrunk]
    # The survivor holds its own shard and its buddy copy of the removed rank's.
    assert restored.origin == "memory" and restored.reshardable, restored
    assert "re-cut from 2 shards (0 from peers, 2 in this node's memory)" in restored.detail
