"""What of a TrainingJob's spec can change once the job exists, as CEL rules in its CRD.

:data:`MUTABLE` names the spec fields a running job takes when its spec is edited: what
the scaler applies to a running job submitted again
(:func:`~resurge.control.decisions.admission.update_live`), and nothing else. Every other
field of ``spec`` is immutable: :func:`immutable_fields` gives a model's
``json_schema_extra``, which adds to the model's schema one CEL transition rule per
immutable field (``x-kubernetes-validations``, as Kubeflow Trainer makes its fields
immutable), so the API server refuses the edit instead of resurge ignoring it. A rule
covers the field's presence as well as its value, so an optional field can be neither
added nor removed (the patterns of "Enforce CRD Immutability with CEL Transition Rules",
kubernetes.io/blog/2022/09/29/enforce-immutability-using-cel). Transition rules run on
updates only: creating a TrainingJob is never refused by them.

A field whose children are partly mutable gets no rule of its own; its model gets rules
for its immutable children (the model passes :func:`immutable_fields` its own path).

The API server's CEL cannot see inside a free-form object (``spec.template``, which
preserves unknown fields), so a change to its contents passes the rule there; resurge
reads the template only when it creates a pod.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MUTABLE", "immutable_fields", "immutable_rule"]

# Dotted camelCase paths from the TrainingJob's root.
MUTABLE: frozenset[str] = frozenset({"spec.monitoring", "spec.replicas.max", "spec.suspend"})


def immutable_rule(where: str, name: str) -> dict[str, str]:
    """The CEL transition rule that keeps field ``name`` of the object at ``where`` as it
    was: present or absent as before, and if present, equal."""
    field = f"self.{name}"
    old = f"oldSelf.{name}"
    return {
        "rule": f"has({field}) == has({old}) && (!has({field}) || {field} == {old})",
        "message": f"{where}.{name} is immutable: delete the TrainingJob and create it again",
    }


def immutable_fields(where: str) -> Callable[[dict[str, Any]], None]:
    """A ``json_schema_extra`` for the model at path ``where`` (e.g. ``spec``): one rule
    (:func:`immutable_rule`) per property of its schema that is neither in
    :data:`MUTABLE` nor holds a mutable field; none at all when nothing below ``where``
    is mutable (its parent's rule covers it whole)."""

    def extra(schema: dict[str, Any]) -> None:
        below = [path for path in MUTABLE if path.startswith(f"{where}.")]
        if not below:
            return
        rules = [
            immutable_rule(where, name)
            for name in schema.get("properties", {})
            if not any(path == f"{where}.{name}" or path.startswith(f"{where}.{name}.")
                       for path in below)
        ]  # fmt: skip
        if rules:
            schema["x-kubernetes-validations"] = rules

    return extra
