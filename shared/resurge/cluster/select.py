"""The one place a cluster backend is chosen: :func:`open_backend` by ``RESURGE_CLUSTER``.

Services, the CLI and the local cluster call it and then speak only
:class:`~resurge.cluster.protocol.ClusterBackend`; none names a backend class.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING

from resurge.cluster.local.backend import LocalBackend
from resurge.cluster.protocol import ClusterBackend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

if TYPE_CHECKING:
    from resurge.cluster.kubernetes.pod_credentials import PodUsers

__all__ = ["open_backend"]

_KUBERNETES_BACKEND = "resurge.cluster.kubernetes.backend"


async def open_backend(
    bus: Bus, settings: Settings, pod_users: PodUsers | None = None
) -> ClusterBackend:
    """The backend ``settings.cluster`` names, ready to use over ``bus``.

    ``local`` keeps its records on ``bus``'s NATS server. ``kubernetes`` talks to the
    cluster it runs in (or ``$KUBECONFIG``'s) and raises :class:`BackendError` where it
    finds none; its controller (the scaler's) gives each pod a NATS user of its own
    made by ``pod_users``, where given.
    """
    if settings.cluster == "local":
        return await LocalBackend.open(bus)
    # The official client takes seconds to import on a loaded machine: imported in a
    # thread, so the event loop goes on answering the NATS server's pings meanwhile (a
    # loop held that long has its connection closed as stale).
    module = await asyncio.to_thread(importlib.import_module, _KUBERNETES_BACKEND)
    backend: ClusterBackend = await module.KubernetesBackend.open(bus, settings, pod_users)
    return backend
