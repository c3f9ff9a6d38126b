"""The ``trainingjobs.resurge.dev`` CustomResourceDefinition, generated from the models.

:func:`training_job_crd` returns the CRD (``apiextensions.k8s.io/v1``) as a dict: group
``resurge.dev``, version ``v1alpha1``, kind ``TrainingJob``, plural ``trainingjobs``,
short name ``tj``, namespaced. Its ``openAPIV3Schema`` is :class:`TrainingJob`'s JSON
Schema made structural (:mod:`resurge.jobspec.structural`), so the models stay the one
source of truth; ``resurge schema --crd`` writes it to deploy/crds/trainingjobs.yaml.

What the CRD accepts, and why it differs from :func:`~resurge.jobspec.parse_job`:

- Only resurge's own spellings, the camelCase names ``resurge schema`` publishes. The
  other spellings the models accept (HyperPod's ``scaleUpSnoozeTimeInSeconds``,
  ``logMonitoringConfiguration``, ``faultyScaleDownTimeoutInSeconds`` and the rest,
  the ``elasticPolicy`` and ``restartPolicy`` blocks, snake_case names) are not in the
  schema: a structural schema has one schema per field name, cannot say "one of these
  two names", and defaults filled in under one name would clash with a value given
  under the other. Kubernetes prunes an unknown field, or rejects it where strict field
  validation is on (kubectl's default); ``resurge convert`` rewrites a HyperPod
  manifest into these names.
- ``metadata`` is Kubernetes' own: the schema only restricts ``metadata.name`` to the
  job-name pattern, as Kubernetes allows nothing else there.
- Rules across fields (``replicas.max >= min``, ``step`` or ``discrete``, ladder
  order, regular expressions that compile, log rules that check something) are the
  models' alone: the API server checks each field, resurge checks the whole job when
  it reads it (:func:`~resurge.jobspec.parse_job`).
- ``status.restarts`` and ``spec.recovery.maxRestartsPerLevel`` map recovery levels to
  counts: they have one property per level, so an unknown level is pruned.
- Defaults are the models' own, except where Kubernetes forbids them: none on
  ``apiVersion``, ``kind`` or ``metadata``, and none that is ``null``.

The ``status`` subresource is on: ``status`` is written by resurge alone, and a user's
``status`` on create or update is ignored, as docs/jobspec.md says.

There is no ``scale`` subresource. It maps ``kubectl scale`` and autoscalers onto one
integer in ``spec`` that is *the* wanted replica count. The spec has none: ``replicas``
holds bounds (``min``, ``max``, ``step``, ``discrete``) and the scaler picks the size
within them (``status.replicas.target``). ``specReplicasPath: .spec.replicas.min``
would turn ``kubectl scale --replicas=2`` into a new floor, which can put ``min`` above
``max`` or make a fixed-size job elastic; ``.spec.replicas.max`` would lower the
ceiling of a fixed-size job below its ``min``. Neither is scaling, so scale waits for a
spec field that means the wanted size.

Printer columns: phase, replicas (current), target, generation, restarts, last
recovery seconds and age. A printer column's JSONPath cannot sum a map, so the
``Restarts`` column shows the ``status.restarts`` map itself, which ``kubectl get``
prints as compact JSON (``{"node":1,"process":2}``).
"""

from __future__ import annotations

from typing import Any

from resurge.jobspec.job import TrainingJob
from resurge.jobspec.structural import structural_schema

__all__ = ["CRD_NAME", "GROUP", "KIND", "PLURAL", "SHORT_NAMES", "VERSION", "training_job_crd"]

GROUP = "resurge.dev"
VERSION = "v1alpha1"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SHORT_NAMES = ("tj",)
CRD_NAME = f"{PLURAL}.{GROUP}"

_PRINTER_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("Phase", "string", ".status.phase", "Where the job is now."),
    ("Replicas", "integer", ".status.replicas.current", "Replicas running now."),
    ("Target", "integer", ".status.replicas.target", "Replicas the scaler wants."),
    ("Generation", "integer", ".status.generation", "Every restart or resize adds one."),
    (
        "Restarts",
        "string",
        ".status.restarts",
        "Restarts so far at each recovery level, as a JSON map.",
    ),
    (
        "Last Recovery Seconds",
        "number",
        ".status.lastRecoverySeconds",
        "Seconds from the latest fault to the first progress report after it.",
    ),
    ("Age", "date", ".metadata.creationTimestamp", "Time since the job was created."),
)


def _openapi_schema() -> dict[str, Any]:
    schema = structural_schema(TrainingJob.model_json_schema(by_alias=True, mode="validation"))
    properties = schema["properties"]
    for name in ("apiVersion", "kind"):
        properties[name].pop("default", None)
    name = properties["metadata"]["properties"]["name"]
    properties["metadata"] = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": name["pattern"]}},
    }
    return schema


def training_job_crd() -> dict[str, Any]:
    """The TrainingJob CustomResourceDefinition, as ``kubectl apply`` takes it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": list(SHORT_NAMES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path, "description": text}
                        for name, kind, path, text in _PRINTER_COLUMNS
                    ],
                }
            ],
        },
    }
