"""Which accelerator a job's pods request on Kubernetes: pure functions, no I/O.

A worker process takes one device of the job's accelerator resource, an extended
resource of the cluster (``nvidia.com/gpu``, a MIG profile such as
``nvidia.com/mig-1g.10gb``, ``amd.com/gpu``, ``aws.amazon.com/neuroncore``, ...). It is,
in this order:

- ``spec.accelerator``, where the job names one;
- else the accelerator resource the first container of ``spec.template`` names in its
  ``resources.limits`` or ``resources.requests`` (as a HyperPod or Kubeflow manifest
  does), one of :data:`KNOWN_ACCELERATORS` (or a MIG profile): other extended resources
  of the template (an EFA interface, ``vpc.amazonaws.com/efa``) are the pod's own and
  no accelerator;
- else none: a CPU-only job, whose pods request no accelerator.

resurge sets the count itself (``nprocPerNode`` per pod, requests and limits alike):
a template's count other than a whole number (an unexpanded ``$GPU_PER_NODE``) is
replaced; a whole number must be ``nprocPerNode``, or 0, which asks for none (the pods
keep the template's 0, as a CPU-only job's). A template naming two accelerators, one
other than ``spec.accelerator``, or a count of devices that is not one per worker
process (Trainium's ``aws.amazon.com/neuron: 16`` for 32 processes: one device holds two
cores, and ``aws.amazon.com/neuroncore`` counts one per process) is an error
(:func:`accelerator_problem`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "ACCELERATOR_PATTERN",
    "KNOWN_ACCELERATORS",
    "accelerator_problem",
    "is_accelerator",
    "job_accelerator",
    "template_accelerators",
]

# The device plugins' resource names of accelerators (NVIDIA, AMD, AWS Neuron, Intel
# Gaudi and GPUs, Google TPUs); NVIDIA's MIG profiles are nvidia.com/mig-<profile>.
KNOWN_ACCELERATORS = frozenset(
    {
        "nvidia.com/gpu",
        "amd.com/gpu",
        "aws.amazon.com/neuron",
        "aws.amazon.com/neuroncore",
        "aws.amazon.com/neurondevice",
        "habana.ai/gaudi",
        "gpu.intel.com/i915",
        "gpu.intel.com/xe",
        "google.com/tpu",
    }
)
_MIG_PREFIX = "nvidia.com/mig-"

# An extended resource name: a DNS subdomain, a slash, a name; outside kubernetes.io
# (checked apart: the CRD's patterns are RE2, without lookahead). "Extended resources",
# kubernetes.io/docs/concepts/configuration/manage-resources-containers/.
ACCELERATOR_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_NAME = re.compile(ACCELERATOR_PATTERN)


def _extended(name: str) -> bool:
    """Whether ``name`` is an extended resource's name."""
    domain = name.split("/", 1)[0]
    return bool(_NAME.match(name)) and not (
        domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    )


def is_accelerator(resource: str) -> bool:
    """Whether ``resource`` is a known accelerator's resource name (a MIG profile too)."""
    return resource in KNOWN_ACCELERATORS or resource.startswith(_MIG_PREFIX)


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def template_accelerators(template: object) -> list[str]:
    """The accelerator resources the template's first container requests or limits,
    sorted."""
    containers = _mapping(_mapping(template).get("spec")).get("containers")
    first = containers[0] if isinstance(containers, list) and containers else {}
    resources = _mapping(_mapping(first).get("resources"))
    named = {
        str(name)
        for kind in ("limits", "requests")
        for name in _mapping(resources.get(kind))
        if is_accelerator(str(name))
    }
    return sorted(named)


def _counts(template: object, resource: str) -> dict[str, int]:
    """The whole-number counts of ``resource`` the template's first container gives, by
    ``limits``/``requests`` (another value, such as ``$GPU_PER_NODE``, is left out)."""
    containers = _mapping(_mapping(template).get("spec")).get("containers")
    first = containers[0] if isinstance(containers, list) and containers else {}
    resources = _mapping(_mapping(first).get("resources"))
    counts = {}
    for kind in ("limits", "requests"):
        value = _mapping(resources.get(kind)).get(resource)
        if isinstance(value, int | str) and str(value).isdigit():
            counts[kind] = int(value)
    return counts


def accelerator_problem(
    accelerator: str | None, template: object, nproc: int | None = None
) -> str | None:
    """What is wrong with a job's ``spec.accelerator``, ``spec.template`` and
    ``nprocPerNode`` (``nproc``) together, in a sentence naming the fields; None where
    nothing is."""
    if accelerator is not None and not _extended(accelerator):
        return (
            f"spec.accelerator {accelerator!r} is not an extended resource name "
            "(domain/name outside kubernetes.io, e.g. nvidia.com/gpu, amd.com/gpu, "
            "aws.amazon.com/neuroncore, nvidia.com/mig-1g.10gb)"
        )
    named = template_accelerators(template)
    where = "spec.template.spec.containers[0].resources"
    if len(named) > 1:
        return (
            f"{where} names {len(named)} accelerators ({', '.join(named)}): a worker "
            "process takes one device of one; keep one"
        )
    if accelerator is not None and named and named[0] != accelerator:
        return (
            f"spec.accelerator is {accelerator} but {where} names {named[0]}: give one, "
            "or the same in both"
        )
    for kind, count in (_counts(template, named[0]) if named and nproc else {}).items():
        if count not in (0, nproc):
            return (
                f"{where}.{kind}[{named[0]}] is {count} but nprocPerNode is {nproc}: each "
                "worker process takes one device, so they must be equal (on Trainium, "
                "aws.amazon.com/neuroncore counts one per process), or 0 for none"
            )
    return None


def job_accelerator(spec: object) -> str | None:
    """The accelerator resource of a job's spec (a TrainingJob's ``spec`` as JSON, the
    module docstring's order); None for a CPU-only job."""
    spec = _mapping(spec)
    chosen = spec.get("accelerator")
    if isinstance(chosen, str) and chosen:
        return chosen
    template = spec.get("template")
    named = template_accelerators(template)
    if not named:
        return None
    counts = _counts(template, named[0]).values()
    return None if counts and not any(counts) else named[0]  # 0: it asks for none
