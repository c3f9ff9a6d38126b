"""A torchrun-style launcher inside a shell script, taken off.

HyperPod manifests often run a shell script (``sh -c "mkdir ... && hyperpodrun
--nproc_per_node=8 ... train.py ..."``). resurge's agent runs ``spec.command`` once per
worker, so a launcher left in the script would start nprocPerNode workers of its own in
every worker. :func:`take_off_launchers` replaces each launcher the script starts as a
command (at the start of a line or after ``;``, ``&&``, ``||``, ``|``, ``(``, ``{``,
``exec``) with what :func:`~resurge.jobspec.launcher.split_launcher` keeps of it
(``python``, ``python -m``, or nothing for ``--no-python``), keeping the rest of the
script as written. It reads the launcher's options as shell words: quotes, backslash
escapes, line continuations and ``$(...)``/``${...}`` inside a word; the words end at a
newline, a comment or an operator. A launcher named anywhere else in the script (a
variable, an ``echo``; comment lines aside) is reported as left, for the caller to refuse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from resurge.jobspec.launcher import Launched, split_launcher

__all__ = ["ShellLaunchers", "take_off_launchers"]

_AT_COMMAND = re.compile(
    r"(?:^|(?<=[;&|({]))[ \t]*(?:exec[ \t]+)?"
    r"(?P<launcher>(?:[^\s;&|()'\"]*/)?(?:hyperpodrun|torchrun)"
    r"|python3?(?:\.\d+)?[ \t]+-m[ \t]+torch\.distributed\.(?:run|launch))"
    r"(?=[ \t\n\\]|$)",
    re.MULTILINE,
)
_NAMED = re.compile(r"\b(?:hyperpodrun|torchrun|torch\.distributed\.(?:run|launch))\b")
_COMMENT_LINE = re.compile(r"^[ \t]*#.*$", re.MULTILINE)
_ENDS_WORDS = frozenset(";&|<>()\n")
_PAIRS = {"(": ")", "{": "}"}


@dataclass(frozen=True)
class ShellLaunchers:
    """A script with the launchers it starts taken off."""

    script: str
    launched: tuple[Launched, ...]
    """The launchers taken off, in the order they were in the script."""
    left: tuple[str, ...]
    """Launcher names still in the script: not started as a command, or with no script
    after their options."""


def _quoted(text: str, start: int) -> int:
    """The index after the quoted string opening at ``start``, or -1 if it is not closed."""
    quote, index = text[start], start + 1
    while index < len(text) and text[index] != quote:
        index += 2 if quote == '"' and text[index] == "\\" else 1
    return index + 1 if index < len(text) else -1


def _substitution(text: str, start: int) -> int:
    """The index after ``$(...)`` or ``${...}`` opening at ``start`` (``$``), or -1."""
    opener = text[start + 1]
    depth, index = 0, start + 1
    while index < len(text):
        if text[index] in "'\"":
            index = _quoted(text, index)
            if index < 0:
                return -1
            continue
        if text[index] == opener:
            depth += 1
        elif text[index] == _PAIRS[opener]:
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return -1


def _word(text: str, start: int) -> tuple[str, int] | None:
    """The shell word at ``start`` (its value with the quotes taken off) and the index
    after it; None for a quote or substitution that is not closed."""
    value: list[str] = []
    index = start
    while index < len(text) and text[index] not in " \t" and text[index] not in _ENDS_WORDS:
        char = text[index]
        if char == "\\":
            if text.startswith("\\\n", index):
                break
            value.append(text[index + 1 : index + 2])
            index += 2
        elif char in "'\"":
            end = _quoted(text, index)
            if end < 0:
                return None
            inner = text[index + 1 : end - 1]
            value.append(inner if char == "'" else re.sub(r"\\([$`\"\\])", r"\1", inner))
            index = end
        elif char == "$" and text[index + 1 : index + 2] in _PAIRS:
            end = _substitution(text, index)
            if end < 0:
                return None
            value.append(text[index:end])
            index = end
        else:
            value.append(char)
            index += 1
    return "".join(value), index


def _words(text: str, start: int) -> list[tuple[int, str]] | None:
    """The words of the simple command that goes on at ``start``: (where each begins,
    its value); None where one cannot be read."""
    words: list[tuple[int, str]] = []
    index = start
    while index < len(text):
        if text[index] in " \t":
            index += 1
        elif text.startswith("\\\n", index):
            index += 2
        elif text[index] in _ENDS_WORDS or text[index] == "#":
            break
        else:
            read = _word(text, index)
            if read is None:
                return None
            words.append((index, read[0]))
            index = read[1]
    return words


def _taken_off(text: str, match: re.Match[str]) -> tuple[str, Launched] | None:
    """``text`` with the launcher ``match`` found taken off, or None where it has no
    script to run."""
    words = _words(text, match.end("launcher"))
    if words is None:
        return None
    launcher = match.group("launcher").split()
    launched = split_launcher([*launcher, *(value for _, value in words)])
    if launched is None:
        return None
    script_at = words[len(launched.options)][0]
    kept = launched.script[: len(launched.script) - (len(words) - len(launched.options))]
    replacement = " ".join(kept) + " " if kept else ""
    return text[: match.start("launcher")] + replacement + text[script_at:], launched


def take_off_launchers(script: str) -> ShellLaunchers:
    """``script`` with every launcher it starts as a command taken off."""
    launched: list[Launched] = []
    searched_to = 0
    while (match := _AT_COMMAND.search(script, searched_to)) is not None:
        done = _taken_off(script, match)
        if done is None:
            searched_to = match.end()
            continue
        script, one = done
        launched.append(one)
        searched_to = match.start("launcher")
    code = _COMMENT_LINE.sub("", script)
    left = tuple(dict.fromkeys(found.group(0) for found in _NAMED.finditer(code)))
    return ShellLaunchers(script=script, launched=tuple(launched), left=left)
