"""Node heartbeats as ``coordination.k8s.io/v1`` Leases, as the kubelet's node leases do
(KEP-589): pure functions, no I/O.

Each node's monitor holds one Lease in resurge's namespace (:func:`lease_name`, a valid
DNS subdomain derived from the node's name; label ``resurge.dev/node``; holder: the
node's name) and renews it every few seconds: ``spec.renewTime`` is the monitor's
heartbeat, ``spec.leaseDurationSeconds`` the node timeout. A heartbeat changes only this
small object, not the Node, so no Node watcher hears of it.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any

from resurge.cluster.kubernetes.times import micro_time, parse_time

__all__ = [
    "NODE_LABEL",
    "holder",
    "lease_manifest",
    "lease_name",
    "node_label_value",
    "renew",
    "renewed_at",
]

NODE_LABEL = "resurge.dev/node"
_PREFIX = "resurge-node-"
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_MAX_NAME = 253
_MAX_LABEL = 63
_HASH = 10


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH]


def lease_name(node: str) -> str:
    """``resurge-node-<node>``; where that is no valid DNS subdomain (too long, or
    characters a subdomain lacks), a valid form of it ending in a hash of the name."""
    name = _PREFIX + node
    if len(name) <= _MAX_NAME and _SUBDOMAIN.fullmatch(name):
        return name
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", name.lower())
    return f"{cleaned[: _MAX_NAME - _HASH - 1].rstrip('.-')}-{_digest(node)}"


def node_label_value(node: str) -> str:
    """The node's name as a label value (at most 63 characters, alphanumeric ends), hashed
    where the name itself is none."""
    if len(node) <= _MAX_LABEL and _LABEL_VALUE.fullmatch(node):
        return node
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", node)
    head = cleaned[: _MAX_LABEL - _HASH - 1].strip("._-")
    return f"{head}-{_digest(node)}" if head else _digest(node)


def lease_manifest(node: str, renewed: datetime, duration_seconds: int) -> dict[str, Any]:
    """A new Lease of ``node``, renewed at ``renewed``."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(node),
            "labels": {NODE_LABEL: node_label_value(node)},
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro_time(renewed),
        },
    }


def renew(lease: dict[str, Any], node: str, renewed: datetime, duration: int) -> dict[str, Any]:
    """``lease`` (as read, with its ``resourceVersion``) renewed at ``renewed``: the body of
    the update that fails with 409 if the Lease changed since it was read."""
    fresh = lease_manifest(node, renewed, duration)
    meta = dict(lease.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **fresh["metadata"]["labels"]}
    return {**lease, "metadata": meta, "spec": {**(lease.get("spec") or {}), **fresh["spec"]}}


def holder(lease: dict[str, Any]) -> str | None:
    """The node a Lease is the heartbeat of."""
    value = (lease.get("spec") or {}).get("holderIdentity")
    return value if isinstance(value, str) and value else None


def renewed_at(lease: dict[str, Any]) -> datetime | None:
    """When the Lease was last renewed; None if it never was (or says so unreadably)."""
    return parse_time((lease.get("spec") or {}).get("renewTime"))
