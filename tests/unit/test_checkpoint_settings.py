"""spec.checkpoint reaches the workers: the worker group carries it, the agent turns it
into environment variables (a folder of the job's own by default), and resurge.worker
reads them (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resurge import worker
from resurge.control.decisions.admission import update_live
from resurge.control.decisions.worker_groups import worker_groups
from resurge.control.state.records import JobRecord, Placement
from resurge.events import JobPhase
from resurge.local import job_factory
from resurge.worker.environment import (
    CHECKPOINT_DIR,
    CHECKPOINT_INTERVAL_SECONDS,
    CHECKPOINT_INTERVAL_STEPS,
    SNAPSHOT_BUDGET_BYTES,
    SNAPSHOT_DIR,
    SNAPSHOT_INTERVAL_STEPS,
    default_checkpoint_dir,
    read_environment,
)
from resurge.worker.snapshot_folder import node_memory
from resurge_node_agent.launch.worker_env import checkpoint_environment, snapshot_folder


def record(name: str, checkpoint: dict[str, Any] | None = None) -> JobRecord:
    extra: dict[str, Any] = {} if checkpoint is None else {"checkpoint": checkpoint}
    spec = job_factory.job(name, preload=None, **extra)
    return JobRecord(name=name, spec=spec, placements=[Placement(replica=0, node="n")])


def test_the_spec_s_checkpoint_settings_reach_the_workers_environment() -> None:
    checkpoint = {
        "dir": "/ckpt/a",
        "intervalSteps": 10,
        "intervalSeconds": 1.5,
        "memoryIntervalSteps": 2,
        "memoryBudget": "8Gi",
    }
    [group] = worker_groups(record("a", checkpoint))
    env = checkpoint_environment(group, {"RESURGE_STATE_DIR": "/state"})
    assert env == {
        CHECKPOINT_DIR: "/ckpt/a",
        CHECKPOINT_INTERVAL_STEPS: "10",
        CHECKPOINT_INTERVAL_SECONDS: "1.5",
        SNAPSHOT_DIR: str(snapshot_folder(group, {"RESURGE_STATE_DIR": "/state"})),
        SNAPSHOT_INTERVAL_STEPS: "2",
        SNAPSHOT_BUDGET_BYTES: str(8 * 2**30),
    }
    read = read_environment(env)
    assert (read.checkpoint_dir, read.checkpoint_interval_steps) == ("/ckpt/a", 10)
    assert read.checkpoint_interval_seconds == 1.5
    assert read.snapshot_interval_steps == 2
    assert read.snapshot_budget_bytes == 8 * 2**30


@pytest.mark.parametrize(
    ("budget", "variable"), [("512Mi", "536870912"), ("1G", "1000000000"), (1500, "1500")]
)
def test_the_memory_budget_reaches_the_workers_in_bytes(budget: object, variable: str) -> None:
    [group] = worker_groups(record("a", {"memoryBudget": budget}))
    assert group.memory_budget_bytes == int(variable)
    env = checkpoint_environment(group, {})
    assert env[SNAPSHOT_BUDGET_BYTES] == variable
    assert read_environment(env).snapshot_budget_bytes == int(variable)


def test_without_a_memory_budget_the_workers_get_none() -> None:
    [group] = worker_groups(record("a", {"memoryIntervalSteps": 2}))
    assert group.memory_budget_bytes is None
    env = checkpoint_environment(group, {})
    assert SNAPSHOT_BUDGET_BYTES not in env
    assert read_environment(env).snapshot_budget_bytes is None


def test_each_worker_group_snapshots_into_its_own_folder_of_its_node_s_memory() -> None:
    [a], [b] = worker_groups(record("a")), worker_groups(record("b"))
    local = {"RESURGE_STATE_DIR": "/state"}
    folder = Path(checkpoint_environment(a, local)[SNAPSHOT_DIR])
    assert folder.parent == node_memory("n", "/state")  # the local cluster's node n
    assert folder.name.startswith(f"a-0-{a.incarnation}-")
    assert checkpoint_environment(b, local)[SNAPSHOT_DIR] != str(folder)
    assert SNAPSHOT_INTERVAL_STEPS not in checkpoint_environment(a, local)  # every step
    # Elsewhere (a Kubernetes pod): its own /dev/shm.
    assert checkpoint_environment(a, {})[SNAPSHOT_DIR].startswith("/dev/shm/resurge/n/a-0-")
    recreated = a.model_copy(update={"incarnation": a.incarnation + 1})
    assert snapshot_folder(recreated, local) != snapshot_folder(a, local)  # a new pod


def test_without_a_dir_each_job_gets_a_folder_of_its_own() -> None:
    [a], [b] = worker_groups(record("a")), worker_groups(record("b"))
    local = {"RESURGE_STATE_DIR": "/state"}
    assert checkpoint_environment(a, local)[CHECKPOINT_DIR] == "/state/checkpoints/a"
    assert checkpoint_environment(b, local)[CHECKPOINT_DIR] == "/state/checkpoints/b"
    # Elsewhere (a Kubernetes pod): in the working directory, still the job's own.
    assert checkpoint_environment(a, {})[CHECKPOINT_DIR] == "checkpoints/a"
    assert default_checkpoint_dir("a", Path("/state")) == "/state/checkpoints/a"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_interval_names_its_variable(value: str) -> None:
    with pytest.raises(ValueError, match=CHECKPOINT_INTERVAL_SECONDS):
        read_environment({CHECKPOINT_INTERVAL_SECONDS: value})


@pytest.mark.parametrize("value", ["-1", "8Gi", "1.5"])
def test_a_bad_budget_names_its_variable(value: str) -> None:
    with pytest.raises(ValueError, match=SNAPSHOT_BUDGET_BYTES):
        read_environment({SNAPSHOT_BUDGET_BYTES: value})


def test_checkpoint_due_follows_the_step_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RESURGE_AGENT_SOCKET", CHECKPOINT_INTERVAL_SECONDS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(CHECKPOINT_DIR, "/ckpt/j")
    monkeypatch.setenv(CHECKPOINT_INTERVAL_STEPS, "5")
    run = worker.connect()
    assert run.checkpoint_dir == "/ckpt/j"
    assert [step for step in range(1, 16) if run.checkpoint_due(step)] == [5, 10, 15]
    monkeypatch.delenv(CHECKPOINT_INTERVAL_STEPS)
    assert not any(worker.connect().checkpoint_due(step) for step in range(1, 16))


def test_a_running_job_submitted_again_keeps_its_memory_budget() -> None:
    """As every field of spec.checkpoint: fixed once the job exists (the scaler's
    update_live; on Kubernetes the CRD refuses the edit)."""
    running = record("a", {"memoryBudget": "8Gi"})
    running.phase = JobPhase.RUNNING
    update_live(running, job_factory.job("a", preload=None, checkpoint={"memoryBudget": "16Gi"}))
    [group] = worker_groups(running)
    assert group.memory_budget_bytes == 8 * 2**30
