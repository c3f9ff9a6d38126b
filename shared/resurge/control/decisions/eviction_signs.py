"""Signs that a node's pods are about to be evicted by someone other than resurge (pure).

A drain that asks first (``resurge node drain``) checkpoints the jobs on a node before
they leave it. On Kubernetes others drain nodes too; :func:`eviction_sign` reads, from
how the cluster lists a node, whether its pods are about to go, and why:

- a ``NoExecute`` taint not resurge's own: the kubelet evicts pods that do not tolerate
  it (a node-problem detector, the node lifecycle controller's
  ``node.kubernetes.io/not-ready`` and ``unreachable``, an operator);
- Karpenter's disruption taint (``karpenter.sh/disrupted``; ``karpenter.sh/disruption``
  before v1): Karpenter drains the node next (consolidation, drift, expiry);
- a cordon by another controller: ``spec.unschedulable`` without resurge's own reason
  (``kubectl drain`` and cluster upgrades cordon first, then evict).

A cordon resurge made (a reason it wrote) is no sign: it moved or will move the jobs
itself. None where nothing says the pods will go.
"""

from __future__ import annotations

from resurge.cluster import NodeInfo

__all__ = ["KARPENTER_DISRUPTION_TAINTS", "eviction_sign"]

KARPENTER_DISRUPTION_TAINTS = ("karpenter.sh/disrupted", "karpenter.sh/disruption")
_RESURGE_TAINT_PREFIX = "resurge.dev/"


def eviction_sign(node: NodeInfo) -> str | None:
    """Why ``node``'s pods are about to be evicted, in words; None if nothing says so."""
    for taint in node.taints:
        if taint.key.startswith(_RESURGE_TAINT_PREFIX):
            continue
        if taint.key in KARPENTER_DISRUPTION_TAINTS:
            return f"Karpenter disrupts it (taint {taint.key})"
        if taint.effect == "NoExecute":
            return f"NoExecute taint {taint.key}" + (f"={taint.value}" if taint.value else "")
    if node.cordoned and not node.cordon_reason:
        return "cordoned by another controller"
    return None
