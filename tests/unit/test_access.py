"""The NATS permissions of each role, as data (the server enforces them:
tests/integration/test_bus_auth.py)."""

from __future__ import annotations

import pytest

from resurge.access.permissions import DETECTOR_STATE_BUCKET, ROLES, agent_user, role_permissions
from resurge.contract.subjects import Subjects
from resurge.runtime.nats_auth import Credentials, CredentialsError, connect_options
from resurge.runtime.settings import Settings
from resurge_detector.state_store import STATE_BUCKET

S = Subjects("ns")


def test_the_detectors_bucket_is_the_one_its_permissions_name() -> None:
    assert DETECTOR_STATE_BUCKET == STATE_BUCKET


def test_a_node_agent_publishes_raw_subjects_of_its_node_and_writes_its_record() -> None:
    agent = role_permissions("agent", S, "node.a")
    raw = [p for p in agent.publish if p.startswith("ns.v1.")]
    assert raw == ["ns.v1.raw.*.*.node_2ea", "ns.v1.dlq.node-agent", "ns.v1.dlq.node-monitor"]
    assert "$KV.ns_nodes.node_2ea" in agent.publish
    # Commands: live on their subjects, stored ones by direct gets of the cmd stream;
    # consumers only on the node's own node-level commands (the monitor's).
    assert agent.subscribe == ("_INBOX_agent-node_2ea.>", "ns.v1.cmd.*.*")
    assert "$JS.API.DIRECT.GET.NS_CMD" in agent.publish
    assert "$JS.API.DIRECT.GET.NS_CMD.ns.v1.cmd.*.*" in agent.publish
    creates = [p for p in agent.publish if ".CONSUMER.CREATE.NS_CMD" in p]
    assert creates == ["$JS.API.CONSUMER.CREATE.NS_CMD.*.ns.v1.cmd._.node_2ea"]
    # Its command positions: the node's own keys only.
    positions = [p for p in agent.publish if "agent_positions" in p and "INFO" not in p]
    assert positions == [
        "$JS.API.DIRECT.GET.KV_ns_agent_positions.$KV.ns_agent_positions.node_2ea.>",
        "$KV.ns_agent_positions.node_2ea.>",
    ]
    # Kubernetes: one agent user for every node.
    assert "ns.v1.raw.*.*.*" in role_permissions("agent", S).publish
    assert agent_user(None) == "agent"


@pytest.mark.parametrize("role", ROLES)
def test_only_restarter_scaler_and_admin_publish_commands(role: str) -> None:
    publish = role_permissions(role, S).publish
    commands = [p for p in publish if p.startswith("ns.v1.cmd")]
    assert bool(commands) == (role in ("restarter", "scaler", "admin"))


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_delete_or_purge_a_stream_nor_read_others_inboxes(role: str) -> None:
    permissions = role_permissions(role, S)
    for subject in permissions.publish:
        assert ".STREAM.DELETE." not in subject and ".STREAM.PURGE." not in subject
        assert not subject.startswith(("$JS.API.>", ">", "ns.v1.>"))
    inboxes = [s for s in permissions.subscribe if s.startswith("_INBOX")]
    assert inboxes == [f"_INBOX_{agent_user(None) if role == 'agent' else role}.>"]


def test_the_viewer_publishes_only_read_requests() -> None:
    for subject in role_permissions("viewer", S).publish:
        assert subject.startswith(
            ("$JS.API.STREAM.INFO.", "$JS.API.DIRECT.GET.", "$JS.API.STREAM.MSG.GET.")
        ) or subject.startswith(("$JS.API.CONSUMER.", "$JS.FC.")), subject  # FC: reading back
        assert "CONSUMER.CREATE" not in subject or subject.count(".") == 4  # ephemeral only


def test_a_user_and_password_from_settings_name_the_inbox() -> None:
    options = connect_options(Settings(nats_user="viewer", nats_password="pw"))
    assert options == {"user": "viewer", "password": "pw", "inbox_prefix": "_INBOX_viewer"}
    assert connect_options(Settings()) == {}
    with pytest.raises(CredentialsError):
        Credentials("a.b", "pw")
    assert "pw" not in repr(Credentials("viewer", "pw"))
