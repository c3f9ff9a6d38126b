"""The namespaces an install serves, as lists and watches of a namespaced kind.

An install serves every namespace (``KubeApi.namespaces`` None): one list-and-watch of
the whole cluster (``list_pod_for_all_namespaces``, ``list_cluster_custom_object``),
which RBAC grants through a ClusterRole. Given namespaces (``RESURGE_KUBE_NAMESPACES``),
one list-and-watch per namespace, which a Role in each of them can grant: what they
yield is merged, with one ``SYNCED`` once every namespace's first list is in (each later
relist's is passed on as it comes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from resurge.cluster.kubernetes.api import CRD_GROUP, CRD_PLURAL, CRD_VERSION, KubeApi, json_of
from resurge.cluster.kubernetes.watch import SYNCED, Change, drain, follow

__all__ = ["Served"]


class Served:
    """The namespaced objects of the namespaces ``kube`` serves."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    def serves(self, namespace: str) -> bool:
        """Whether the install serves ``namespace``."""
        return self.kube.namespaces is None or namespace in self.kube.namespaces

    def training_jobs(self) -> AsyncGenerator[Change, None]:
        """Every TrainingJob, then each change (:func:`.watch.follow`)."""
        where = self.kube.namespaces
        if where is None:
            return follow(
                self.kube.custom.list_cluster_custom_object,
                group=CRD_GROUP,
                version=CRD_VERSION,
                plural=CRD_PLURAL,
            )
        return _merged(
            {
                namespace: follow(
                    self.kube.custom.list_namespaced_custom_object,
                    group=CRD_GROUP,
                    version=CRD_VERSION,
                    namespace=namespace,
                    plural=CRD_PLURAL,
                )
                for namespace in where
            }
        )

    def pods(self, label_selector: str) -> AsyncGenerator[Change, None]:
        """Every pod ``label_selector`` selects, then each change."""
        where = self.kube.namespaces
        if where is None:
            return follow(self.kube.core.list_pod_for_all_namespaces, label_selector=label_selector)
        return _merged(
            {
                namespace: follow(
                    self.kube.core.list_namespaced_pod,
                    namespace=namespace,
                    label_selector=label_selector,
                )
                for namespace in where
            }
        )

    async def labelled(self, what: str, selector: str) -> list[dict[str, Any]]:
        """The pods or Services (``what``) that ``selector`` selects."""
        if self.kube.namespaces is not None:
            found: list[dict[str, Any]] = []
            for namespace in self.kube.namespaces:
                found += await self.labelled_in(what, namespace, selector)
            return found
        fn = (
            self.kube.core.list_pod_for_all_namespaces
            if what == "pods"
            else self.kube.core.list_service_for_all_namespaces
        )
        listed = await self.kube.call(
            f"list {what} of {selector}", fn, label_selector=selector, _preload_content=False
        )
        return list(json_of(listed).get("items") or [])

    async def labelled_in(self, what: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods or Services (``what``) of ``namespace`` that ``selector`` selects."""
        fn = (
            self.kube.core.list_namespaced_pod
            if what == "pods"
            else self.kube.core.list_namespaced_service
        )
        listed = await self.kube.call(
            f"list {what} of {selector} in {namespace}",
            fn,
            namespace,
            label_selector=selector,
            _preload_content=False,
        )
        return list(json_of(listed).get("items") or [])


async def _merged(
    streams: dict[str, AsyncGenerator[Change, None]],
) -> AsyncGenerator[Change, None]:
    """What each namespace's stream yields, as it comes; one SYNCED once each has
    synced, then each later one."""
    queue: asyncio.Queue[tuple[str, Change]] = asyncio.Queue()
    unsynced = set(streams)

    async def one(namespace: str, stream: AsyncGenerator[Change, None]) -> None:
        async with contextlib.aclosing(stream) as changes:
            async for change in changes:
                await queue.put((namespace, change))

    producers = [one(namespace, stream) for namespace, stream in streams.items()]
    async with contextlib.aclosing(drain(queue, producers)) as merged:
        async for namespace, (kind, obj) in merged:
            if kind == SYNCED and unsynced:
                unsynced.discard(namespace)
                if unsynced:
                    continue
            yield kind, obj
