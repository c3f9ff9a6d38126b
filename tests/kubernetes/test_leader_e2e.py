"""Two scalers, as the production overlay runs them, on the Kubernetes backend: one leads
(the Lease names it) and alone runs the controller and writes statuses, so a TrainingJob
is submitted once and its Events are not duplicated; SIGKILLed, the leader is replaced by
the standby once the Lease has gone unrenewed for its duration, and the next TrainingJob
is submitted once and gets its pod; the killed scaler, back, stands by, and takes over at
once from a leader that stops gracefully (SIGTERM), which gives the Lease back.

Real parts: nats-server, the detector, the restarter, two ``resurge-scaler`` processes and
a node monitor, the official client over HTTP, the node agent in the pods, torch workers
(gloo, CPU). Stand-ins: the API server (tests/kubernetes/emulator.py) and the process
kubelet (tests/kubernetes/kubelet.py). Leader election follows client-go's on a
coordination.k8s.io/v1 Lease ("Leases",
https://kubernetes.io/docs/concepts/architecture/leases/).
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from resurge.cluster.kubernetes.leader import timings
from resurge.events import JobSubmitted
from resurge.runtime.bus import Bus
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kubernetes" / "ddp-job.yaml"
LEASE = "resurge-controller"
LEASE_SECONDS = 6
SCALERS = ("scaler", "scaler-2")


@pytest.fixture
def plane(kube_api_thread: KubeApi, nats_url: str, tmp_path: Path) -> Iterator[ControlPlane]:
    """Detector, restarter, two scalers and one node's monitor, ready; stopped after."""
    plane = ControlPlane(
        kube_api_thread,
        nats_url,
        tmp_path,
        scalers=2,
        # Host network: the pods reach each other at the node's address (this test is
        # about the scalers, not the pod network's names).
        extra_env={
            "RESURGE_KUBE_LEASE_SECONDS": str(LEASE_SECONDS),
            "RESURGE_KUBE_HOST_NETWORK": "true",
        },
    )
    try:
        plane.start({"kn-0": 2})
        for name in SCALERS:  # both scalers have set up (one leads, one stands by)
            eventually(lambda n=name: "scaler ready" in plane.log(n), 60, f"{name} ready")  # type: ignore[misc]
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def submitted(plane: ControlPlane) -> AsyncIterator[Events]:
    """Every job event on the bus from now on (JobSubmitted among them)."""
    collected = Events()
    bus = await Bus.connect(plane.settings, "leader-test")
    await bus.subscribe(bus.subjects.all("job"), collected.add)
    await bus.nc.flush()
    try:
        yield collected
    finally:
        await bus.close()


