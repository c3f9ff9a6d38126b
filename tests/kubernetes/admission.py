"""What the API server does to an object before it stores it, as plain functions.

Custom resources, by their CRD's structural schema (the ``openAPIV3Schema`` of a version),
in the apiserver's order: decoding prunes and defaults, then validation runs.

- ``prune(schema, obj)``: drops every field the schema does not declare ("Field pruning",
  https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#field-pruning):
  an object's unknown properties, all of an object's fields when it declares no
  ``properties`` (unless ``additionalProperties`` gives the values' schema), and nothing
  under ``x-kubernetes-preserve-unknown-fields: true``. At the root (and under
  ``x-kubernetes-embedded-resource``) ``apiVersion`` and ``kind`` stay, and ``metadata``
  keeps what ObjectMeta has, as decoding into it does. Returns the pruned copy and the
  paths removed (``spec.foo``), which the apiserver reports as warnings or, with
  ``fieldValidation=Strict``, refuses.
- ``default(schema, obj)``: drops ``null`` where the schema is not ``nullable`` and fills
  in ``default:`` where a field is absent, into defaulted values too ("Defaulting",
  same page); none under the root's ``metadata``.
- ``validate(schema, obj, old=None)``: the schema's checks (type, enum, format, pattern,
  lengths, bounds, item and property counts, required, list-type uniqueness), then the
  CEL rules of ``x-kubernetes-validations`` ("Validation rules", same page) with ``self``
  and, where a rule uses it and there is an old value, ``oldSelf`` (transition rules are
  skipped on create and where the old object lacks the value); a rule at the root sees
  only ``name`` and ``generateName`` of ``metadata``. Where a type, an enum, a required
  field, a length or a count is wrong the CEL rules are not run, as the apiserver does.
  With ``old``, a value equal to its old value is not checked again, except by transition
  rules ("Validation ratcheting", same page). Returns the errors as the apiserver words
  them: ``spec.replicas.min: Invalid value: 0: spec.replicas.min in body should be
  greater than or equal to 1``. ``field_errors`` gives them as ``FieldError``s and
  ``admit`` does all three.

Names and metadata, for every kind ("Object Names and IDs",
https://kubernetes.io/docs/concepts/overview/working-with-objects/names/; "Labels and
Selectors"; "Annotations"; "Finalizers"): ``name_errors`` checks a name or
``generateName`` prefix as a DNS-1123 subdomain, an RFC 1123 label or an RFC 1035 label;
``metadata_errors`` checks labels and annotations, ``finalizer_errors`` finalizers,
``object_meta`` prunes ``metadata``, and ``pod_spec_errors`` checks what of a pod's spec
the emulator checks.

Not done: ``optionalOldSelf``, ``messageExpression``, CEL cost limits, the escaping of
property names that are CEL keywords or hold '-' or '.' (``__dash__``...), the Kubernetes
CEL libraries beyond CEL's standard one (``quantity``, ``url``, ``isSorted``...),
correlating old list items other than by ``x-kubernetes-list-map-keys``, and formats other
than date-time, date, uuid, byte, ipv4 and ipv6 (others pass, as unknown formats do).
"""

from __future__ import annotations

import base64
import binascii
import collections
import copy
import datetime
import functools
import ipaddress
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldError",
    "admit",
    "default",
    "field_errors",
    "finalizer_errors",
    "invalid_message",
    "metadata_errors",
    "name_errors",
    "object_meta",
    "pod_spec_errors",
    "prune",
    "validate",
]

# ObjectMeta's fields: what decoding a custom resource's metadata keeps.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")

_MISSING: Any = object()


