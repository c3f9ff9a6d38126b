"""End to end: two teams' TrainingJobs of one name, each in its own namespace, train at
the same time and succeed, each with its pods and status in its namespace and its own
name on the bus (``team-a/train``, ``team-b/train``), as ``resurge status`` shows.

Real parts and stand-ins as in tests/kubernetes/test_e2e.py (real nats-server, services,
monitors, node agents and torch workers; the API emulator and the process kubelet).
Team A runs a torchrun-style script that never imports resurge
(tests/e2e/workers/plain_ddp.py), team B examples/ddp/train.py, which does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resurge.events import ProcessStarted
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async
from tests.kubernetes.test_e2e import PLAIN_SCRIPT, ddp_job, events  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NODES = {"kn-0": 2, "kn-1": 2}
TEAMS = ("team-a", "team-b")


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of its own (tests/kubernetes/e2e_cluster.py) whose install's
    namespace is ``default``."""
    plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-ns"))
    with plane.running(NODES):
        yield plane


def team_job(team: str, tmp_path: Path) -> dict[str, Any]:
    """``train`` in namespace ``team``: one pod of two ranks, 60 short steps."""
    body = ddp_job("train", tmp_path / team, 60, nproc=2, replicas={"min": 1, "max": 1})
    body["metadata"]["namespace"] = team
    if team == "team-a":
        body["spec"]["command"] = [
            "python", str(PLAIN_SCRIPT), "--steps", "60", "--step-seconds", "0.05",
        ]  # fmt: skip
    return body


def status_in(plane: ControlPlane, team: str) -> dict[str, Any]:
    return dict(plane.api.get("trainingjobs", "train", team).get("status") or {})


async def test_two_teams_jobs_of_one_name_train_in_their_namespaces(
    plane: ControlPlane,
    events: Events,  # noqa: F811
    tmp_path: Path,
) -> None:
    for team in TEAMS:
        plane.api.create("trainingjobs", team_job(team, tmp_path), team)
    try:
        started = await events.wait_for(
            lambda items: (
                {(e.job, e.replica) for e in items if isinstance(e, ProcessStarted)}
                >= {("team-a/train", 0), ("team-b/train", 0)}
            ),
            120,
        )
        assert started
        for team in TEAMS:
            pods = [
                p
                for p in plane.api.objects("pods", team)
                if p["metadata"]["labels"].get("resurge.dev/job") == "train"
            ]
            owner = plane.api.get("trainingjobs", "train", team)["metadata"]["uid"]
            assert pods and all(
                [r["uid"] for r in p["metadata"]["ownerReferences"]] == [owner] for p in pods
            ), pods
        assert not [
            p for p in plane.api.objects("pods", "default")
            if p["metadata"]["labels"].get("resurge.dev/job") == "train"
        ]  # fmt: skip
        shown = plane.cli("status")
        assert "team-a/train" in shown and "team-b/train" in shown, shown
        for team in TEAMS:
            final = await eventually_async(
                lambda t=team: (  # type: ignore[misc]
                    s
                    if (s := status_in(plane, t)).get("phase") in ("Succeeded", "Failed")
                    else None
                ),
                120,
                lambda t=team: f"{t}'s train finished; status {status_in(plane, t)}",  # type: ignore[misc]
            )
            assert final["phase"] == "Succeeded", (team, final)
    finally:
        for team in TEAMS:
            plane.api.delete("trainingjobs", "train", team)
        await eventually_async(
            lambda: not any(plane.api.objects("pods", team) for team in TEAMS),
            60,
            lambda: f"pods left: {[plane.api.objects('pods', t) for t in TEAMS]}",
        )
