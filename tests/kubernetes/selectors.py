"""Label and field selectors as a Kubernetes API server parses and applies them.

kmock's emulator ignores ``labelSelector`` and ``fieldSelector``; the fixture supplies both,
on lists and on watches.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k`` (exists), ``!k`` (does not exist),
``k in (a,b)``, ``k notin (a,b)``, joined by commas (all must hold).

Field selectors: ``f=v``, ``f==v``, ``f!=v`` joined by commas, on the fields a real server
supports for the kind (``FIELDS``): ``metadata.name`` and ``metadata.namespace`` everywhere,
``spec.nodeName`` and ``status.phase`` on pods, ``spec.unschedulable`` on nodes and so on. A
field the kind does not support is a 400 "field label not supported", as on a real server;
an absent field compares as the empty string.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# The field selectors each kind supports beyond metadata.name and metadata.namespace.
FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "nodes": frozenset({"spec.unschedulable"}),
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
}
COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


class SelectorError(ValueError):
    """A selector a real server would reject with 400 Bad Request."""


Predicate = Callable[[Mapping[str, Any]], bool]

_LABEL_TERM = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[^\s=!,()]+)"
    r"|(?P<key>[^\s=!,()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s=!,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)


def _split_terms(text: str) -> list[str]:
    """Split on the commas that are not inside ``( )``."""
    terms: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def _label_term(term: str) -> Predicate:
    match = _LABEL_TERM.match(term)
    if match is None:
        raise SelectorError(f"unable to parse requirement: {term!r}")
    if match["nkey"]:
        nkey = match["nkey"]
        return lambda labels: nkey not in labels
    key = match["key"]
    if match["op"]:
        value = match["value"]
        if match["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match["setop"]:
        values = {v.strip() for v in match["values"].split(",") if v.strip()}
        if match["setop"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    return lambda labels: key in labels


def label_selector(text: str | None) -> Predicate:
    """A predicate over an object's ``metadata.labels`` for a ``labelSelector`` string."""
    terms = [_label_term(term) for term in _split_terms(text or "")]

    def check(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return check


def field_value(obj: Mapping[str, Any], field: str) -> str:
    """A field's value as a field selector compares it (absent is "", booleans lower-case)."""
    value: Any = obj
    for part in field.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping) and field == "source":
        return str(value.get("component", ""))
    return str(value)


def field_selector(text: str | None, plural: str) -> Predicate:
    """A predicate for a ``fieldSelector`` string on objects of the resource ``plural``."""
    allowed = COMMON_FIELDS | FIELDS.get(plural, frozenset())
    terms: list[tuple[str, bool, str]] = []
    for term in _split_terms(text or ""):
        match = re.match(r"^\s*([^\s=!]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if match is None:
            raise SelectorError(f"invalid selector: {term!r}")
        field, op, value = match.groups()
        if field not in allowed:
            raise SelectorError(f"field label not supported: {field}")
        terms.append((field, op != "!=", value))

    def check(obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, f) == value) == equal for f, equal, value in terms)

    return check
