"""Validation errors of a job spec as sentences a user can act on.

pydantic reports ``spec.nprocsPerNode: Extra inputs are not permitted``; a user wants
``unknown field spec.nprocsPerNode, did you mean nprocPerNode?``. :func:`describe`
turns each error of a :class:`~pydantic.ValidationError` raised while validating
``model`` into one sentence naming the field (by its path in the document), what is
wrong, and for an unknown field the closest known spellings at that place.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

__all__ = ["describe"]

# pydantic's input types, as a user of YAML knows them.
_YAML_TYPES = {
    "dict": "a mapping",
    "list": "a list",
    "str": "a string",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "NoneType": "nothing (null)",
}


def describe(error: ValidationError, model: type[BaseModel]) -> str:
    """Every error of ``error`` (raised validating ``model``) as a sentence, joined by '; '."""
    return "; ".join(_sentence(item, model) for item in error.errors())


def _sentence(item: ErrorDetails, model: type[BaseModel]) -> str:
    kind = item["type"]
    raw = list(item["loc"])
    # An unknown field's own name is the last part, whatever it is ("dict" included).
    last = raw[-1:] if kind == "extra_forbidden" else []
    loc = [part for part in raw[: len(raw) - len(last)] if not _is_union_tag(part)] + last
    where = ".".join(str(part) for part in loc) or "the document"
    if kind == "extra_forbidden" and loc:
        known = _known_names(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=2, cutoff=0.6)
        hint = f", did you mean {' or '.join(close)}?" if close else ""
        listing = f" (known here: {', '.join(sorted(known))})" if known and not close else ""
        return f"unknown field {where}{hint}{listing}"
    if kind == "missing":
        return f"{where} is required"
    if kind in ("model_type", "dict_type"):
        return f"{where} must be a mapping, not {_what(item.get('input'))}"
    if kind == "list_type":
        return f"{where} must be a list, not {_what(item.get('input'))}"
    return f"{where}: {item['msg'].removeprefix('Value error, ')}"


def _is_union_tag(part: object) -> bool:
    """Pydantic inserts the tried type's name in a union member's path (``int``, ...)."""
    return isinstance(part, str) and ("[" in part or part in _YAML_TYPES)


def _what(value: Any) -> str:
    name = type(value).__name__
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    return f"{_YAML_TYPES.get(name, name)} ({shown})"


def _known_names(model: type[BaseModel], path: list[int | str]) -> list[str]:
    """The field names (camelCase, as written in YAML) of the model found at ``path``."""
    current: Any = model
    for part in path:
        current = _step(current, part)
        if current is None:
            return []
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return []
    return [field.alias or name for name, field in current.model_fields.items()]


def _step(current: Any, part: int | str) -> Any:
    """The type one step down ``current`` (a model, a list or dict of models, an Optional)."""
    current = _unwrap(current)
    if isinstance(part, int):
        args = typing.get_args(current)
        return _unwrap(args[0]) if args else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        for name, field in current.model_fields.items():
            if part in (name, field.alias):
                return _unwrap(field.annotation)
        return None
    if typing.get_origin(current) is dict:
        args = typing.get_args(current)
        return _unwrap(args[1]) if len(args) == 2 else None
    return None


def _unwrap(annotation: Any) -> Any:
    """``X`` from ``X | None`` (the one model of an optional field)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return members[0] if len(members) == 1 else annotation
    return annotation
