"""Kubernetes' ``$(VAR)`` expansion, as the kubelet applies it to a container.

Kubernetes expands ``$(NAME)`` in a container's env values, command and args before the
container starts ("Define Dependent Environment Variables" in the Kubernetes docs; the
kubelet's ``third_party/forked/golang/expansion``): ``$(NAME)`` becomes NAME's value
where NAME is known and stays as written where it is not, ``$$`` is one ``$`` (so
``$$(NAME)`` is the text ``$(NAME)``), and any other ``$`` is kept. An env value sees the
variables defined before it in the list; command and args see all of them. resurge's
agent runs ``spec.command`` with ``spec.env`` as written, so a converted manifest is
expanded here, once.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["expand"]


def _reference(rest: str) -> tuple[str, bool, int]:
    """What follows a ``$``: (the text or name read, whether it is a name, how far)."""
    if rest[0] == "$":
        return "$", False, 1
    if rest[0] == "(":
        close = rest.find(")", 1)
        if close != -1:
            return rest[1:close], True, close + 1
        return "$" + rest, False, len(rest)
    return "$" + rest[0], False, 1


def expand(text: str, known: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """``text`` expanded with ``known``; and the names it refers to that ``known``
    lacks (left as written), in order."""
    out: list[str] = []
    missing: list[str] = []
    checkpoint = cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_name, advance = _reference(text[cursor + 1 :])
            if not is_name:
                out.append(read)
            elif read in known:
                out.append(known[read])
            else:
                out.append(f"$({read})")
                missing.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:], tuple(missing)