# Kubernetes' field error types: the reason a Status cause carries, and how a message says it.
_ERROR_TYPES = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "InternalError": "Internal error",
    "FieldValueTypeInvalid": "Invalid value",
}
# Types whose message leaves the value out, as field.Error.ErrorBody does.
_WITHOUT_VALUE = frozenset(
    {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong", "InternalError"}
)


@dataclass(frozen=True)
class FieldError:
    """One field's error, as Kubernetes' ``field.Error``: ``path: Type[: value][: detail]``.

    ``reason`` is the error's type as a Status cause names it (``FieldValueInvalid``,
    ``FieldValueRequired``, ``FieldValueTypeInvalid``, ...).
    """

    path: str
    reason: str
    value: Any = _MISSING
    detail: str = ""

    @property
    def body(self) -> str:
        text = _ERROR_TYPES[self.reason]
        if self.reason not in _WITHOUT_VALUE and self.value is not _MISSING:
            text += f": {_shown(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def cause(self) -> dict[str, str]:
        """The error as a Status cause (``details.causes[]``)."""
        return {"reason": self.reason, "message": self.body, "field": self.path}

    def __str__(self) -> str:
        return f"{self.path}: {self.body}" if self.path else self.body


def _shown(value: Any) -> str:
    """A value as Go's ``%v``/``%q`` shows it in a field error."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def invalid_message(qualified_kind: str, name: str, errors: list[FieldError]) -> str:
    """The message of a 422 Invalid: ``Kind.group "name" is invalid: err`` or ``[e1, e2]``."""
    shown = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    return f'{qualified_kind} "{name}" is invalid: {shown}'


# -- paths --------------------------------------------------------------------------------


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _key(path: str, key: str) -> str:
    return f"{path}[{key}]"


def _index(path: str, index: int) -> str:
    return f"{path}[{index}]"


# -- pruning ------------------------------------------------------------------------------


def prune(schema: Mapping[str, Any], obj: Any, *, root: bool = True) -> tuple[Any, list[str]]:
    """``obj`` without the fields ``schema`` does not declare, and the paths removed.

    ``root`` says ``obj`` is a whole object (``apiVersion``, ``kind`` and ``metadata``
    are kept as decoding keeps them); pass ``False`` for a part, e.g. ``status`` with the
    status schema.
    """
    removed: list[str] = []
    return _prune(schema, copy.deepcopy(obj), "", root, removed), removed


def _prune(schema: Mapping[str, Any], value: Any, path: str, root: bool, removed: list[str]) -> Any:
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [
                _prune(items, item, _index(path, i), False, removed) for i, item in enumerate(value)
            ]
        return value
    if not isinstance(value, dict):
        return value
    root = root or bool(schema.get("x-kubernetes-embedded-resource"))
    properties: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    out: dict[str, Any] = {}
    for name, item in value.items():
        where = _child(path, name)
        if root and name in ("apiVersion", "kind"):
            out[name] = item
        elif root and name == "metadata" and isinstance(item, dict):
            out[name] = _prune_metadata(properties.get(name) or {}, item, where, removed)
        elif name in properties:
            out[name] = _prune(properties[name], item, where, False, removed)
        elif isinstance(extra, Mapping):
            out[name] = _prune(extra, item, _key(path, name), False, removed)
        elif keep_unknown or extra is True:
            out[name] = item
        else:
            removed.append(where)
    return out


def _prune_metadata(
    schema: Mapping[str, Any], meta: dict[str, Any], path: str, removed: list[str]
) -> dict[str, Any]:
    """ObjectMeta's fields of ``meta``: decoding into ObjectMeta drops the rest."""
    del schema  # the schema may only restrict name and generateName: it prunes nothing here
    out = {}
    for name, item in meta.items():
        if name in OBJECT_META_FIELDS:
            out[name] = item
        else:
            removed.append(_child(path, name))
    return out


def object_meta(meta: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``meta`` with only ObjectMeta's fields, and the paths of the others (as
    decoding any kind's ``metadata`` drops them)."""
    removed: list[str] = []
    return _prune_metadata({}, copy.deepcopy(dict(meta)), "metadata", removed), removed


# -- defaulting ---------------------------------------------------------------------------


def default(schema: Mapping[str, Any], obj: Any, *, root: bool = True) -> Any:
    """A copy of ``obj`` with the schema's defaults filled in where fields are absent.

    A ``null`` where the schema is not ``nullable`` is dropped first (and then defaulted,
    if there is a default); a ``null`` where it is ``nullable`` stays. Defaults are not
    applied under a root's ``metadata``.
    """
    return _default(schema, copy.deepcopy(obj), root)


def _default(schema: Mapping[str, Any], value: Any, root: bool) -> Any:
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_default(items, item, False) for item in value]
        return value
    if not isinstance(value, dict):
        return value
    properties: Mapping[str, Any] = schema.get("properties") or {}
    for name, sub in properties.items():
        if root and name in _ROOT_FIELDS:
            continue
        if name in value and value[name] is None and not sub.get("nullable"):
            del value[name]
        if name not in value and "default" in sub:
            value[name] = copy.deepcopy(sub["default"])
        if name in value:
            value[name] = _default(sub, value[name], False)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        for name in [n for n in value if n not in properties]:
            if value[name] is None and not extra.get("nullable"):
                del value[name]
            else:
                value[name] = _default(extra, value[name], False)
    return value


# -- validation ---------------------------------------------------------------------------


def validate(schema: Mapping[str, Any], obj: Any, old: Any = None) -> list[str]:
    """The errors the apiserver finds in ``obj`` (already pruned and defaulted), worded
    as it words them; ``old`` is the stored object of an update (``None`` on create)."""
    return [str(error) for error in field_errors(schema, obj, old)]


def field_errors(schema: Mapping[str, Any], obj: Any, old: Any = None) -> list[FieldError]:
    """``validate``'s errors as ``FieldError``s (for a Status' causes)."""
    errors: list[FieldError] = []
    _check(schema, obj, old if old is not None else _MISSING, "", errors)
    if not _has_rules(schema):
        return errors
    if any(error.reason in _BLOCKING for error in errors):
        # As the apiserver: its CEL cost estimate trusts these checks, so rules wait for
        # them to pass (a nil field path and value, shown as Go shows them).
        errors.append(
            FieldError(
                "<nil>",
                "FieldValueInvalid",
                "null",
                "some validation rules were not checked because the object was invalid; "
                "correct the existing errors to complete validation",
            )
        )
        return errors
    _rules(schema, _cel_root(obj), _cel_root(old) if old is not None else _MISSING, "", errors)
    return errors


# Errors that keep the CEL rules from running.
_BLOCKING = frozenset(
    {
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    }
)


def _has_rules(schema: Any) -> bool:
    if isinstance(schema, Mapping):
        return bool(schema.get("x-kubernetes-validations")) or any(
            _has_rules(value) for value in schema.values()
        )
    if isinstance(schema, list):
        return any(_has_rules(value) for value in schema)
    return False


def admit(
    schema: Mapping[str, Any], obj: Any, old: Any = None
) -> tuple[Any, list[str], list[FieldError]]:
    """Decode and validate as the apiserver does: the pruned and defaulted object, the
    paths pruned, and the validation errors."""
    pruned, removed = prune(schema, obj)
    defaulted = default(schema, pruned)
    return defaulted, removed, field_errors(schema, defaulted, old)


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    for name in ("boolean", "integer", "number", "string", "array", "object"):
        if _JSON_TYPES[name](value):
            return name
    return type(value).__name__


def _wrong_type(path: str, value: Any, wanted: str) -> FieldError:
    shown = _type_name(value)
    message = f'{path or "body"} in body must be of type {wanted}: "{shown}"'
    return FieldError(path, "FieldValueTypeInvalid", shown, message)


def _unchanged(value: Any, old: Any) -> bool:
    return old is not _MISSING and value == old


def _check(
    schema: Mapping[str, Any], value: Any, old: Any, path: str, errors: list[FieldError]
) -> None:
    if _unchanged(value, old):
        return  # ratcheting: an unchanged value is not checked again
    if value is None:
        if not schema.get("nullable") and "type" in schema:
            errors.append(_wrong_type(path, value, schema["type"]))
        return
    wanted = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or _JSON_TYPES["integer"](value)):
            errors.append(_wrong_type(path, value, "int-or-string"))
            return
    elif wanted and not _JSON_TYPES.get(wanted, lambda _: True)(value):
        errors.append(_wrong_type(path, value, wanted))
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_shown(v) for v in schema["enum"])
        errors.append(
            FieldError(path, "FieldValueNotSupported", value, f"supported values: {supported}")
        )
    if isinstance(value, str):
        _check_string(schema, value, path, errors)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(schema, value, path, errors)
    elif isinstance(value, list):
        _check_array(schema, value, old, path, errors)
    elif isinstance(value, dict):
        _check_object(schema, value, old, path, errors)


