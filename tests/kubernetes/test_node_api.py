"""What the Kubernetes backend asks of the API server for nodes: one watch per kind per
process (informers, resumed from bookmarks), node heartbeats as Leases, and cordons
written with the node's resourceVersion as a precondition. Against the API emulator over
real HTTP, with the official client and a real nats-server; requests are counted by the
emulator as the apiserver's audit log names them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s

from resurge.cluster import NODE_TIMEOUT_SECONDS, NodeInfo, watching
from resurge.cluster.kubernetes import watch
from resurge.cluster.kubernetes.api import KubeApi as Api
from resurge.cluster.kubernetes.backend import KubernetesBackend
from resurge.cluster.kubernetes.controller import Controller
from resurge.cluster.kubernetes.informer import informer
from resurge.cluster.kubernetes.node_lease import NODE_LABEL, lease_name
from resurge.runtime.bus import Bus
from tests.contract.helpers import next_changes
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import WAIT_SECONDS, until

MAINTENANCE = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


@contextlib.asynccontextmanager
async def running(coroutine: Any) -> AsyncIterator[None]:
    task = asyncio.create_task(coroutine)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def report(name: str, age_seconds: float = 0.0, **fields: Any) -> NodeInfo:
    heartbeat = datetime.now(UTC) - timedelta(seconds=age_seconds)
    return NodeInfo.model_validate({"name": name, "slots": 4, "heartbeat": heartbeat, **fields})


def node_requests(api: KubeApi) -> dict[str, int]:
    """Requests on nodes so far, by verb."""
    return {verb: n for (verb, resource), n in api.requests().items() if resource == "nodes"}


async def test_a_quiet_watch_resumes_from_its_last_bookmark_without_listing_again(
    kube_api_thread: KubeApi,
) -> None:
    """Kubernetes API Concepts, "Watch bookmarks": a watch with allowWatchBookmarks=true gets
    BOOKMARK events carrying the version the server reached; a client resumes from it,
    so a kind that has not changed for a while still resumes from a recent version
    instead of one compacted away (410 Gone, then a whole new list)."""
    kube_api_thread.call(lambda em: setattr(em, "bookmark_interval", 0.1))
    kube_api_thread.add_node("n1")
    kube = Api(kube_api_thread.api_client(), "default")
    nodes = informer(kube, kube.core.list_node)
    assert [n["metadata"]["name"] for n in await nodes.objects()] == ["n1"]
    await kube_api_thread.wait_for_watch("nodes")
    for index in range(3):  # other kinds move the cluster's version on; nodes stay quiet
        kube_api_thread.create("configmaps", {"metadata": {"name": f"c{index}"}})
    reached = kube_api_thread.call(lambda em: em.resource_version)
    await until("a bookmark of the version reached", lambda: int(nodes.version) >= reached)

    kube_api_thread.compact()  # the history before `reached` is gone
    assert kube_api_thread.break_watches() >= 1
    kube_api_thread.add_node("n2")
    await until("n2 in the cache", lambda: ("", "n2") in nodes.cache)
    assert node_requests(kube_api_thread).get("list") == 1


async def test_node_reads_and_watches_of_one_process_share_one_list_and_one_watch(
    kube_api_thread: KubeApi, backend: KubernetesBackend, bus: Bus
) -> None:
    """list_nodes, live_nodes, cordon's read, the backend's watch and the controller's
    Node loop: one LIST and one open watch of Nodes, however often they read."""
    for name in ("n1", "n2", "n3"):
        kube_api_thread.add_node(name, gpus=4)
    controller = Controller(backend.kube, bus, backend.records, backend.settings)
    async with running(controller.follow_nodes()), watching(backend) as changes:
        assert {c.node for c in await next_changes(changes, 3)} == {"n1", "n2", "n3"}
        for _ in range(20):
            assert len(await backend.list_nodes()) == 3
            assert len(await backend.live_nodes()) == 3
        await backend.cordon("n2", reason="XID 79")
        [cordoned] = await next_changes(changes, 1)
        assert cordoned.node == "n2" and cordoned.node_info is not None
        assert cordoned.node_info.cordoned
        assert kube_api_thread.watch_count("nodes") == 1
    counted = node_requests(kube_api_thread)
    assert counted.get("list") == 1 and counted.get("watch") == 1, counted
    assert "get" not in counted, counted  # no read by name: the cache answers
    assert counted.get("patch") == 1, counted  # the cordon


async def test_a_heartbeat_renews_the_nodes_lease_and_leaves_the_node_alone(
    kube_api_thread: KubeApi, backend: KubernetesBackend
) -> None:
    """KEP-589 (node leases): a node's heartbeat is its Lease's renewTime; the Node is
    written only when what the monitor reports changes."""
    kube_api_thread.add_node("gpu-1", gpus=4)
    await backend.report_node(report("gpu-1", age_seconds=60))
    node_writes = node_requests(kube_api_thread).get("patch", 0)
    assert node_writes == 1  # the first report
    lease = kube_api_thread.get("leases", lease_name("gpu-1"))
    assert lease["spec"]["holderIdentity"] == "gpu-1"
    assert lease["metadata"]["labels"] == {NODE_LABEL: "gpu-1"}
    assert lease["spec"]["leaseDurationSeconds"] == int(NODE_TIMEOUT_SECONDS)
    assert not [n.name for n in await backend.live_nodes()]  # renewed a minute ago

    step = NODE_TIMEOUT_SECONDS / 3
    for beat in range(1, 5):  # the monitor's reports, due heartbeats apart
        await backend.report_node(report("gpu-1", age_seconds=60 - beat * step))
    await backend.report_node(report("gpu-1"))
    renewed = kube_api_thread.get("leases", lease_name("gpu-1"))
    assert renewed["spec"]["renewTime"] > lease["spec"]["renewTime"]
    assert [n.name for n in await backend.live_nodes()] == ["gpu-1"]
    counted = kube_api_thread.requests()
    assert counted.get(("update", "leases")) == 5
    assert node_requests(kube_api_thread).get("patch") == node_writes  # the Node untouched

    # A report that says something new is written to the Node, once.
    await backend.report_node(report("gpu-1", healthy=False))
    await backend.report_node(report("gpu-1", healthy=False))
    assert node_requests(kube_api_thread).get("patch") == node_writes + 1
    [listed] = await backend.list_nodes()
    assert not listed.healthy


async def test_a_monitor_that_stops_renewing_makes_its_node_not_live(
    kube_api_thread: KubeApi, backend: KubernetesBackend
) -> None:
    """The node is live while its Lease's renewTime is within NODE_TIMEOUT_SECONDS, whatever
    the Node's own annotation says."""
    await backend.report_node(report("fresh"))
    await backend.report_node(report("gone"))
    assert {n.name for n in await backend.live_nodes()} == {"fresh", "gone"}
    stale = (datetime.now(UTC) - timedelta(seconds=NODE_TIMEOUT_SECONDS + 5)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )
    coordination = k8s.CoordinationV1Api(kube_api_thread.api_client())
    await asyncio.to_thread(
        coordination.patch_namespaced_lease,
        lease_name("gone"),
        "default",
        {"spec": {"renewTime": stale}},
    )
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while {n.name for n in await backend.live_nodes()} != {"fresh"}:  # the Lease's watch
        assert asyncio.get_running_loop().time() < deadline, "the stale Lease never seen"
        await asyncio.sleep(0.05)
    assert {n.name for n in await backend.list_nodes()} == {"fresh", "gone"}


