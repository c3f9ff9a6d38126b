"""End to end on the Kubernetes backend: a node drained as ``kubectl drain`` drains it,
under a running job. The evictor cordons the node, then asks the Eviction API to evict
each of the node's pods, again and again, until none is left. The job's
PodDisruptionBudget refuses every eviction (429) while resurge, which saw the cordon,
checkpoints the job and then moves it by deleting its pod; the evictor's next try finds
the pod gone (404), and the job trains on on another node. A plain script's job (no
``resurge.worker``: no checkpoint to ask for) is moved at once.

Real parts and stand-ins as in test_e2e.py (whose helpers this reuses). The module has
its own control plane of three one-GPU nodes: each test drains the node its job is on,
which stays cordoned, and the job moves to one of the others.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from resurge.control.views.node_record import read_record
from resurge.events import Assign, Progress, RendezvousPassed
from resurge.runtime.bus import Bus
from tests.collect import Events
from tests.kubernetes import test_e2e as e2e
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane
from tests.kubernetes.test_e2e import PLAIN_SCRIPT, create, ddp_job, pods_of, status, where

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NODES = {"ke-0": 1, "ke-1": 1, "ke-2": 1}
ONE = {"min": 1, "max": 1}
# kubectl drain tries an eviction the budget refused again after 5 s; sooner here.
RETRY_SECONDS = 0.5


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """The module's control plane, ready; stopped after, with no pod process left."""
    plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-evict"))
    with plane.running(NODES):
        yield plane


# test_e2e.py's fixtures, on this module's control plane (``plane`` above).
events = e2e.events
jobs = e2e.jobs


def kubectl_drain(plane: ControlPlane, node: str, seconds: float) -> list[tuple[str, int]]:
    """Drain ``node`` as ``kubectl drain`` does: cordon it, then evict each of its pods
    not finished through the Eviction API until none is left, trying a refused one again
    after :data:`RETRY_SECONDS`. Each answer, in order: (pod, HTTP status; 201 evicted,
    429 refused by a budget, 404 gone)."""
    client = plane.api.api_client()
    try:
        core = k8s.CoreV1Api(client)
        core.patch_node(node, {"spec": {"unschedulable": True}})
        answers: list[tuple[str, int]] = []
        deadline = time.monotonic() + seconds
        while True:
            listed = core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            )
            left = [
                p["metadata"]
                for p in json.loads(listed.data)["items"]  # type: ignore[attr-defined]
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            if not left:
                return answers
            assert time.monotonic() < deadline, f"{node} not drained in {seconds:g} s: {answers}"
            for meta in left:
                name, namespace = str(meta["name"]), str(meta["namespace"])
                body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace))
                try:
                    core.create_namespaced_pod_eviction(name, namespace, body)
                except ApiException as error:
                    answers.append((name, int(error.status)))
                else:
                    answers.append((name, 201))
            time.sleep(RETRY_SECONDS)  # kubectl's own pause between tries
    finally:
        client.close()


async def drain_said(plane: ControlPlane, node: str, job: str) -> str:
    """What the restarter's drain of ``node`` says it did with ``job`` (the node's health
    record, as ``resurge node drain`` reads it); empty until it says."""
    bus = await Bus.connect(plane.settings, "e2e-test")
    try:
        record = await read_record(bus, node)
    finally:
        await bus.close()
    drain = None if record is None else record.drain
    return "" if drain is None or drain.done is None else drain.jobs.get(job, "")


async def said_of(plane: ControlPlane, node: str, job: str) -> str:
    """:func:`drain_said`, once it says something (within 30 s)."""
    deadline = time.monotonic() + 30
    while not (said := await drain_said(plane, node, job)):
        assert time.monotonic() < deadline, f"the drain of {node} said nothing of {job}"
        await asyncio.sleep(0.2)  # the record lives in the restarter's KV bucket
    return said


async def test_kubectl_drain_waits_for_the_checkpoint_then_finds_the_pod_gone(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "evict-ck"
    body = ddp_job(job, tmp_path, 100_000, replicas=ONE)
    command = body["spec"]["command"]
    command[command.index("--checkpoint-every") + 1] = "0"  # only when resurge asks
    create(plane, jobs, body)
    await events.wait_for(
        lambda items: any(isinstance(e, Progress) and e.job == job for e in items), 90
    )
    [pod] = pods_of(plane, job)
    node = pod["spec"]["nodeName"]
    assert status(plane, job).get("latestCheckpoint") is None  # it never saved one yet

    answers = await asyncio.to_thread(kubectl_drain, plane, node, 50)

    mine = [code for name, code in answers if name == pod["metadata"]["name"]]
    assert 429 in mine and 201 not in mine, answers  # refused until resurge moved it
    said = await said_of(plane, node, job)
    found = re.fullmatch(r"checkpointed step (\d+), then moved", said)
    assert found is not None, said
    step = int(found.group(1))
    assigned = await events.wait_for(
        lambda items: next(
            (e for e in items if isinstance(e, Assign) and e.job == job and e.generation > 0), None
        ),
        60,
    )
    assert [slot.node for slot in assigned.rank_table] != [node], assigned.rank_table
    await events.wait_for(
        lambda items: any(
            isinstance(e, Progress) and e.job == job and e.generation == assigned.generation
            and e.step > step
            for e in items
        ),
        60,
    )  # fmt: skip
    moved = status(plane, job)
    assert moved["latestCheckpoint"]["step"] == step, moved
    assert moved["restarts"] == {"node": 1}, moved
    assert all(p["spec"]["nodeName"] != node for p in plane.pods(job)), where(plane, job)
    await e2e.delete_job(plane, job)


async def test_a_plain_scripts_job_is_moved_at_once_and_its_pod_goes(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "evict-plain"
    body = ddp_job(job, tmp_path, 0, replicas=ONE)
    body["spec"]["command"] = [
        "python", str(PLAIN_SCRIPT), "--steps", "100000", "--step-seconds", "0.05",
    ]  # fmt: skip
    create(plane, jobs, body)
    await events.wait_for(
        lambda items: any(isinstance(e, RendezvousPassed) and e.job == job for e in items), 90
    )
    [pod] = pods_of(plane, job)
    node = pod["spec"]["nodeName"]

    answers = await asyncio.to_thread(kubectl_drain, plane, node, 50)

    assert answers and 201 not in {code for _, code in answers}, answers
    said = await said_of(plane, node, job)
    assert said.startswith("moved at once: its workers do not run resurge.worker"), said
    await events.wait_for(
        lambda items: any(
            isinstance(e, RendezvousPassed) and e.job == job and (e.generation or 0) > 0
            for e in items
        ),
        60,
    )
    assert all(p["spec"]["nodeName"] != node for p in plane.pods(job)), where(plane, job)
    await e2e.delete_job(plane, job)