def _check_string(
    schema: Mapping[str, Any], value: str, path: str, errors: list[FieldError]
) -> None:
    body = path or "body"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(
            FieldError(
                path, "FieldValueTooLong", value, f"may not be longer than {schema['maxLength']}"
            )
        )
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                value,
                f"{body} in body should be at least {schema['minLength']} chars long",
            )
        )
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                value,
                f"{body} in body should match '{schema['pattern']}'",
            )
        )
    fmt = schema.get("format")
    if fmt in _FORMATS and not _FORMATS[fmt](value):
        errors.append(
            FieldError(
                path, "FieldValueInvalid", value, f'{body} in body must be of type {fmt}: "{value}"'
            )
        )


def _check_number(
    schema: Mapping[str, Any], value: float, path: str, errors: list[FieldError]
) -> None:
    body = path or "body"
    if "minimum" in schema:
        low = schema["minimum"]
        if schema.get("exclusiveMinimum") and value <= low:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    value,
                    f"{body} in body should be greater than {_shown(low)}",
                )
            )
        elif value < low:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    value,
                    f"{body} in body should be greater than or equal to {_shown(low)}",
                )
            )
    if "maximum" in schema:
        high = schema["maximum"]
        if schema.get("exclusiveMaximum") and value >= high:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    value,
                    f"{body} in body should be less than {_shown(high)}",
                )
            )
        elif value > high:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    value,
                    f"{body} in body should be less than or equal to {_shown(high)}",
                )
            )
    step = schema.get("multipleOf")
    if step and (value / step) != int(value / step):
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                value,
                f"{body} in body should be a multiple of {_shown(step)}",
            )
        )


