"""Signs that another controller is about to evict a node's pods (pure)."""

from __future__ import annotations

import pytest

from resurge.cluster import NodeInfo, Taint
from resurge.control.decisions.eviction_signs import eviction_sign


def node(*taints: Taint, cordoned: bool = False, reason: str = "") -> NodeInfo:
    return NodeInfo(name="n1", slots=8, taints=list(taints), cordoned=cordoned,
                    cordon_reason=reason)  # fmt: skip


@pytest.mark.parametrize(
    ("listed", "said"),
    [
        (node(Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")),
         "NoExecute taint node.kubernetes.io/unreachable"),
        (node(Taint(key="nvidia.com/gpu-xid", value="79", effect="NoExecute")),
         "NoExecute taint nvidia.com/gpu-xid=79"),
        (node(Taint(key="karpenter.sh/disrupted", effect="NoSchedule")),
         "Karpenter disrupts it (taint karpenter.sh/disrupted)"),
        (node(Taint(key="karpenter.sh/disruption", value="disrupting", effect="NoSchedule")),
         "Karpenter disrupts it (taint karpenter.sh/disruption)"),
        (node(cordoned=True), "cordoned by another controller"),
    ],
)  # fmt: skip
def test_signs_of_an_eviction_say_what_they_are(listed: NodeInfo, said: str) -> None:
    assert eviction_sign(listed) == said


@pytest.mark.parametrize(
    "listed",
    [
        node(),
        node(Taint(key="nvidia.com/gpu", effect="NoSchedule")),
        node(Taint(key="resurge.dev/unhealthy", value="true", effect="NoExecute")),
        node(cordoned=True, reason="quarantined: score 3.00 >= 2.5"),
        node(cordoned=True, reason="cordoned by hand"),
    ],
)
def test_resurge_s_own_cordons_and_plain_taints_are_no_sign(listed: NodeInfo) -> None:
    assert eviction_sign(listed) is None
