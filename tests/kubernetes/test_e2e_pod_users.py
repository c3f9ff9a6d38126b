"""End to end on Kubernetes with NATS in operator mode: each pod its own NATS user.

Real parts as in test_e2e.py, and a nats-server in operator mode: every party connects
with a user JWT of its role, and the scaler's controller gives each pod a user of its own
(docs/security.md, Credentials), in a Secret its agent container reads, valid
:data:`SECONDS` seconds and renewed while the pod runs. Both jobs run the unmodified
torchrun-style script (it never imports resurge) on one node.

What a worker running as root could do with its pod's user (the Secret's text, which
such a worker can read from its agent's memory) is tried too: the server refuses it
every event of another job, and every node-level event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client, RawCredentials

from resurge.access.nats_jwt import new_nkey, user_jwt
from resurge.access.permissions import Permissions
from resurge.cluster.kubernetes.pod_credentials import issued_of, read_creds, secret_name
from resurge.events import GpuError, LogLine, ProcessExited, RecoveryStarted, Source, encode_event
from resurge.runtime.bus import Bus
from resurge.runtime.nats_auth import jwt_claims
from tests.collect import Events
from tests.kubernetes import test_e2e as e2e
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async, operator_nats
from tests.kubernetes.test_e2e import PLAIN_SCRIPT, create, ddp_job, status, status_if

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NODE = "ku-0"
SECONDS = 12  # a pod's JWT: renewed every 6 s or so, so a 25 s job needs several


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    root = tmp_path_factory.mktemp("k8s-users")
    with operator_nats(root / "nats") as (url, identities):
        plane = ControlPlane(
            kube_api_module,
            url,
            root,
            identities=identities,
            extra_env={"RESURGE_KUBE_NATS_CREDENTIALS_SECONDS": str(SECONDS)},
        )
        with plane.running({NODE: 4}):
            yield plane


events = e2e.events
jobs = e2e.jobs


def plain_job(name: str, tmp_path: Path, steps: int) -> dict[str, Any]:
    body = ddp_job(name, tmp_path, 0, nproc=2, replicas={"min": 1, "max": 1})
    body["spec"]["command"] = [
        "python", str(PLAIN_SCRIPT), "--steps", str(steps), "--step-seconds", "0.05",
    ]  # fmt: skip
    return body


def secret_of(plane: ControlPlane, pod: dict[str, Any]) -> dict[str, Any]:
    return plane.api.get("secrets", secret_name(pod["metadata"]["name"]))


class Thief:
    """A connection with a pod's own user, recording the server's refusals."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc = Client()

    async def connect(self, url: str, creds: str, user: str) -> None:
        async def on_error(error: Exception) -> None:
            self.errors.append(str(error))

        await self.nc.connect(
            url,
            user_credentials=RawCredentials(creds),
            inbox_prefix=f"_INBOX_{user}",
            error_cb=on_error,
            allow_reconnect=False,
        )