def _check_array(
    schema: Mapping[str, Any], value: list[Any], old: Any, path: str, errors: list[FieldError]
) -> None:
    body = path or "body"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                len(value),
                f"must have at most {schema['maxItems']} items",
            )
        )
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                len(value),
                f"{body} in body should have at least {schema['minItems']} items",
            )
        )
    items = schema.get("items")
    if isinstance(items, Mapping):
        olds = _old_items(schema, value, old)
        for i, item in enumerate(value):
            _check(items, item, olds[i], _index(path, i), errors)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                errors.append(FieldError(_index(path, i), "FieldValueDuplicate", item))
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: list[tuple[Any, ...]] = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            key = tuple(item.get(k) for k in keys)
            if key in seen_keys:
                shown = {k: item.get(k) for k in keys}
                errors.append(FieldError(_index(path, i), "FieldValueDuplicate", shown))
            seen_keys.append(key)


def _old_items(schema: Mapping[str, Any], value: list[Any], old: Any) -> list[Any]:
    """Each item's old value: by the map keys in a list-type map, else none."""
    olds: list[Any] = [_MISSING] * len(value)
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return olds
    by_key = {tuple(item.get(k) for k in keys): item for item in old if isinstance(item, dict)}
    for i, item in enumerate(value):
        if isinstance(item, dict):
            olds[i] = by_key.get(tuple(item.get(k) for k in keys), _MISSING)
    return olds


def _check_object(
    schema: Mapping[str, Any], value: dict[str, Any], old: Any, path: str, errors: list[FieldError]
) -> None:
    for name in schema.get("required") or []:
        if name not in value:
            errors.append(FieldError(_child(path, name), "FieldValueRequired"))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                len(value),
                f"must have at most {schema['maxProperties']} items",
            )
        )
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                len(value),
                f"{path or 'body'} in body should have at least "
                f"{schema['minProperties']} properties",
            )
        )
    properties: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    old_map = old if isinstance(old, dict) else {}
    for name, item in value.items():
        if name in properties:
            _check(properties[name], item, old_map.get(name, _MISSING), _child(path, name), errors)
        elif isinstance(extra, Mapping):
            _check(extra, item, old_map.get(name, _MISSING), _key(path, name), errors)


