"""The environment the agent gives a worker: torchrun's variables plus resurge's own.

An unmodified torchrun script reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... and
runs; a script that uses ``resurge.worker`` also finds its generation, its agent's
socket and the checkpoint to resume from (names in :mod:`resurge.worker.environment`).
:func:`checkpoint_environment` hands every worker its job's ``spec.checkpoint``: where
(the spec's ``dir``, else ``checkpoints/<job>`` in the local cluster's state folder,
``RESURGE_STATE_DIR``, or in the working directory elsewhere) and how often, and where,
how often and within how many bytes protected state is snapshotted to memory
(:func:`snapshot_folder`). Every rank is a client of the rendezvous store its agents host
(``TORCHELASTIC_USE_AGENT_STORE=True``, as under torchrun's agent); the launcher sets it
``False`` where rank 0's script is to host the store itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import Assign
from resurge.worker.environment import (
    AGENT_SOCKET,
    CHECKPOINT_DIR,
    CHECKPOINT_INTERVAL_SECONDS,
    CHECKPOINT_INTERVAL_STEPS,
    GENERATION,
    JOB,
    RESUME_CHECKPOINT,
    RESUME_STEP,
    SNAPSHOT_BUDGET_BYTES,
    SNAPSHOT_DIR,
    SNAPSHOT_INTERVAL_STEPS,
    default_checkpoint_dir,
)
from resurge.worker.snapshot_folder import node_memory

__all__ = ["AGENT_STORE_ENV", "checkpoint_environment", "snapshot_folder", "worker_environment"]

# torch's env:// rendezvous: "True" makes every rank, rank 0 too, a client of the store
# its agent hosts (torch.distributed.rendezvous._torchelastic_use_agent_store).
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


def checkpoint_environment(spec: WorkerGroupSpec, agent: Mapping[str, str]) -> dict[str, str]:
    """Where and how often the workers of ``spec`` checkpoint; ``agent``: the agent's own
    environment (its ``RESURGE_STATE_DIR`` on a local cluster)."""
    folder = spec.checkpoint_dir or default_checkpoint_dir(
        spec.job, agent.get("RESURGE_STATE_DIR") or None
    )
    env = {CHECKPOINT_DIR: folder}
    if spec.checkpoint_interval_steps is not None:
        env[CHECKPOINT_INTERVAL_STEPS] = str(spec.checkpoint_interval_steps)
    if spec.checkpoint_interval_seconds is not None:
        env[CHECKPOINT_INTERVAL_SECONDS] = repr(spec.checkpoint_interval_seconds)
    env[SNAPSHOT_DIR] = str(snapshot_folder(spec, agent))
    if spec.memory_interval_steps is not None:
        env[SNAPSHOT_INTERVAL_STEPS] = str(spec.memory_interval_steps)
    if spec.memory_budget_bytes is not None:
        env[SNAPSHOT_BUDGET_BYTES] = str(spec.memory_budget_bytes)
    return env


def snapshot_folder(spec: WorkerGroupSpec, agent: Mapping[str, str]) -> Path:
    """The worker group's folder in its node's memory, its own for its life (an agent
    recreated, as a pod is, gets a new one): where protected state is snapshotted."""
    memory = node_memory(spec.node, agent.get("RESURGE_STATE_DIR") or None)
    return memory / f"{spec.job}-{spec.replica}-{spec.incarnation}-{spec.uid[:12]}"


def worker_environment(
    assign: Assign, local_rank: int, agent_socket: str | None = None
) -> dict[str, str]:
    """Variables for local rank ``local_rank`` of ``assign.replica``; merge over os.environ."""
    slot = assign.slot(assign.replica)
    assert slot is not None  # the agent checks its slot when the Assign comes
    env = {
        "RANK": str(slot.first_rank + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(assign.world_size),
        "LOCAL_WORLD_SIZE": str(slot.nproc),
        "GROUP_RANK": str(slot.replica),
        "GROUP_WORLD_SIZE": str(assign.group_world_size),
        "ROLE_RANK": str(slot.first_rank + local_rank),
        "ROLE_WORLD_SIZE": str(assign.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": assign.master_addr,
        "MASTER_PORT": str(assign.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(assign.restart_count),
        "TORCHELASTIC_RUN_ID": f"{assign.job}-g{assign.generation}",
        AGENT_STORE_ENV: "True",
        "PYTHONUNBUFFERED": "1",
        GENERATION: str(assign.generation),
        JOB: assign.job or "",
    }
    if agent_socket:
        env[AGENT_SOCKET] = agent_socket
    if assign.resume_checkpoint:
        env[RESUME_CHECKPOINT] = assign.resume_checkpoint
    if assign.resume_step is not None:
        env[RESUME_STEP] = str(assign.resume_step)
    return env
