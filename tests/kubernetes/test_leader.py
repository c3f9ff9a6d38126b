"""Leader election on a Lease (resurge.cluster.kubernetes.leader) against the API emulator
over real HTTP with the official client: candidates race, a leader cut off from the API
stops before a standby takes over, a leader that stops gives the Lease back. The rules
followed are client-go's leaderelection and the Lease API ("Leases",
https://kubernetes.io/docs/concepts/architecture/leases/; coordination.k8s.io/v1 Lease:
holderIdentity, leaseDurationSeconds, acquireTime, renewTime, leaseTransitions)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from resurge.cluster.kubernetes.api import KubeApi as Client
from resurge.cluster.kubernetes.leader import LeaderElector, leading_gauge
from tests.kubernetes.conftest import KubeApi

LEASE = "resurge-controller"
DURATION = 4  # seconds: renew deadline 2.67 s, retry 0.53 s


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    """The clients a test makes (:func:`client_of`), closed after."""
    made: list[Client] = []
    yield made
    for client in made:
        client.api.close()  # type: ignore[no-untyped-call]


def client_of(api: KubeApi, clients: list[Client]) -> Client:
    """A new official client of the emulator (its own connection pool, as each scaler
    has its own), in namespace default."""
    clients.append(Client(api.api_client(), "default"))
    return clients[-1]


def lease(api: KubeApi) -> dict[str, Any]:
    return dict(api.get("leases", LEASE, "default")["spec"])


class Work:
    """What a candidate runs while leading: notes when it started and was cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.started_at = 0.0
        self.stopped_at = 0.0

    async def __call__(self) -> None:
        self.started_at = time.monotonic()
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.stopped_at = time.monotonic()
            self.stopped.set()


@contextlib.asynccontextmanager
async def running(elector: LeaderElector, work: Work) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(elector.run(work))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_of_two_candidates_one_leads_and_the_lease_names_it(
    kube_api_thread: KubeApi, clients: list[Client]
) -> None:
    a = LeaderElector(client_of(kube_api_thread, clients), LEASE, DURATION, me="a")
    b = LeaderElector(client_of(kube_api_thread, clients), LEASE, DURATION, me="b")
    # Both find no Lease and create it, or one finds the other's: exactly one holds it
    # (the loser's create gets 409 AlreadyExists, or its read shows the Lease held).
    results = await asyncio.gather(a.try_once(), b.try_once())
    assert sorted(results) == [False, True], results
    winner = "a" if results[0] else "b"
    record = lease(kube_api_thread)
    assert record["holderIdentity"] == winner, record
    assert record["leaseDurationSeconds"] == DURATION and record["leaseTransitions"] == 0
    # The loser stays out while the winner renews.
    loser = b if winner == "a" else a
    assert not await loser.try_once()


async def test_a_write_from_a_stale_read_loses_with_409(
    kube_api_thread: KubeApi, clients: list[Client]
) -> None:
    """The update is a PUT carrying the resourceVersion read ("Concurrency Control and
    Consistency", API Concepts: a stale resourceVersion is refused with 409 Conflict)."""
    a = LeaderElector(client_of(kube_api_thread, clients), LEASE, DURATION, me="a")
    assert await a.try_once()
    stale = kube_api_thread.get("leases", LEASE, "default")
    assert await a.try_once()  # renewed: the resourceVersion moved on
    b = LeaderElector(client_of(kube_api_thread, clients), LEASE, DURATION, me="b")
    stale["spec"]["holderIdentity"] = "b"
    with pytest.raises(Exception, match="409"):
        await b.kube.call(
            "update Lease",
            b.kube.coordination.replace_namespaced_lease,
            LEASE,
            "default",
            stale,
            _preload_content=False,
        )
    assert lease(kube_api_thread)["holderIdentity"] == "a"


async def test_a_leader_cut_off_stops_before_the_standby_takes_over(
    kube_api_thread: KubeApi, clients: list[Client]
) -> None:
    registry = CollectorRegistry()
    a_client = client_of(kube_api_thread, clients)
    a = LeaderElector(a_client, LEASE, DURATION, me="a", on_change=leading_gauge(registry, LEASE))
    b = LeaderElector(client_of(kube_api_thread, clients), LEASE, DURATION, me="b")
    a_work, b_work = Work(), Work()
    async with running(a, a_work) as a_task:
        await asyncio.wait_for(a_work.started.wait(), 10)
        assert registry.get_sample_value("resurge_leader", {"lease": LEASE}) == 1
        async with running(b, b_work):
            # b stands by while a renews: well past the duration, b never starts.
            await asyncio.sleep(1.5 * DURATION)  # the absence of a takeover is what is tested
            assert not b_work.started.is_set()
            assert lease(kube_api_thread)["holderIdentity"] == "a"
            # a loses the API server (its connections refused from now on).
            a_client.api.configuration.host = "http://127.0.0.1:9"
            cut = time.monotonic()
            await asyncio.wait_for(b_work.started.wait(), 3 * DURATION)
            assert a_work.stopped.is_set(), "a still led when b took over"
            assert a_work.stopped_at <= b_work.started_at
            assert a_work.stopped_at - cut <= a.renew_deadline + 1.0
            assert b_work.started_at - cut <= DURATION + b.retry + 1.0
            assert registry.get_sample_value("resurge_leader", {"lease": LEASE}) == 0
            record = lease(kube_api_thread)
            assert record["holderIdentity"] == "b" and record["leaseTransitions"] == 1, record
            # a, reconnected and then stopped, gives nothing back: its give-back carries
            # the resourceVersion of its last renewal and is refused (409), so the Lease
            # still names b.
            a_client.api.configuration.host = kube_api_thread.url
            a_task.cancel()
            await asyncio.gather(a_task, return_exceptions=True)
            assert lease(kube_api_thread) == record
            assert not b_work.stopped.is_set()


async def test_a_leader_that_stops_gives_the_lease_back_and_the_standby_takes_it_at_once(
    kube_api_thread: KubeApi, clients: list[Client]
) -> None:
    a = LeaderElector(client_of(kube_api_thread, clients), LEASE, 30, me="a")
    b = LeaderElector(client_of(kube_api_thread, clients), LEASE, 30, me="b")
    a_work, b_work = Work(), Work()
    async with running(a, a_work):
        await asyncio.wait_for(a_work.started.wait(), 10)
        assert not await b.try_once()  # b has seen a's Lease, live for 30 s by b's clock
        assert b.holder() == "a"
        b_task = asyncio.create_task(b.run(b_work))
    try:
        # a was cancelled (as the scaler's SIGTERM cancels it) and gave the Lease back:
        # b takes it within a retry period, not 30 s.
        stopped = time.monotonic()
        given_back = lease(kube_api_thread)
        assert given_back["holderIdentity"] in ("", "b"), given_back
        await asyncio.wait_for(b_work.started.wait(), b.retry + 2)
        assert b_work.started_at - stopped <= b.retry + 1
        record = lease(kube_api_thread)
        # Taking a given-back Lease is a transition too (client-go counts every change
        # of holder).
        assert record["holderIdentity"] == "b" and record["leaseTransitions"] == 1, record
    finally:
        b_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await b_task