def _date_time(text: str) -> bool:
    if not re.fullmatch(
        r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", text
    ):
        return False
    try:
        datetime.datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def _date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", text))


def _uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return bool(re.fullmatch(r"[0-9a-fA-F]{8}(-?[0-9a-fA-F]{4}){3}-?[0-9a-fA-F]{12}", text))


def _byte(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _ip(version: int) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            return ipaddress.ip_address(text).version == version
        except ValueError:
            return False

    return check


_FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": _date_time,
    "datetime": _date_time,
    "date": _date,
    "uuid": _uuid,
    "byte": _byte,
    "ipv4": _ip(4),
    "ipv6": _ip(6),
}


# -- CEL rules ----------------------------------------------------------------------------


def _rules(
    schema: Mapping[str, Any], value: Any, old: Any, path: str, errors: list[FieldError]
) -> None:
    """Evaluate every ``x-kubernetes-validations`` rule on ``value`` and below it.

    Where ``value`` equals ``old`` (ratcheting) only transition rules are evaluated: the
    apiserver never ratchets a rule that uses ``oldSelf``.
    """
    if value is None:
        return
    unchanged = _unchanged(value, old)
    for rule in schema.get("x-kubernetes-validations") or []:
        if unchanged and not _is_transition(rule):
            continue
        error = _rule_error(schema, rule, value, old, path)
        if error is not None:
            errors.append(error)
    if unchanged and not _has_transition_rules(schema):
        return
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for name, item in value.items():
            if name in properties:
                sub, where = properties[name], _child(path, name)
            elif isinstance(extra, Mapping):
                sub, where = extra, _key(path, name)
            else:
                continue
            _rules(sub, item, old_map.get(name, _MISSING), where, errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        olds = _old_items(schema, value, old)
        for i, item in enumerate(value):
            _rules(schema["items"], item, olds[i], _index(path, i), errors)


def _is_transition(rule: Mapping[str, Any]) -> bool:
    return re.search(r"\boldSelf\b", str(rule.get("rule", ""))) is not None


def _has_transition_rules(schema: Any) -> bool:
    if isinstance(schema, Mapping):
        rules = schema.get("x-kubernetes-validations") or []
        return any(_is_transition(rule) for rule in rules) or any(
            _has_transition_rules(value)
            for key, value in schema.items()
            if key != "x-kubernetes-validations"
        )
    if isinstance(schema, list):
        return any(_has_transition_rules(value) for value in schema)
    return False


def _cel_root(obj: Any) -> Any:
    """A whole object as CEL rules at the root see it: of metadata, only ``name`` and
    ``generateName``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return obj
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "generateName")}
    return {**obj, "metadata": meta}


def _rule_error(
    schema: Mapping[str, Any], rule: Mapping[str, Any], value: Any, old: Any, path: str
) -> FieldError | None:
    text = str(rule["rule"])
    transition = _is_transition(rule)
    if transition and old is _MISSING:
        return None  # a transition rule is not evaluated without an old value
    where = path
    if rule.get("fieldPath"):
        where = (path + str(rule["fieldPath"])).lstrip(".")
    shown_type = schema.get("type", "object")
    outcome = _evaluate(schema, text, value, old if transition else _MISSING)
    if isinstance(outcome, tuple):
        reason, detail = outcome
        if reason == "InternalError":
            return FieldError(where, reason, detail=detail)
        return FieldError(where, "FieldValueInvalid", shown_type, detail)
    if outcome:
        return None
    message = str(rule.get("message") or f"failed rule: {text.strip()}")
    reason = rule.get("reason", "FieldValueInvalid")
    if reason == "FieldValueForbidden":
        return FieldError(where, "FieldValueForbidden", detail=message)
    if reason == "FieldValueRequired":
        return FieldError(where, "FieldValueRequired", detail=message)
    if reason == "FieldValueDuplicate":
        return FieldError(where, "FieldValueDuplicate", shown_type, message)
    return FieldError(where, "FieldValueInvalid", shown_type, message)


# Rule outcomes by (schema id, rule, value, old value): (the schema, the outcome).
# A TrainingJob's status writes leave its spec alone, and its transition rules give the
# same answer each time; the interpreter takes milliseconds a rule.
_outcomes: collections.OrderedDict[tuple[int, str, str, str], tuple[Any, Any]] = (
    collections.OrderedDict()
)
_OUTCOMES_KEPT = 4096


def _outcome_key(
    schema: Mapping[str, Any], text: str, value: Any, old: Any
) -> tuple[int, str, str, str]:
    shown_old = "" if old is _MISSING else json.dumps(old, sort_keys=True)
    return (id(schema), text, json.dumps(value, sort_keys=True), shown_old)


def _evaluate(schema: Mapping[str, Any], text: str, value: Any, old: Any) -> bool | tuple[str, str]:
    """Rule ``text`` on ``value`` (``oldSelf`` is ``old`` unless missing): whether it
    passed, or (reason, detail) where it could not be compiled or evaluated. Outcomes are
    kept in ``_outcomes``."""
    from celpy import celtypes
    from celpy.evaluation import CELEvalError

    key = _outcome_key(schema, text, value, old)
    if key in _outcomes:
        _outcomes.move_to_end(key)
        kept: bool | tuple[str, str] = _outcomes[key][1]
        return kept
    outcome: bool | tuple[str, str]
    try:
        program = _program(text)
    except Exception as exc:  # the compiler's own error, reported as the apiserver does
        outcome = ("InternalError", f"rule compile error: {exc}")
    else:
        activation = {"self": _to_cel(value, schema)}
        if old is not _MISSING:
            activation["oldSelf"] = _to_cel(old, schema)
        try:
            result = program.evaluate(activation)
        except CELEvalError as exc:
            outcome = ("FieldValueInvalid", f"{exc.args[0]} evaluating rule: {text}")
        except Exception as exc:  # an evaluator's own failure on an odd value
            outcome = ("FieldValueInvalid", f"{exc} evaluating rule: {text}")
        else:
            if isinstance(result, CELEvalError):
                outcome = ("FieldValueInvalid", f"{result.args[0]} evaluating rule: {text}")
            else:
                outcome = result is True or result == celtypes.BoolType(True)
    _outcomes[key] = (schema, outcome)  # the schema held, so its id is not reused
    while len(_outcomes) > _OUTCOMES_KEPT:
        _outcomes.popitem(last=False)
    return outcome


@functools.cache
def _program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _to_cel(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as the CEL value Kubernetes makes of it: by the schema's type (a number
    field is a double even when written as an integer; a date-time string a timestamp)."""
    from celpy import celtypes

    if value is None:
        return None
    wanted = schema.get("type")
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return celtypes.MapType(
            {
                celtypes.StringType(k): _to_cel(
                    v, properties.get(k) or (extra if isinstance(extra, Mapping) else {})
                )
                for k, v in value.items()
            }
        )
    if isinstance(value, list):
        items = schema.get("items")
        return celtypes.ListType(
            [_to_cel(v, items if isinstance(items, Mapping) else {}) for v in value]
        )
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if wanted == "number" and isinstance(value, int | float):
        return celtypes.DoubleType(float(value))
    if isinstance(value, int) or (wanted == "integer" and isinstance(value, float)):
        return celtypes.IntType(int(value))
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str) and schema.get("format") in ("date-time", "datetime"):
        try:
            return celtypes.TimestampType(value)
        except ValueError:
            return celtypes.StringType(value)
    return celtypes.StringType(value)


