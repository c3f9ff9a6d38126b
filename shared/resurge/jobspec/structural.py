"""A pydantic JSON Schema made into a Kubernetes *structural* OpenAPI v3 schema.

:func:`structural_schema` takes what ``model_json_schema(by_alias=True,
mode="validation")`` returns and gives back a schema a CustomResourceDefinition's
``openAPIV3Schema`` accepts (Kubernetes' structural-schema rules):

- every ``$ref`` is inlined from ``$defs`` (a field's own description wins over its
  model's docstring), and ``$defs`` is dropped;
- ``anyOf: [X, {type: null}]`` (pydantic's ``Optional``) becomes ``X`` with
  ``nullable: true``; ``anyOf`` an integer or a string (a size given as ``8Gi`` or in
  bytes) becomes ``x-kubernetes-int-or-string: true``, nullable where ``null`` is
  among them; any other ``anyOf``, ``oneOf`` or ``allOf`` is an error, as it could not
  be structural;
- ``const`` becomes a one-value ``enum``; a numeric ``exclusiveMinimum`` or
  ``exclusiveMaximum`` (JSON Schema 2020-12) becomes ``minimum``/``maximum`` with the
  boolean flag (OpenAPI 3.0);
- ``additionalProperties: true`` (a free map, ``dict[str, Any]``) becomes
  ``x-kubernetes-preserve-unknown-fields: true``; ``additionalProperties: false``
  (``extra="forbid"``) is dropped, as Kubernetes forbids it: unknown fields are pruned,
  or rejected by strict field validation; a typed map keeps its value schema;
- a map whose keys are an enum (``propertyNames``) becomes an object with one property
  per key, since OpenAPI 3.0 has no ``propertyNames``;
- ``examples`` becomes ``example`` (the first); ``title`` is dropped; a ``null``
  default is dropped (leaving the field out means the same);
- every node must end up with a ``type`` (or preserve unknown fields, or be an
  int-or-string);
- the Kubernetes extensions a model gives in ``json_schema_extra`` are kept:
  ``x-kubernetes-validations`` (CEL rules, each a ``rule`` and a ``message``),
  ``x-kubernetes-list-type`` (``atomic``, ``set`` or ``map``) and
  ``x-kubernetes-list-map-keys``; one of another shape is an error.

Any keyword not listed here is an error naming where it is, so a model that cannot be
a structural schema fails when the CRD is generated, not when a cluster rejects it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["StructuralSchemaError", "structural_schema"]

# Keywords that mean the same in pydantic's JSON Schema and a structural schema.
_AS_THEY_ARE = frozenset(
    {
        "default",
        "description",
        "enum",
        "format",
        "maxItems",
        "maxLength",
        "maximum",
        "minItems",
        "minLength",
        "minimum",
        "multipleOf",
        "pattern",
        "required",
        "type",
    }
)
_DROPPED = frozenset({"title", "$defs"})
_LIST_TYPES = frozenset({"atomic", "set", "map"})
_EXCLUSIVE = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


class StructuralSchemaError(ValueError):
    """A JSON Schema that cannot become a structural schema; the message names where."""


def structural_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 form of a pydantic model's JSON Schema.

    Raises:
        StructuralSchemaError: a node uses a keyword or a union a structural schema
            cannot express, or ends up without a type; the message names its path.
    """
    return _Converter(schema.get("$defs", {})).node(schema, "(root)")


