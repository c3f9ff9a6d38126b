"""The supervisor's services: replicas of the restarter and the scaler as asked, and a
child's own variables (``child_env``) over the ones every child gets, so a bench can
point one service at a NATS URL of its own."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nats.errors
import pytest

from resurge.local.node_set import NodeEntry
from resurge.local.supervisor import Supervisor, _checked, _Child
from resurge.worker.snapshot_folder import node_memory


def test_two_restarters_and_two_scalers_share_their_roles(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, nats_url="nats://127.0.0.1:4222", restarters=2, scalers=2)
    services = supervisor._services()
    assert sorted(services) == ["detector", "restarter", "restarter-2", "scaler", "scaler-2"]
    assert services["scaler-2"].role == "scaler"
    assert services["scaler-2"].argv == services["scaler"].argv
    assert services["restarter-2"].role == "restarter"


def test_a_child_gets_its_own_nats_url_and_the_others_the_common_one(tmp_path: Path) -> None:
    own = "nats://127.0.0.1:14222"
    common = "nats://127.0.0.1:4222"
    supervisor = Supervisor(
        tmp_path, nats_url=common, child_env={"detector": {"RESURGE_NATS_URL": own}}
    )
    supervisor.log_dir.mkdir()
    show = [sys.executable, "-c", "import os; print(os.environ['RESURGE_NATS_URL'])"]
    for name in ("detector", "scaler"):
        child = supervisor.children[name] = _Child(name, show, role=name)
        supervisor._spawn(child)
        assert child.process is not None
        assert child.process.wait(timeout=30) == 0
    assert (supervisor.log_dir / "detector.log").read_text().strip() == own
    assert (supervisor.log_dir / "scaler.log").read_text().strip() == common


def test_a_check_that_fails_is_logged_and_the_supervisor_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a fresh-clone CI run a check's probe connection ended in nats.py's
    # FlushTimeoutError, and the supervisor, with the record commands find it by, was gone.
    supervisor = Supervisor(tmp_path, nats_url="nats://127.0.0.1:4222")

    def check() -> bool:
        raise nats.errors.FlushTimeoutError

    monkeypatch.setattr(supervisor, "check", check)

    assert _checked(supervisor) is True  # the record is written again, as after a change
    assert "a check of the local cluster failed; trying again" in caplog.text


def test_a_node_powered_off_loses_its_memory(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, nats_url="nats://127.0.0.1:4222")
    node = NodeEntry("node-1", gpus=1)
    supervisor.children["node-1"] = _Child("node-1", ["true"], node=node)
    memory = node_memory("node-1", tmp_path)
    (memory / "job-0-0-abc" / "replicated").mkdir(parents=True)
    other = node_memory("node-0", tmp_path)
    other.mkdir(parents=True)
    try:
        supervisor._power_off("node-1")

        assert not memory.exists()  # its snapshots went with its power
        assert other.is_dir()  # another node's stay
    finally:
        shutil.rmtree(memory.parent, ignore_errors=True)