# -- names and metadata -------------------------------------------------------------------

DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = f"({_QUALIFIED_NAME})?"

# How each kind of name is checked: (regex, longest, what the apiserver says it must be).
NAME_RULES: dict[str, tuple[str, int, str]] = {
    "subdomain": (
        DNS1123_SUBDOMAIN,
        253,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
        "'-' or '.', and must start and end with an alphanumeric character (e.g. "
        "'example.com', regex used for validation is "
        f"'{DNS1123_SUBDOMAIN}')",
    ),
    "rfc1123-label": (
        DNS1123_LABEL,
        63,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
        "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
        f"'123-abc', regex used for validation is '{DNS1123_LABEL}')",
    ),
    "rfc1035-label": (
        DNS1035_LABEL,
        63,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
        "with an alphabetic character, and end with an alphanumeric character (e.g. "
        f"'my-name',  or 'abc-123', regex used for validation is '{DNS1035_LABEL}')",
    ),
}


def name_errors(rule: str, value: str, path: str, *, prefix: bool = False) -> list[FieldError]:
    """``value`` checked as a name of kind ``rule`` (a key of ``NAME_RULES``); ``prefix``
    for a ``generateName``, whose trailing dash is allowed (a suffix follows it)."""
    pattern, longest, what = NAME_RULES[rule]
    checked = value[:-1] + "a" if prefix and value.endswith("-") else value
    errors = []
    if len(checked) > longest:
        errors.append(
            FieldError(
                path, "FieldValueInvalid", value, f"must be no more than {longest} characters"
            )
        )
    if not re.fullmatch(pattern, checked):
        errors.append(FieldError(path, "FieldValueInvalid", value, what))
    return errors


