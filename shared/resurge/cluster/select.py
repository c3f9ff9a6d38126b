"""The one place a cluster backend is chosen: :func:`open_backend` by ``RESURGE_CLUSTER``.

Services, the CLI and the local cluster call it and then speak only
:class:`~resurge.cluster.protocol.ClusterBackend`; none names a backend class.
"""

from __future__ import annotations

from resurge.cluster.local import LocalBackend
from resurge.cluster.protocol import BackendError, ClusterBackend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

__all__ = ["open_backend"]


async def open_backend(bus: Bus, settings: Settings) -> ClusterBackend:
    """The backend ``settings.cluster`` names, ready to use over ``bus``.

    ``local`` keeps its records on ``bus``'s NATS server. ``kubernetes`` raises
    :class:`BackendError`: that backend is not built yet.
    """
    if settings.cluster == "local":
        return await LocalBackend.open(bus)
    raise BackendError(
        f"RESURGE_CLUSTER={settings.cluster}: the Kubernetes backend is not built yet; "
        "only 'local' is available"
    )
