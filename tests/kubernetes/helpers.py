"""What the tests of the Kubernetes backend and its controller share: a TrainingJob to
create, waiting on the API emulator, the pods and Services of a job as the emulator
holds them, and the controller run in the test's process (started and stopped at
will). Their fixtures (``backend``, ``controller``, ``jobs``) are in conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from resurge.cluster import ClusterBackend

if TYPE_CHECKING:
    from tests.kubernetes.conftest import KubeApi

WAIT_SECONDS = 15.0


def training_job(name: str, **spec: Any) -> dict[str, Any]:
    """TrainingJob ``name`` in the default namespace: one replica of two processes,
    ``spec``'s fields over that."""
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "default", "labels": {"team": "nlp"}},
        "spec": {
            "command": ["python", "train.py"],
            "image": "registry/train:1",
            "nprocPerNode": 2,
            "replicas": {"min": 1, "max": 1},
            **spec,
        },
    }


async def until(what: str, check: Callable[[], Any]) -> Any:
    """Poll until ``check()`` (run in a thread: it may call the emulator, which answers
    at once) is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _labelled(api: KubeApi, kind: str, job: str) -> list[dict[str, Any]]:
    return [
        obj
        for obj in api.objects(kind, "default")
        if obj["metadata"].get("labels", {}).get("resurge.dev/job") == job
    ]


def pods_of(api: KubeApi, job: str) -> list[dict[str, Any]]:
    """The pods labelled as ``job``'s in the default namespace."""
    return _labelled(api, "pods", job)


def services_of(api: KubeApi, job: str) -> list[dict[str, Any]]:
    """The Services labelled as ``job``'s in the default namespace."""
    return _labelled(api, "services", job)


class Running:
    """The controller the scaler runs, in this process; stopped and started at will."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.backend = backend
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.backend.reconcile())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