def _qualified_name_errors(key: str, path: str) -> list[FieldError]:
    prefix, slash, name = key.rpartition("/")
    errors: list[FieldError] = []
    if slash and not prefix:
        errors.append(FieldError(path, "FieldValueInvalid", key, "prefix part must be non-empty"))
    elif slash and (len(prefix) > 253 or not re.fullmatch(DNS1123_SUBDOMAIN, prefix)):
        errors.append(
            FieldError(path, "FieldValueInvalid", key, "prefix part " + NAME_RULES["subdomain"][2])
        )
    if not name:
        errors.append(FieldError(path, "FieldValueInvalid", key, "name part must be non-empty"))
    elif len(name) > 63:
        errors.append(
            FieldError(
                path, "FieldValueInvalid", key, "name part must be no more than 63 characters"
            )
        )
    elif not re.fullmatch(_QUALIFIED_NAME, name):
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                key,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  "
                f"or '123-abc', regex used for validation is '{_QUALIFIED_NAME}')",
            )
        )
    return errors


ANNOTATIONS_TOTAL = 256 * 1024


def metadata_errors(meta: Mapping[str, Any]) -> list[FieldError]:
    """The label and annotation errors of ``meta`` (ObjectMeta), as the apiserver finds them."""
    errors: list[FieldError] = []
    labels = meta.get("labels") or {}
    for key, value in labels.items():
        errors += _qualified_name_errors(str(key), "metadata.labels")
        text = "" if value is None else str(value)
        if len(text) > 63:
            errors.append(
                FieldError(
                    "metadata.labels",
                    "FieldValueInvalid",
                    text,
                    "must be no more than 63 characters",
                )
            )
        if not re.fullmatch(_LABEL_VALUE, text):
            errors.append(
                FieldError(
                    "metadata.labels",
                    "FieldValueInvalid",
                    text,
                    "a valid label must be an empty string or consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                    "character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
                    f"validation is '{_LABEL_VALUE}')",
                )
            )
    annotations = meta.get("annotations") or {}
    total = 0
    for key, value in annotations.items():
        errors += _qualified_name_errors(str(key).lower(), "metadata.annotations")
        total += len(str(key)) + len("" if value is None else str(value))
    if total > ANNOTATIONS_TOTAL:
        errors.append(
            FieldError(
                "metadata.annotations",
                "FieldValueTooLong",
                detail=f"must have at most {ANNOTATIONS_TOTAL} bytes",
            )
        )
    return errors


