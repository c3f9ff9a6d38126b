"""How a job's pods wait for its checkpoint when others evict them: pure functions, no I/O.

Others drain nodes in two ways, and each is held off a while so that resurge, which
sees the sign (a cordon, a ``NoExecute`` taint, Karpenter's disruption taint) and drains
the node itself, checkpoints each job there before its pods go:

- **The Eviction API** (``kubectl drain``, Karpenter, cluster upgrades): each job has a
  PodDisruptionBudget (policy/v1, :func:`disruption_budget`) that allows no eviction of
  its worker pods: ``minAvailable`` is the number of its worker groups, so the API
  server answers every eviction 429 while they run, and the evictor tries again.
  resurge's drain checkpoints the job and then moves it by deleting its pods, which no
  budget governs, so the evictor's next try finds them gone. The job's
  ``elastic.checkpointTimeoutSeconds`` bounds the hold (the drain moves the job then,
  from its newest complete checkpoint). ``minAvailable``, not ``maxUnavailable: 0``:
  the disruption controller works out ``maxUnavailable`` from the owner's scale
  subresource, which a TrainingJob has not ("Arbitrary workloads and PDBs" in the
  Kubernetes docs: an integer ``minAvailable`` only). The budget selects the job's worker
  pods (``resurge.dev/job``, not its demand pods, which make room for it and may go), is
  owned by the TrainingJob (it goes with it) and lets a pod that is not Ready be evicted
  (``unhealthyPodEvictionPolicy: AlwaysAllow``: it holds no training progress).
- **A NoExecute taint** (a node-problem detector, the node lifecycle controller, an
  operator) evicts through the taint manager, which no budget governs: each worker pod
  tolerates every ``NoExecute`` taint for :func:`no_execute_seconds` (the job's
  checkpoint deadline plus :data:`NOTICE_SECONDS`, the time resurge takes to see the
  taint and ask), after the template's own tolerations, so a template that tolerates
  a taint longer keeps it. It replaces Kubernetes' default 300 s for
  ``node.kubernetes.io/not-ready`` and ``unreachable``: their pods go after that time
  too, as their job was moved off the node by then.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from resurge.jobspec.elastic import ElasticSpec, fold_elastic_policy

__all__ = [
    "NOTICE_SECONDS",
    "budget_name",
    "checkpoint_deadline",
    "disruption_budget",
    "no_execute_seconds",
    "no_execute_toleration",
]

# Time for resurge to see a NoExecute taint (the restarter's Node watch) and ask the
# job's checkpoint, on top of the job's checkpoint deadline.
NOTICE_SECONDS = 30


def budget_name(training_job: Mapping[str, Any]) -> str:
    """The job's PodDisruptionBudget's name: its TrainingJob's (a DNS subdomain both)."""
    return str(training_job["metadata"]["name"])


def disruption_budget(
    training_job: Mapping[str, Any],
    selector: dict[str, Any],
    groups: int,
    owner: dict[str, Any],
) -> dict[str, Any]:
    """The PodDisruptionBudget of a job with ``groups`` worker groups (module docstring):
    its pods are those ``selector`` (a LabelSelector) selects; ``owner`` is the owner
    reference to its TrainingJob."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": budget_name(training_job),
            "labels": dict(selector.get("matchLabels") or {}),
            "ownerReferences": [owner],
        },
        "spec": {
            "minAvailable": groups,
            "selector": selector,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def checkpoint_deadline(job_spec: Mapping[str, Any] | None) -> float:
    """The job's ``elastic.checkpointTimeoutSeconds`` (HyperPod's
    ``elasticPolicy.gracefulShutdownTimeoutInSeconds`` too); the default where the spec
    does not say or cannot be read."""
    try:
        folded = fold_elastic_policy(dict(job_spec or {}))
        return ElasticSpec.model_validate(folded.get("elastic") or {}).checkpoint_timeout_seconds
    except (ValueError, TypeError, AttributeError):  # a spec the submission refuses anyway
        return ElasticSpec().checkpoint_timeout_seconds


def no_execute_seconds(job_spec: Mapping[str, Any] | None) -> int:
    """How long the job's pods stay on a node after a ``NoExecute`` taint."""
    return math.ceil(checkpoint_deadline(job_spec)) + NOTICE_SECONDS


def no_execute_toleration(job_spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The toleration of every ``NoExecute`` taint for :func:`no_execute_seconds`."""
    return {
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": no_execute_seconds(job_spec),
    }
