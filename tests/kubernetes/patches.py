"""The three PATCH bodies a Kubernetes API server takes, applied to plain JSON objects.

kmock's emulator merges every patch into the stored object as nested dicts, lists replaced
whole and JSON patches (a list of operations) not understood at all; the fixture supplies
these instead:

- ``merge_patch``: RFC 7386 (``application/merge-patch+json``), what custom resources get.
- ``strategic_merge_patch``: ``application/strategic-merge-patch+json`` for built-in kinds,
  the official client's default for a dict body. Lists named in ``MERGE_KEYS`` merge item by
  item on their merge key (``status.conditions`` by ``type``, as on a real server); lists of
  strings named in ``PRIMITIVE_MERGE`` (``metadata.finalizers``) merge as sets; every other
  list, ``spec.taints`` included (as on a real server: taints have no merge key), is
  replaced whole. Supported directives: ``$patch: delete`` on an item of a keyed list,
  ``$deleteFromPrimitiveList/<field>``; ``$setElementOrder/<field>`` is dropped. Lists
  nested inside list items (a container's ``env``) are replaced whole, not merged.
- ``json_patch``: RFC 6902 (``application/json-patch+json``), which the official client
  sends when the body is a list: add, remove, replace, move, copy, test.
"""

from __future__ import annotations

import copy
from typing import Any

# Lists a strategic merge merges item by item: path of the list -> the items' merge key.
MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("metadata", "ownerReferences"): "uid",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "ports"): "port",
}
# Lists of scalars a strategic merge merges as sets.
PRIMITIVE_MERGE: frozenset[tuple[str, ...]] = frozenset({("metadata", "finalizers")})


class PatchError(ValueError):
    """A patch that cannot be applied (a real server answers 422 or 400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, null deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A strategic merge patch with the merge keys of ``MERGE_KEYS`` (see the module doc)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and sub in MERGE_KEYS:
            result[key] = _merge_keyed(result.get(key), value, MERGE_KEYS[sub])
        elif isinstance(value, list) and sub in PRIMITIVE_MERGE:
            existing = result.get(key)
            old: list[Any] = existing if isinstance(existing, list) else []
            result[key] = old + [item for item in value if item not in old]
        else:
            result[key] = strategic_merge_patch(result.get(key), value, sub)
    return result


def _merge_keyed(target: Any, patch: list[Any], merge_key: str) -> list[Any]:
    result = [copy.deepcopy(item) for item in target] if isinstance(target, list) else []
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"a list item without its merge key {merge_key!r}: {item!r}")
        at = next(
            (i for i, old in enumerate(result) if old.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            result[at] = merge_patch(result[at], item)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 on a deep copy of ``target``; ``PatchError`` when an operation fails."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"not a JSON patch operation: {op!r}")
        kind = op["op"]
        if kind == "add":
            doc = _add(doc, _pointer(op["path"]), copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc, _ = _remove(doc, _pointer(op["path"]))
        elif kind == "replace":
            doc, _ = _remove(doc, _pointer(op["path"]))
            doc = _add(doc, _pointer(op["path"]), copy.deepcopy(op.get("value")))
        elif kind == "move":
            doc, value = _remove(doc, _pointer(op["from"]))
            doc = _add(doc, _pointer(op["path"]), value)
        elif kind == "copy":
            value = copy.deepcopy(_get(doc, _pointer(op["from"])))
            doc = _add(doc, _pointer(op["path"]), value)
        elif kind == "test":
            if _get(doc, _pointer(op["path"])) != op.get("value"):
                raise PatchError(f"test failed at {op['path']!r}")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchError(f"not a JSON pointer: {text!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _get(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"no such path: /{'/'.join(parts)}")
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"no such index: {last!r}")
    else:
        raise PatchError(f"cannot add under a scalar at /{'/'.join(parts)}")
    return doc


def _remove(doc: Any, parts: list[str]) -> tuple[Any, Any]:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise PatchError(f"no such path: /{'/'.join(parts)}")
