"""Contract: cordon and uncordon."""

from __future__ import annotations

import pytest

from resurge.cluster import ClusterBackend, NodeInfo, UnknownNodeError
from tests.contract.helpers import node


async def listed(backend: ClusterBackend, name: str) -> NodeInfo:
    return next(n for n in await backend.list_nodes() if n.name == name)


async def test_cordon_keeps_its_first_reason_until_uncordoned(backend: ClusterBackend) -> None:
    await backend.report_node(node("n1"))
    await backend.report_node(node("n2"))
    await backend.cordon("n1", reason="XID 79 on GPU 0")
    one = await listed(backend, "n1")
    assert one.cordoned and not one.schedulable and one.cordon_reason == "XID 79 on GPU 0"
    assert (await listed(backend, "n2")).schedulable  # only that node

    await backend.cordon("n1", reason="cordoned by hand")
    assert (await listed(backend, "n1")).cordon_reason == "XID 79 on GPU 0"

    await backend.report_node(node("n1"))  # its monitor's heartbeat
    one = await listed(backend, "n1")
    assert one.cordoned and not one.schedulable and one.cordon_reason == "XID 79 on GPU 0"

    await backend.uncordon("n1")
    one = await listed(backend, "n1")
    assert not one.cordoned and one.schedulable and one.cordon_reason == ""
    await backend.uncordon("n1")  # idempotent
    assert (await listed(backend, "n1")).schedulable

    await backend.cordon("n1", reason="again")  # a new cordon takes its own reason
    assert (await listed(backend, "n1")).cordon_reason == "again"


@pytest.mark.parametrize("call", ["cordon", "uncordon"])
async def test_an_unknown_node_is_refused_naming_the_known_ones(
    backend: ClusterBackend, call: str
) -> None:
    await backend.report_node(node("n2"))
    await backend.report_node(node("n1"))
    with pytest.raises(UnknownNodeError) as raised:
        await getattr(backend, call)("n9")
    assert isinstance(raised.value, LookupError)
    assert "'n9'" in str(raised.value) and "n1, n2" in str(raised.value)
    assert not any(n.cordoned for n in await backend.list_nodes())
