"""``resurge node describe``, ``node list`` and ``node uncordon`` against a real
nats-server: the restarter's node ledger counts XIDs against a node of the local
backend (its health record, its cordon), then the command (``main``, as a user runs it
with ``RESURGE_NATS_URL``) shows the score, the quarantine and the history, and
uncordon releases the quarantine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from resurge.cli.main import main
from resurge.cluster import ClusterBackend, NodeInfo, open_backend
from resurge.control.decisions.node_score import NodePolicy
from resurge.control.state.node_health import NodeHealthStore
from resurge.control.state.records import JobStore
from resurge.events import FaultDetected, FaultScope, Source
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.node_ledger import NodeLedger

DETECTOR = Source(service="detector", instance="d")


def xid48(job: str, minutes: float, node: str = "n1") -> FaultDetected:
    return FaultDetected(
        source=DETECTOR,
        time=datetime.now(UTC) + timedelta(minutes=minutes),
        fault_id=f"gpu:{node}:0:48:{job}:{minutes}",
        scope=FaultScope.NODE,
        reason="gpu_xid",
        message=f"XID 48 (double-bit ECC error) on GPU 0 of {node}",
        evidence={"node": node, "xid": 48, "action": "reset_gpu"},
        job=job,
        node=node,
    )


@pytest.fixture
async def backend(bus: Bus, settings: Settings) -> ClusterBackend:
    opened = await open_backend(bus, settings.model_copy(update={"cluster": "local"}))
    for name in ("n1", "n2"):
        await opened.report_node(
            NodeInfo(name=name, slots=2, heartbeat=datetime.now(UTC), labels={"pool": "a"})
        )
    return opened


@pytest.fixture
async def ledger(
    bus: Bus, settings: Settings, backend: ClusterBackend, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[NodeLedger]:
    """The restarter's ledger over the backend, and ``main`` pointed at the same bus."""
    monkeypatch.setenv("RESURGE_NATS_URL", settings.nats_url)
    monkeypatch.setenv("RESURGE_NAMESPACE", settings.namespace)
    kv = await bus.node_health_bucket()
    assert kv is not None
    async with AsyncExitStack() as stack:
        ctx = ServiceContext("restarter", settings, bus, CollectorRegistry(), stack)

        async def no_move(fault: FaultDetected) -> None:
            raise AssertionError(f"no job runs on {fault.node}: nothing to move")

        jobs = JobStore(await bus.jobs_bucket())
        yield NodeLedger(ctx, backend, NodeHealthStore(kv), jobs, no_move, NodePolicy())


async def resurge(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``resurge ARGV`` in a thread of its own (it runs its own event loop)."""
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_describe_shows_the_quarantine_and_the_history_list_the_scores(
    ledger: NodeLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    for job, minutes in (("a", 0), ("b", 10), ("a", 20)):
        await ledger.on_fault(xid48(job, minutes))

    code, out, err = await resurge(capsys, "node", "describe", "n1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "Node:         n1"
    [state] = [line for line in lines if line.startswith("State:")]
    assert "cordoned (quarantined: score" in state and "3 x xid_takes_gpu_out" in state
    [score] = [line for line in lines if line.startswith("Score:")]
    assert "(quarantine at 2.5, RESURGE_NODE_QUARANTINE=enforce; halves every 24 hours)" in score
    assert "              why: 3 x xid_takes_gpu_out (jobs a, b)" in lines
    assert "              jobs moved off: none" in lines  # no job ran on it
    history = lines[lines.index("Faults counted: 3 in all, newest first") + 1 :]
    assert [line.rsplit("job ", 1)[1] for line in history[::2]] == ["a", "b", "a"]
    assert history[1] == "      XID 48 (double-bit ECC error) on GPU 0 of n1"

    code, out, err = await resurge(capsys, "node", "describe", "n1", "--json")
    view = json.loads(out)
    assert code == 0 and view["name"] == "n1" and view["cordoned"] and view["inCluster"]
    assert 2.5 <= view["score"] <= 3 and view["counted"] == 3
    assert [i["rule"] for i in view["incidents"]] == ["xid_takes_gpu_out"] * 3
    assert view["quarantine"]["why"] == "3 x xid_takes_gpu_out (jobs a, b)"

    code, out, err = await resurge(capsys, "node", "list", "--json")
    listed = {v["name"]: v for v in json.loads(out)}
    assert code == 0 and listed["n2"]["score"] == 0 and listed["n2"]["quarantine"] is None
    assert listed["n1"]["quarantine"]["dryRun"] is False
    assert 2.5 <= listed["n1"]["score"] <= view["score"]  # decayed a little since
    assert {"slots", "free", "healthy", "cordoned", "jobs", "labels"} <= set(listed["n1"])
    code, out, err = await resurge(capsys, "node", "list")
    [n1, n2] = out.splitlines()
    assert n1.startswith("n1 ") and "(quarantined)  labels: pool=a" in n1
    assert n2.startswith("n2 ") and "ready  jobs: -  score: 0  labels: pool=a" in n2


async def test_a_node_with_no_faults_scores_0_and_an_unknown_one_is_an_error(
    ledger: NodeLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await resurge(capsys, "node", "describe", "n2")
    assert code == 0, err
    assert "Score:        0, no faults counted" in out and "Faults counted: none" in out
    code, out, err = await resurge(capsys, "node", "describe", "n9")
    assert (code, out) == (1, "")
    assert err.strip() == (
        "resurge node describe: no node 'n9' in the cluster and no fault record of one "
        "(nodes: n1, n2)"
    )


async def test_uncordon_releases_the_quarantine_and_clears_the_score(
    ledger: NodeLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    for minutes in (0, 10, 20):
        await ledger.on_fault(xid48("a", minutes))
    code, out, err = await resurge(capsys, "node", "uncordon", "n1")
    assert code == 0, err
    first, released = out.splitlines()
    assert first == "node n1 uncordoned"
    assert released.startswith("node n1's quarantine (since ")
    assert released.endswith(") released; its score is 0")

    found = await ledger.nodes.get("n1")
    assert found is not None
    record = found[0]
    assert record.quarantine is None and record.score == 0 and record.counted == 3
    assert record.last_release is not None and record.last_release.by == "operator"
    code, out, err = await resurge(capsys, "node", "describe", "n1", "--json")
    view = json.loads(out)
    assert (view["score"], view["quarantine"], view["cordoned"]) == (0, None, False)
    assert view["lastRelease"]["why"] == "resurge node uncordon"

    code, out, err = await resurge(capsys, "node", "uncordon", "n1")
    assert (code, out) == (0, "node n1 uncordoned\n")  # nothing left to release