class _Converter:
    def __init__(self, definitions: Mapping[str, Any]) -> None:
        self._definitions = definitions

    def node(self, schema: Mapping[str, Any], where: str) -> dict[str, Any]:
        merged = self._flattened(schema, where)
        out: dict[str, Any] = {}
        for key, value in merged.items():
            self._keyword(out, key, value, where)
        if merged.get("propertyNames") is not None:
            out = self._enum_keyed_map(out, merged["propertyNames"], where)
        typeless = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
        if "type" not in out and not any(out.get(key) for key in typeless):
            raise StructuralSchemaError(f"{where}: has no type, which a structural schema needs")
        return out

    def _flattened(self, schema: Mapping[str, Any], where: str) -> dict[str, Any]:
        """``schema`` with its ``$ref`` inlined and its ``Optional`` union unwrapped."""
        merged = dict(schema)
        if "$ref" in merged:
            merged = {**self._resolved(merged.pop("$ref"), where), **merged}
        if "allOf" in merged:
            parts = merged.pop("allOf")
            if len(parts) != 1:
                raise StructuralSchemaError(f"{where}: allOf of {len(parts)} schemas")
            merged = {**self._flattened(parts[0], where), **merged}
        if "anyOf" in merged:
            given = merged.pop("anyOf")
            branches = [branch for branch in given if branch != {"type": "null"}]
            nullable = {"nullable": True} if len(branches) < len(given) else {}
            if branches == _INT_OR_STRING:
                merged = {**merged, "x-kubernetes-int-or-string": True, **nullable}
            elif len(branches) == 1:
                merged = {**self._flattened(branches[0], where), **merged, **nullable}
            else:
                raise StructuralSchemaError(
                    f"{where}: anyOf of {len(branches)} non-null schemas is not structural"
                )
        if "oneOf" in merged or "not" in merged:
            raise StructuralSchemaError(f"{where}: oneOf and not are not supported")
        return merged

    def _resolved(self, ref: str, where: str) -> dict[str, Any]:
        name = ref.removeprefix("#/$defs/")
        if name == ref or name not in self._definitions:
            raise StructuralSchemaError(f"{where}: $ref {ref!r} is not in $defs")
        return dict(self._definitions[name])

    def _keyword(self, out: dict[str, Any], key: str, value: Any, where: str) -> None:
        if key == "properties":
            out[key] = {name: self.node(field, f"{where}.{name}") for name, field in value.items()}
        elif key == "items":
            out[key] = self.node(value, f"{where}[]")
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, Mapping):
                out[key] = self.node(value, f"{where}.*")
        else:
            out.update(_scalar_keyword(key, value, where))

    def _enum_keyed_map(
        self, out: dict[str, Any], names: Mapping[str, Any], where: str
    ) -> dict[str, Any]:
        keys = self._flattened(names, f"{where} keys").get("enum")
        values = out.pop("additionalProperties", None)
        if not keys or values is None:
            raise StructuralSchemaError(
                f"{where}: a map's keys can only be restricted to an enum of names"
            )
        return {**out, "properties": {str(key): dict(values) for key in keys}}


def _scalar_keyword(key: str, value: Any, where: str) -> dict[str, Any]:
    """What keyword ``key`` of a node becomes, for every keyword but the nested ones."""
    if key in _DROPPED or key == "propertyNames" or (key == "default" and value is None):
        return {}  # propertyNames is handled with the node's additionalProperties
    if key in _AS_THEY_ARE or key == "nullable":
        return {key: copy.deepcopy(value)}  # a copy: no two nodes share a value
    if key == "const":
        return {"enum": [value]}
    if key in _EXCLUSIVE:
        return {key: True} if isinstance(value, bool) else {_EXCLUSIVE[key]: value, key: True}
    if key == "examples":
        return {"example": value[0]} if value else {}
    if key.startswith("x-kubernetes-"):
        return {key: _extension(key, value, where)}
    raise StructuralSchemaError(f"{where}: keyword {key!r} has no structural form")


def _extension(key: str, value: Any, where: str) -> Any:
    """A Kubernetes extension keyword's value, checked for the shape Kubernetes takes."""
    if key == "x-kubernetes-list-type" and value in _LIST_TYPES:
        return value
    if key == "x-kubernetes-list-map-keys" and _strings(value) and value:
        return list(value)
    if key == "x-kubernetes-int-or-string" and value is True:
        return True
    if key == "x-kubernetes-validations" and _rules(value):
        return [dict(v) for v in value]
    raise StructuralSchemaError(f"{where}: {key} {value!r} is not a form Kubernetes takes")


def _rules(values: Any) -> bool:
    """Whether ``values`` is a list of CEL rules, each with its rule and message."""
    return (
        isinstance(values, list)
        and bool(values)
        and all(
            isinstance(v, Mapping) and _strings([v.get("rule"), v.get("message")]) for v in values
        )
    )


def _strings(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) and v for v in values)