async def test_a_taint_another_controller_adds_before_the_cordon_is_written_is_kept(
    kube_api_thread: KubeApi, backend: KubernetesBackend
) -> None:
    """Kubernetes API Concepts, "Resource versions" and "Conflicts": a write carrying the
    resourceVersion it was made from is refused (409) when the object changed since; the
    writer reads again and makes its change anew, so nobody's change is lost."""
    kube_api_thread.add_node("n1", gpus=4)
    await backend.list_nodes()  # the cache holds n1 as it is now
    admin = k8s.CoreV1Api(kube_api_thread.api_client())
    patch_node = backend.kube.core.patch_node
    raced: list[bool] = []

    def taint_first(*args: Any, **kwargs: Any) -> Any:
        """Another controller taints the node after resurge read it, before it writes."""
        if not raced:
            raced.append(True)
            admin.patch_node("n1", {"spec": {"taints": [MAINTENANCE]}})
        return patch_node(*args, **kwargs)

    backend.kube.core.patch_node = taint_first  # type: ignore[method-assign]
    await backend.cordon("n1", reason="XID 79 on GPU 3")
    node = kube_api_thread.get("nodes", "n1")
    assert node["spec"]["taints"] == [
        MAINTENANCE,
        {"key": "resurge.dev/unhealthy", "value": "true", "effect": "NoSchedule"},
    ]
    assert node["spec"]["unschedulable"] is True

    raced.clear()  # and again between uncordon's read and write
    await backend.uncordon("n1")
    node = kube_api_thread.get("nodes", "n1")
    assert node["spec"]["taints"] == [MAINTENANCE]
    assert not node["spec"].get("unschedulable")


async def test_uncordon_leaves_an_administrators_own_cordon(
    kube_api_thread: KubeApi, backend: KubernetesBackend
) -> None:
    """`kubectl cordon` (spec.unschedulable) is the administrator's: resurge's uncordon
    removes its own taint and reason only."""
    kube_api_thread.add_node("n1", gpus=4)
    admin = k8s.CoreV1Api(kube_api_thread.api_client())
    await asyncio.to_thread(admin.patch_node, "n1", {"spec": {"unschedulable": True}})
    await backend.cordon("n1", reason="XID 79 on GPU 3")
    await backend.uncordon("n1")
    node = kube_api_thread.get("nodes", "n1")
    assert node["spec"]["unschedulable"] is True
    assert not node["spec"].get("taints")
    assert "resurge.dev/cordon-reason" not in node["metadata"].get("annotations", {})
    [listed] = await backend.list_nodes()
    assert listed.cordoned  # still, by the administrator


def test_a_quiet_watch_is_not_taken_for_dead_before_the_server_ends_it() -> None:
    """Kubernetes API Concepts, "Watch bookmarks" and "Efficient detection of changes": a
    watch of a kind nothing changes in carries no byte but a bookmark about every minute,
    until the server ends it after timeoutSeconds. The client's read timeout outlasts
    that, so such a watch is not dropped and opened again (a request each time)."""
    assert watch._READ_TIMEOUT_SECONDS > watch._SERVER_TIMEOUT_SECONDS


async def test_an_informer_ends_its_thread_before_its_event_loop_returns(
    kube_api_thread: KubeApi,
) -> None:
    """A process that read nodes (`resurge node list`) leaves no watch thread reading as
    its interpreter exits: a daemon thread still in its stream then can abort the exit
    (SIGABRT, seen as exit code -6 of the CLI). The informer stops and waits for its thread
    when ``asyncio.run`` shuts the loop's asynchronous generators down."""
    kube_api_thread.add_node("n1")

    def watching_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "kubernetes-watch"}

    before = watching_threads()

    async def read_nodes() -> int:
        kube = Api(kube_api_thread.api_client(), "default")
        return len(await informer(kube, kube.core.list_node).objects())

    assert await asyncio.to_thread(asyncio.run, read_nodes()) == 1
    assert not watching_threads() - before