def ddp_job(name: str, tmp_path: Path, steps: int) -> dict[str, Any]:
    """examples/kubernetes/ddp-job.yaml, one replica of one worker, ``steps`` steps."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    job = body["spec"]
    job.pop("image")  # the process kubelet runs no images
    job["workingDir"] = str(REPO)
    job["command"] = [
        "python", "examples/ddp/train.py", "--steps", str(steps), "--checkpoint-every", "10",
        "--step-seconds", "0.05", "--global-batch", "8", "--micro-batch", "2",
    ]  # fmt: skip
    job["env"].append({"name": "RESURGE_CHECKPOINT_DIR", "value": str(tmp_path / name)})
    job["nprocPerNode"] = 1
    job["replicas"] = {"min": 1, "max": 1}
    job["recovery"] = {"stopGraceSeconds": 5}
    return body


def lease(plane: ControlPlane) -> dict[str, Any] | None:
    """The controller's Lease's record now (the nodes' heartbeat Leases left out)."""
    leases = [o for o in plane.api.objects("leases", "default") if o["metadata"]["name"] == LEASE]
    return dict(leases[0]["spec"]) if leases else None


def holder(plane: ControlPlane) -> str | None:
    """The scaler the Lease names now (its process name), or None."""
    record = lease(plane) or {}
    return str(record.get("holderIdentity") or "").rsplit("_", 1)[0] or None


def submissions(events: Events, job: str) -> int:
    return sum(1 for e in events.of(JobSubmitted) if e.job == job)


def submitted_logged(plane: ControlPlane, job: str) -> list[str]:
    """Each scaler's log lines saying it submitted TrainingJob ``job`` (for a failure's
    message: who submitted)."""
    return [
        f"{name}: {line}"
        for name in SCALERS
        for line in plane.log(name).splitlines()
        if f"TrainingJob {job} submitted" in line
    ]


def phase(plane: ControlPlane, job: str) -> str | None:
    return (plane.training_job(job).get("status") or {}).get("phase")


def duplicated_events(plane: ControlPlane, job: str) -> list[tuple[str, str]]:
    """(reason, message) of every Event recorded more than once on TrainingJob ``job``."""
    seen = Counter((e["reason"], e.get("message", "")) for e in plane.events_of(job))
    return [key for key, n in seen.items() if n > 1]


async def test_one_of_two_scalers_leads_and_the_standby_takes_over_when_it_is_killed(
    plane: ControlPlane, submitted: Events, tmp_path: Path
) -> None:
    # One controller acts on a TrainingJob: it is submitted once, its Events are once.
    plane.api.create("trainingjobs", ddp_job("before", tmp_path, 20))
    await eventually_async(
        lambda: phase(plane, "before") == "Succeeded",
        120,
        lambda: f"before Succeeded; status {plane.training_job('before').get('status')}",
    )
    await eventually_async(
        lambda: any(e["reason"] == "Succeeded" for e in plane.events_of("before")),
        30,
        "the Succeeded Event on before",
    )
    assert submissions(submitted, "before") == 1, (
        [(e.job, e.source) for e in submitted.of(JobSubmitted)],
        submitted_logged(plane, "before"),
    )
    assert not duplicated_events(plane, "before"), plane.events_of("before")

    # ... because one scaler leads: the Lease names it, the other stands by.
    leader = holder(plane)
    assert leader in SCALERS, leader
    [standby] = [name for name in SCALERS if name != leader]
    assert f"{standby}_" in plane.log(standby) and "stands by" in plane.log(standby)
    assert plane.api.watch_count("trainingjobs") == 1, "only the leader follows TrainingJobs"

    # SIGKILL the leader: the standby takes the Lease once it has gone unrenewed for its
    # duration by the standby's clock (at most one retry period later).
    killed = time.monotonic()
    os.killpg(plane.processes[leader].pid, signal.SIGKILL)
    plane.processes[leader].wait()
    eventually(lambda: holder(plane) == standby, 3 * LEASE_SECONDS, f"the Lease naming {standby}")
    took = time.monotonic() - killed
    _, retry = timings(LEASE_SECONDS)
    print(f"failover: the Lease named the standby {took:.2f} s after the leader's SIGKILL")
    assert took <= LEASE_SECONDS + retry + 2.0, took  # 2 s: this test's poll, the load
    record = lease(plane)
    assert record is not None and record["leaseTransitions"] == 1, record

    # The new leader submits a new TrainingJob once and makes its pod.
    plane.api.create("trainingjobs", ddp_job("after", tmp_path, 2000))
    await eventually_async(
        lambda: any((p.get("status") or {}).get("phase") == "Running" for p in plane.pods("after")),
        90,
        lambda: (
            f"a Running pod of after; pods {[p['metadata']['name'] for p in plane.pods('after')]}"
        ),
    )
    await eventually_async(lambda: phase(plane, "after") == "Running", 60, "after Running")
    assert submissions(submitted, "after") == 1, submitted_logged(plane, "after")
    assert submissions(submitted, "before") == 1, "the finished job ran again"
    assert not duplicated_events(plane, "after"), plane.events_of("after")

    # The killed scaler comes back (as its Deployment would start it) and stands by; the
    # leader stopped gracefully (SIGTERM, a rolling update) gives the Lease back, so the
    # other takes over within a retry period, not a Lease duration, and submits nothing
    # again.
    before_restart = len(plane.log(leader))
    plane.restart(leader)
    eventually(
        lambda: "stands by" in plane.log(leader)[before_restart:], 60, f"{leader} standing by"
    )
    stopped = time.monotonic()
    os.killpg(plane.processes[standby].pid, signal.SIGTERM)
    eventually(lambda: holder(plane) == leader, LEASE_SECONDS, f"the Lease naming {leader}")
    handed = time.monotonic() - stopped
    print(f"handover: the Lease named the restarted scaler {handed:.2f} s after SIGTERM")
    assert handed <= retry + 2.0, handed
    assert plane.processes[standby].wait(timeout=30) == 0
    assert "gave back Lease" in plane.log(standby)
    eventually(
        lambda: "leads: holds Lease" in plane.log(leader)[before_restart:], 30, f"{leader} leads"
    )
    # A marker submitted means the new leader's controller has gone through the listed
    # TrainingJobs (its watch delivers them first).
    plane.api.create("trainingjobs", ddp_job("marker", tmp_path, 20))
    await submitted.wait_for(lambda items: submissions(submitted, "marker") >= 1, 60)
    assert submissions(submitted, "after") == 1, submitted_logged(plane, "after")
    assert submissions(submitted, "before") == 1, submitted_logged(plane, "before")
