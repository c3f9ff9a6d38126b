"""Node Leases as objects: names and label values the API server accepts, and the
renewal time read back."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from resurge.cluster.kubernetes.node_lease import (
    NODE_LABEL,
    holder,
    lease_manifest,
    lease_name,
    node_label_value,
    renew,
    renewed_at,
)

# Kubernetes "Object Names and IDs": DNS subdomain names (RFC 1123), and the label
# value syntax of "Labels and Selectors".
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")

NODES = [
    "gpu-1",
    "ip-10-0-0-7.ec2.internal",
    "GPU_Node.7",
    "a" * 253,
    "node-" + "x" * 70,
    "-odd-",
]


@pytest.mark.parametrize("node", NODES)
def test_a_leases_name_and_label_are_valid_for_any_node_name(node: str) -> None:
    name = lease_name(node)
    assert len(name) <= 253 and SUBDOMAIN.fullmatch(name), name
    value = node_label_value(node)
    assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), value


def test_distinct_long_names_get_distinct_leases() -> None:
    assert lease_name("a" * 253) != lease_name("a" * 252 + "b")
    assert node_label_value("n" * 70) != node_label_value("n" * 69 + "m")
    assert lease_name("gpu-1") == "resurge-node-gpu-1" and node_label_value("gpu-1") == "gpu-1"


def test_a_renewal_keeps_the_lease_it_was_read_as_and_moves_its_time() -> None:
    first = datetime(2026, 12, 6, 1, 2, 3, 456789, tzinfo=UTC)
    lease = lease_manifest("gpu-1", first, 15)
    assert lease["metadata"]["labels"] == {NODE_LABEL: "gpu-1"}
    assert lease["spec"]["renewTime"] == "2026-12-06T01:02:03.456789Z"
    assert holder(lease) == "gpu-1" and renewed_at(lease) == first
    read = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "7", "uid": "u"}}
    later = datetime(2026, 12, 6, 1, 2, 8, tzinfo=UTC)
    renewed = renew(read, "gpu-1", later, 15)
    assert renewed["metadata"]["resourceVersion"] == "7"  # the update's precondition
    assert renewed["metadata"]["uid"] == "u"
    assert renewed_at(renewed) == later and renewed["spec"]["leaseDurationSeconds"] == 15


def test_an_unreadable_renewal_time_is_none() -> None:
    assert renewed_at({"spec": {"renewTime": "soon"}}) is None
    assert renewed_at({}) is None and holder({}) is None
