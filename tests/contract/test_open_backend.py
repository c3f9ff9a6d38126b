"""open_backend: the backend RESURGE_CLUSTER names, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from resurge.cluster import BackendError, open_backend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings


async def test_local_is_the_default(bus: Bus, settings: Settings) -> None:
    assert settings.cluster == "local"
    assert (await open_backend(bus, settings)).name == "local"


async def test_kubernetes_without_a_cluster_to_talk_to_is_a_clear_error(
    bus: Bus, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RESURGE_CLUSTER", "kubernetes")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    chosen = Settings(nats_url=settings.nats_url, namespace=settings.namespace)
    assert chosen.cluster == "kubernetes"
    with pytest.raises(BackendError, match=r"no cluster to talk to.*KUBECONFIG"):
        await open_backend(bus, chosen)


def test_an_unknown_cluster_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESURGE_CLUSTER", "nomad")
    with pytest.raises(pydantic.ValidationError, match="cluster"):
        Settings()