async def test_each_pod_has_its_own_renewed_user_that_cannot_speak_for_another_job(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job_a, job_b = "team-a-train", "team-b-train"
    create(plane, jobs, plain_job(job_a, tmp_path / "a", 500))  # about 25 s
    create(plane, jobs, plain_job(job_b, tmp_path / "b", 500))

    def both() -> list[dict[str, Any]] | None:
        found = plane.pods(job_a) + plane.pods(job_b)
        return found if len(found) == 2 else None

    pods = await eventually_async(both, 60, "both jobs' pods")
    by_job = {p["metadata"]["labels"]["resurge.dev/job"]: p for p in pods}

    # Each pod reads its own Secret: no password, no other NATS user in its manifest.
    for pod in pods:
        [container] = pod["spec"]["containers"]
        nats_env = {e["name"]: e for e in container["env"] if e["name"].startswith("RESURGE_NATS_")}
        assert set(nats_env) == {"RESURGE_NATS_URL", "RESURGE_NATS_CREDS"}, nats_env
        ref = nats_env["RESURGE_NATS_CREDS"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret_name(pod["metadata"]["name"]), "key": "creds"}
    user_a = issued_of(secret_of(plane, by_job[job_a]))
    user_b = issued_of(secret_of(plane, by_job[job_b]))
    assert user_a is not None and user_b is not None and user_a.user != user_b.user
    first_expiry = user_a.expires
    assert first_expiry - time.time() <= SECONDS

    # A's user, as a root worker of A would hold it, speaks for B and for the node.
    refusals = await forge(plane, user_a.creds, job_a, job_b)
    assert len(refusals) == 2, refusals

    # Both jobs train past several of their JWTs' lifetimes without a restart: each agent
    # renewed its user over NATS, and the controller kept each Secret valid.
    for job in (job_a, job_b):
        final = await eventually_async(
            lambda j=job: status_if(plane, j, lambda s: s.get("phase") in ("Succeeded", "Failed")),  # type: ignore[misc]
            150,
            lambda j=job: f"{j} finished; status {status(plane, j)}",  # type: ignore[misc]
        )
        assert final["phase"] == "Succeeded" and not final.get("restarts"), final
    assert not [e for e in events.items if isinstance(e, RecoveryStarted)]
    renewed = (plane.pod_dir / f"{by_job[job_a]['metadata']['name']}.log").read_text()
    assert renewed.count("NATS user JWT renewed") >= 2, renewed[-3000:]
    for job in (job_a, job_b):
        await e2e.delete_job(plane, job)


FORGED_PID = 999_999


async def forge(
    plane: ControlPlane,
    creds: str,
    own: str,
    other: str,
    node: str = NODE,
    other_pod: tuple[str, str] | None = None,
) -> list[str]:
    """With the user of ``creds`` (a pod of job ``own`` on ``node``), publish an exit of
    job ``other``'s rank 0 and a node-level XID 79, then a line of its own job; return
    the server's refusals once the line was seen, having checked that neither forgery
    was, and that the controller refuses a forged renewal naming ``other_pod``
    (namespace, name; default: ``other``'s pod in ``default``)."""
    if other_pod is None:
        other_pod = ("default", plane.pods(other)[0]["metadata"]["name"])
    watch = Events()  # every raw event, as the control plane would take them
    bus = await Bus.connect(plane.settings, "e2e-watch")
    thief = Thief()
    try:
        await bus.subscribe(bus.subjects.all("raw"), watch.add)
        await bus.nc.flush()
        await thief.connect(plane.nats_url, creds, str(jwt_claims(read_creds(creds)[0])["name"]))
        subjects = plane.settings.subjects
        source = Source(service="node-agent", instance=f"{node}:1")
        kill = ProcessExited(
            source=source, job=other, replica=0, node=node, generation=0, rank=0, pid=FORGED_PID,
            local_rank=0, local_world_size=2, exit_code=None, signal="SIGKILL",
        )  # fmt: skip
        xid = GpuError(source=source, node=node, gpu=0, error="xid", xid=79, message="forged")
        marker = LogLine(
            source=source, job=own, replica=0, node=node, generation=0, local_rank=0,
            stream="stdout", line="the thief's own line",
        )  # fmt: skip
        await thief.nc.publish(subjects.raw(other, "process_exited", node), encode_event(kill))
        await thief.nc.publish(subjects.raw("_", "gpu_error", node), encode_event(xid))
        # Last, what it may say: once seen, whatever the server let through before was too.
        await thief.nc.publish(subjects.raw(own, "log_line", node), encode_event(marker))
        await thief.nc.flush()
        await watch.wait_for(
            lambda items: [e for e in items if isinstance(e, LogLine) and e.line == marker.line],
            30,
        )
        assert not [e for e in watch.items if isinstance(e, ProcessExited) and e.pid == FORGED_PID]
        assert not [e for e in watch.items if isinstance(e, GpuError) and e.message == "forged"]
        # Nor does the controller renew a JWT it did not sign, whichever pod it names.
        stranger = new_nkey("account")
        wide = Permissions((">",), (">",))
        tag = "resurge-pod:{}/{}".format(*other_pod)
        forged_jwt = user_jwt(new_nkey("user").public, "x", wide, stranger, tags=(tag,))
        request = json.dumps({"jwt": forged_jwt}).encode()
        reply = await thief.nc.request(subjects.access_renew(), request, timeout=10)
        answer = json.loads(reply.data)
        assert "jwt" not in answer and "not a JWT signed by" in answer["error"]
        return [e for e in thief.errors if "permissions violation" in e.lower()]
    finally:
        await thief.nc.close()
        await bus.close()
