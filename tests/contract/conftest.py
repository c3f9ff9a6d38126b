"""The ``backend`` fixture: one :class:`ClusterBackend` per backend name, fresh per test.

Each backend has one factory in :data:`FACTORIES`; the fixture is parametrised over
them, so a backend joins the suite by adding its factory. ``local`` runs on the
session's real nats-server, in the test's own namespace (so each test starts with an
empty cluster).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from resurge.cluster import ClusterBackend, open_backend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

BackendFactory = Callable[[Bus, Settings], Awaitable[ClusterBackend]]


async def _local(bus: Bus, settings: Settings) -> ClusterBackend:
    return await open_backend(bus, settings.model_copy(update={"cluster": "local"}))


# Backend name -> how to open an empty one for a test.
FACTORIES: dict[str, BackendFactory] = {"local": _local}


@pytest.fixture(params=sorted(FACTORIES))
async def backend(request: pytest.FixtureRequest, bus: Bus, settings: Settings) -> ClusterBackend:
    """An empty cluster behind the backend named by the parameter."""
    opened = await FACTORIES[request.param](bus, settings)
    assert opened.name == request.param
    return opened
