"""The ``backend`` fixture: one :class:`ClusterBackend` per backend name, fresh per test.

Each backend has one factory in :data:`FACTORIES`; the fixture is parametrised over
them, so a backend joins the suite by adding its factory. ``local`` runs on the
session's real nats-server, in the test's own namespace (so each test starts with an
empty cluster). ``kubernetes`` talks to a fresh Kubernetes API server per test (kmock's
emulator over real HTTP, tests/kubernetes/conftest.py) through the official client, and
keeps its records on the same nats-server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from resurge.cluster import ClusterBackend, open_backend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.kubernetes.conftest import KubeApi, kube_api_thread

__all__ = ["backend", "kube_api_thread"]

BackendFactory = Callable[[pytest.FixtureRequest, Bus, Settings], Awaitable[ClusterBackend]]


async def _local(request: pytest.FixtureRequest, bus: Bus, settings: Settings) -> ClusterBackend:
    return await open_backend(bus, settings.model_copy(update={"cluster": "local"}))


async def _kubernetes(
    request: pytest.FixtureRequest, bus: Bus, settings: Settings
) -> ClusterBackend:
    api: KubeApi = request.getfixturevalue("kube_api_thread")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
    return await open_backend(bus, settings.model_copy(update={"cluster": "kubernetes"}))


# Backend name -> how to open an empty one for a test.
FACTORIES: dict[str, BackendFactory] = {"local": _local, "kubernetes": _kubernetes}


@pytest.fixture(params=sorted(FACTORIES))
async def backend(request: pytest.FixtureRequest, bus: Bus, settings: Settings) -> ClusterBackend:
    """An empty cluster behind the backend named by the parameter."""
    opened = await FACTORIES[request.param](request, bus, settings)
    assert opened.name == request.param
    return opened
