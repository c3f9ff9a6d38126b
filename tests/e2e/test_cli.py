"""The console scripts as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resurge.jobspec import load_job
from resurge.local.state import StateLock

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCRIPTS = [
    "resurge",
    "resurge-node-agent",
    "resurge-detector",
    "resurge-restarter",
    "resurge-scaler",
]


def run(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_explains_itself(script: str) -> None:
    result = run(script, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:") and "resurge" in result.stdout.lower()
    assert len(result.stdout.split()) > 20


def test_schema_command_writes_every_kind(tmp_path: Path) -> None:
    result = run("resurge", "schema", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    names = {p.name for p in tmp_path.iterdir()}
    assert {"fault_detected.schema.json", "event.schema.json", "TrainingJob.schema.json"} <= names
    assert json.loads((tmp_path / "assign.schema.json").read_text())["title"] == "Assign"


def test_published_schemas_are_current(tmp_path: Path) -> None:
    run("resurge", "schema", "--out", str(tmp_path))
    published = REPO / "docs" / "schemas"
    for fresh in tmp_path.iterdir():
        assert (published / fresh.name).read_text() == fresh.read_text(), (
            f"docs/schemas/{fresh.name} is stale: run `resurge schema`"
        )


def test_submit_rejects_a_bad_spec_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata: {name: x}\nspec: {command: [python], nprocPerNod: 2}\n")
    result = run("resurge", "submit", str(bad))
    assert result.returncode == 2
    assert "spec.nprocPerNod" in result.stderr


def test_submit_and_status_against_a_live_server(nats_url: str, namespace: str) -> None:
    env = {"RESURGE_NATS_URL": nats_url, "RESURGE_NAMESPACE": namespace}
    example = REPO / "examples" / "crash_once" / "job.yaml"
    submitted = run("resurge", "submit", str(example), env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert "crash-once submitted" in submitted.stdout
    # no scaler runs in this namespace, so no record exists: status says so
    status = run("resurge", "status", load_job(example).name, "--json", env=env)
    assert status.returncode == 1 and "no job named 'crash-once'" in status.stderr
    assert run("resurge", "status", "--json", env=env).stdout.strip() == "[]"


def test_events_of_a_job_that_does_not_exist_is_an_error(nats_url: str, namespace: str) -> None:
    env = {"RESURGE_NATS_URL": nats_url, "RESURGE_NAMESPACE": namespace}
    unknown = run("resurge", "events", "--job", "nosuchjob", env=env)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "no job named 'nosuchjob'" in unknown.stderr
    example = REPO / "examples" / "crash_once" / "job.yaml"
    assert run("resurge", "submit", str(example), env=env).returncode == 0
    known = run("resurge", "events", "--job", "crash-once", env=env)  # stored, no record
    assert known.returncode == 0 and "crash-once" in known.stdout, known.stderr


def test_demo_runs_in_the_state_dir_it_is_given(tmp_path: Path) -> None:
    busy = StateLock(tmp_path / "busy")  # as if a cluster ran there: the demo must not
    assert busy.acquire()
    try:
        result = run("resurge", "demo", "--state-dir", str(tmp_path / "busy"), timeout=60)
    finally:
        busy.release()
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"another local cluster runs in {tmp_path / 'busy'}" in result.stderr


def test_commands_without_a_server_fail_clearly() -> None:
    result = run(
        "resurge",
        "status",
        env={"RESURGE_NATS_URL": "nats://127.0.0.1:1", "RESURGE_CONNECT_TIMEOUT_SECONDS": "1"},
    )
    assert result.returncode == 2
    assert "cannot reach nats at nats://127.0.0.1:1 within 1.0 s" in result.stderr


def test_an_unreachable_server_is_reported_after_a_few_seconds_naming_the_setting() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RESURGE_CONNECT_TIMEOUT_SECONDS"}
    result = subprocess.run(
        [str(BIN / "resurge"), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "RESURGE_NATS_URL": "nats://127.0.0.1:1"},
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "cannot reach nats at nats://127.0.0.1:1 within 5.0 s (RESURGE_NATS_URL)" in (
        result.stderr
    )
    assert "nats error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.e2e
def test_demo_passes() -> None:
    result = run("resurge", "demo", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "demo passed" in result.stdout
    assert "detected: process_killed" in result.stdout
    assert "recovered: level process" in result.stdout
    assert "final step 60 of 60" in result.stdout


def without_cluster_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RESURGE_")}


def resurge_in(folder: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "resurge"), *argv], capture_output=True, text=True,
                          timeout=timeout, env=without_cluster_env(), cwd=folder)  # fmt: skip


@pytest.mark.parametrize("command", [["status"], ["node", "list"], ["delete", "j"]])
def test_away_from_any_cluster_a_command_says_so_at_once(
    tmp_path: Path, command: list[str]
) -> None:
    # It used to retry the connection for 30 s; the subprocess timeout (20 s, room for a
    # loaded machine) fails the test if it waits for a cluster again.
    result = resurge_in(tmp_path, *command, timeout=20)
    assert result.returncode == 2
    assert f"no local cluster found in {tmp_path / '.resurge'}" in result.stderr
    for hint in ("resurge up", "--state-dir", "RESURGE_STATE_DIR", "RESURGE_NATS_URL"):
        assert hint in result.stderr


def test_a_cluster_whose_supervisor_is_gone_is_named_stale(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    recorded = {"nats_url": "nats://127.0.0.1:1", "namespace": "resurge", "pid": 999999,
                "nodes": ["node-0"], "gpus_per_node": 1}  # fmt: skip
    (state / "cluster.json").write_text(json.dumps(recorded))
    result = resurge_in(tmp_path, "status", "--state-dir", str(state), timeout=10)
    assert result.returncode == 2
    assert f"the local cluster recorded in {state} is not running" in result.stderr
    assert "pid 999999" in result.stderr and "resurge up" in result.stderr


def test_a_cluster_whose_nats_server_is_gone_is_named_broken(tmp_path: Path) -> None:
    """The supervisor (here a process holding the folder's lock) runs; NATS does not."""
    state = tmp_path / "state"
    state.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
         str(state / "lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        recorded = {"nats_url": "nats://127.0.0.1:1", "namespace": "resurge",
                    "pid": holder.pid, "nodes": ["node-0"], "gpus_per_node": 1}  # fmt: skip
        (state / "cluster.json").write_text(json.dumps(recorded))
        started = time.monotonic()
        result = resurge_in(tmp_path, "--state-dir", str(state), "status", timeout=10)
        assert time.monotonic() - started < 5, "the command waited for the dead server"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    assert result.returncode == 2
    assert f"the local cluster recorded in {state} is broken" in result.stderr
    assert "nats://127.0.0.1:1 does not answer" in result.stderr
    assert "resurge down" in result.stderr and "RESURGE_NATS_URL" in result.stderr


@pytest.mark.e2e
def test_state_dir_goes_before_or_after_the_subcommand(tmp_path: Path) -> None:
    state = tmp_path / "elsewhere"
    up = resurge_in(tmp_path, "up", "--state-dir", str(state), "--nodes", "1", timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert (state / "cluster.json").is_file()
        after = resurge_in(tmp_path, "status", "--json", "--state-dir", str(state))
        before = resurge_in(tmp_path, "--state-dir", str(state), "status", "--json")
        assert after.returncode == before.returncode == 0, after.stderr + before.stderr
        assert json.loads(after.stdout) == json.loads(before.stdout) == []
        nodes = resurge_in(tmp_path, "node", "list", "--json", "--state-dir", str(state))
        assert [n["name"] for n in json.loads(nodes.stdout)] == ["node-0"]
    finally:
        down = resurge_in(tmp_path, "down", "--state-dir", str(state))
    assert down.returncode == 0 and "resurge is down" in down.stdout
    assert not (state / "cluster.json").exists()