_IANA_SVC_NAME = "[a-z0-9]([a-z0-9-]*[a-z0-9])?"


def _port_name_errors(name: str, path: str) -> list[FieldError]:
    """A container port's name as an IANA service name: at most 15 characters, lower-case
    alphanumerics and '-', at least one letter, no '--', no '-' at either end."""
    problems = []
    if len(name) > 15:
        problems.append("must be no more than 15 characters")
    if not re.fullmatch(_IANA_SVC_NAME, name):
        problems.append(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
            if re.search("[^a-z0-9-]", name)
            else "must not begin or end with a hyphen (-)"
        )
    if "--" in name:
        problems.append("must not contain consecutive hyphens (-)")
    if not re.search("[a-z]", name):
        problems.append("must contain at least one letter (a-z)")
    return [FieldError(path, "FieldValueInvalid", name, problem) for problem in problems]


def pod_spec_errors(spec: Mapping[str, Any]) -> list[FieldError]:
    """What the apiserver's pod validation finds in these parts of a pod's ``spec``:
    ``hostname`` and ``subdomain`` (RFC 1123 labels; "DNS for Services and Pods"), the
    containers (at least one; each named by a unique RFC 1123 label, with an image) and
    their ports' names (IANA service names; "Pod" API reference, ContainerPort)."""
    errors: list[FieldError] = []
    for name in ("hostname", "subdomain"):
        if spec.get(name):
            errors += name_errors("rfc1123-label", str(spec[name]), f"spec.{name}")
    containers = spec.get("containers") or []
    if not containers:
        errors.append(FieldError("spec.containers", "FieldValueRequired"))
    seen: set[str] = set()
    for i, container in enumerate(containers):
        where = f"spec.containers[{i}]"
        name = str(container.get("name") or "")
        if not name:
            errors.append(FieldError(f"{where}.name", "FieldValueRequired"))
        elif name in seen:
            errors.append(FieldError(f"{where}.name", "FieldValueDuplicate", name))
        else:
            errors += name_errors("rfc1123-label", name, f"{where}.name")
        seen.add(name)
        if not container.get("image"):
            errors.append(FieldError(f"{where}.image", "FieldValueRequired"))
        for j, port in enumerate(container.get("ports") or []):
            if port.get("name"):
                errors += _port_name_errors(str(port["name"]), f"{where}.ports[{j}].name")
    return errors


STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})


def finalizer_errors(
    meta: Mapping[str, Any], old: Mapping[str, Any] | None, builtin: bool
) -> tuple[list[FieldError], list[str]]:
    """The errors and warnings of ``meta``'s finalizers, as the apiserver finds them.

    Each is a qualified name ("Finalizers",
    https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/); one
    without a domain prefix that is not a standard finalizer is an error on a built-in
    kind and a warning on a custom resource. ``old`` is the stored ObjectMeta of an
    update: while it is being deleted no finalizer can be added.
    """
    errors: list[FieldError] = []
    warnings: list[str] = []
    path = "metadata.finalizers"
    finalizers = [str(f) for f in meta.get("finalizers") or []]
    for finalizer in finalizers:
        errors += _qualified_name_errors(finalizer, path)
        if "/" not in finalizer and finalizer not in STANDARD_FINALIZERS:
            if builtin:
                errors.append(
                    FieldError(
                        path,
                        "FieldValueInvalid",
                        finalizer,
                        "name is neither a standard finalizer name nor is it fully qualified",
                    )
                )
            else:
                warnings.append(
                    f'{path}: "{finalizer}": prefer a domain-qualified finalizer name to '
                    "avoid accidental conflicts with other finalizer writers"
                )
    if old is not None and old.get("deletionTimestamp"):
        added = sorted(set(finalizers) - set(old.get("finalizers") or []))
        if added:
            shown = ", ".join(json.dumps(f) for f in added)
            errors.append(
                FieldError(
                    path,
                    "FieldValueForbidden",
                    detail="no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers []string{{{shown}}}",
                )
            )
    return errors, warnings
