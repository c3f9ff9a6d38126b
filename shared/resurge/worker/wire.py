"""The wire protocol between a worker (``resurge.worker``) and its launch agent.

A unix stream socket carries newline-delimited JSON objects, UTF-8, at most
:data:`MAX_LINE_BYTES` per line including the newline. Every object has a ``type``;
fields a side does not know are ignored, so either side may add some later.

Worker to agent (``hello`` first, again after every reconnect)::

    {"type": "hello", "local_rank": 0, "rank": 4, "pid": 1234, "generation": 2,
     "in_process": true}
    {"type": "progress", "step": 120, "metrics": {"loss": 0.25}}
    {"type": "checkpoint", "step": 100, "path": "/ckpt/step-100"}
    {"type": "fault", "generation": 2, "exception": "builtins.RuntimeError",
     "message": "...", "traceback": "..."}
    {"type": "rejoining", "generation": 3, "rank": 4}
    {"type": "restored", "generation": 3, "step": 119, "source": "peer",
     "detail": "step 119 from rank 0's memory", "sharded": false}

Agent to worker::

    {"type": "stop_pending", "generation": 2, "reason": "resize to 3 replicas"}
    {"type": "restart", "generation": 3, "environment": {"RANK": "4", ...},
     "unset": ["RESURGE_RESUME_STEP"]}
    {"type": "raise", "generation": 2}
    {"type": "checkpoint_now", "generation": 2, "reason": "resize 2 -> 4"}
    {"type": "checkpoint_now", "generation": 2, "reason": "node warning", "hold_seconds": 45}

``local_rank``, ``rank``, ``generation`` and ``step`` are integers >= 0, ``pid`` > 0,
metric values finite numbers, ``path`` a non-empty string. ``stop_pending`` names the
generation about to be stopped: a worker of that generation or an older one acts on
it, a newer worker ignores it. ``checkpoint_now`` asks the worker of exactly that generation
to save a checkpoint soon (at its next step) and report it with ``checkpoint``; a worker
of another generation ignores it. Its ``hold_seconds`` (a finite number >= 0; absent: 0,
no hold) asks the worker to hold after reporting that checkpoint, until it is stopped, a
``restart`` comes, or that many seconds after the request arrived (see
:mod:`resurge.worker.hold`).

In-process restarts (:mod:`resurge.worker.restart`): ``in_process`` (default false, so
older workers need not send it) says the worker runs under ``restartable`` and acts on
``restart`` and ``raise``. ``restart`` asks it to leave its generation and re-enter its
training function as ``generation`` with ``environment`` set and the ``unset`` names
removed (every variable of the new generation is in ``environment``). Once it has left
(its process group torn down, its environment updated) it says ``rejoining`` with the
new generation and its new global rank. ``raise`` makes it raise an injected exception
in its training function if it is still at ``generation``. ``fault`` reports an
exception its training function raised: the exception's qualified type name, its
message (at most :data:`MAX_FAULT_MESSAGE` characters) and the end of its traceback
(at most :data:`MAX_FAULT_TRACEBACK` characters); builders cut longer text.

``restored`` says where a worker's protected state (:mod:`resurge.worker.protect`) came
from when its generation began: ``source`` is one of :data:`RESTORE_SOURCES`
(``memory``: its own node's live snapshot; ``peer``: another rank's, over the process
group; ``disk``: no complete live copy, so the disk checkpoint of ``step``; ``start``:
nothing to resume from, ``step`` null), and ``detail`` (at most
:data:`MAX_FAULT_MESSAGE` characters) says why, in words; ``sharded`` (default false) that
the state is cut in shards, one per rank, and ``reshardable`` (default false) that those
shards can be cut again for another world size (DTensors cut on their first dimension):
otherwise a live copy of sharded state serves only the same world size.

The parsers raise :class:`ProtocolError`, whose ``reason`` is one of
:data:`REJECT_REASONS` (``too_long`` and ``no_hello`` are found by the reader, not
here). Standard library only: worker processes import this module.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, SupportsIndex

__all__ = [
    "MAX_FAULT_MESSAGE",
    "MAX_FAULT_TRACEBACK",
    "MAX_LINE_BYTES",
    "REJECT_REASONS",
    "RESTORE_SOURCES",
    "AgentMessage",
    "CheckpointReport",
    "CheckpointRequest",
    "FaultReport",
    "Hello",
    "ProgressReport",
    "ProtocolError",
    "RaiseCommand",
    "Rejoining",
    "RestartCommand",
    "RestoreReport",
    "StopPending",
    "WorkerMessage",
    "checkpoint_line",
    "checkpoint_now_line",
    "fault_line",
    "hello_line",
    "parse_agent_message",
    "parse_worker_message",
    "progress_line",
    "raise_line",
    "rejoining_line",
    "restart_line",
    "restored_line",
    "stop_pending_line",
]

MAX_LINE_BYTES = 64 * 1024
# Characters of a fault's message and traceback that travel (the WorkerFault event's
# limits); even escaped as \uXXXX they fit in one line.
MAX_FAULT_MESSAGE = 2 * 1024
MAX_FAULT_TRACEBACK = 8 * 1024

# Why a line was rejected; the agent counts rejections under these names.
REJECT_REASONS = (
    "too_long",  # over MAX_LINE_BYTES before its newline
    "not_json",  # not UTF-8 JSON
    "not_object",  # JSON, but not an object
    "unknown_type",  # no "type", or one this side does not know
    "bad_field",  # a field missing or of the wrong type or range
    "no_hello",  # a report on a connection that has not said hello
    "repeated_hello",  # a second hello on one connection
)


class ProtocolError(ValueError):
    """A line that breaks the protocol; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Hello:
    """``hello``: who the worker is; first on every connection."""

    local_rank: int
    rank: int
    pid: int
    generation: int
    in_process: bool = False


@dataclass(frozen=True)
class ProgressReport:
    """``progress``: the worker finished ``step``, with its finite metrics."""

    step: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class CheckpointReport:
    """``checkpoint``: the worker saved the checkpoint of ``step`` at ``path``."""

    step: int
    path: str


@dataclass(frozen=True)
class FaultReport:
    """``fault``: the worker's training function raised an exception."""

    generation: int
    exception: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Rejoining:
    """``rejoining``: the worker left its generation and enters ``generation``."""

    generation: int
    rank: int


RESTORE_SOURCES = ("memory", "peer", "disk", "start")
"""Where a generation's protected state came from (see ``restored``)."""


@dataclass(frozen=True)
class RestoreReport:
    """``restored``: where the worker's protected state came from at ``generation``'s
    start; ``step`` is None when it started fresh."""

    generation: int
    step: int | None
    source: str
    detail: str
    sharded: bool = False
    reshardable: bool = False


@dataclass(frozen=True)
class StopPending:
    """``stop_pending``: workers of ``generation`` or older are about to be stopped."""

    generation: int
    reason: str


@dataclass(frozen=True)
class RestartCommand:
    """``restart``: leave the generation, re-enter the training function as ``generation``."""

    generation: int
    environment: dict[str, str]
    unset: tuple[str, ...]


@dataclass(frozen=True)
class RaiseCommand:
    """``raise``: raise an injected exception in the training function at ``generation``."""

    generation: int


@dataclass(frozen=True)
class CheckpointRequest:
    """``checkpoint_now``: the worker of ``generation`` should save a checkpoint now."""

    generation: int
    reason: str
    hold_seconds: float = 0.0


WorkerMessage = Hello | ProgressReport | CheckpointReport | FaultReport | Rejoining | RestoreReport
AgentMessage = StopPending | RestartCommand | RaiseCommand | CheckpointRequest


# -- building lines (validates what a caller passes, with messages for people) --


def _encode(message: dict[str, Any]) -> bytes:
    line = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(
            f"a {message['type']} message is {len(line)} bytes encoded; "
            f"the limit is {MAX_LINE_BYTES}"
        )
    return line


def _count(value: object, name: str) -> int:
    """``value`` as an int >= 0; accepts anything with ``__index__`` except bool."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    number = value.__index__()
    if number < 0:
        raise ValueError(f"{name} must be a non-negative int, not {number}")
    return number


def _metric(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"metric {name!r} must be a number, not {value!r}")
    return float(value)


def hello_line(
    *, local_rank: int, rank: int, pid: int, generation: int, in_process: bool = False
) -> bytes:
    """The hello line; ValueError names the argument that is wrong."""
    message: dict[str, Any] = {
        "type": "hello",
        "local_rank": _count(local_rank, "local_rank"),
        "rank": _count(rank, "rank"),
        "pid": _count(pid, "pid"),
        "generation": _count(generation, "generation"),
    }
    if in_process:
        message["in_process"] = True
    return _encode(message)


def progress_line(step: object, metrics: dict[str, object]) -> bytes:
    """The progress line for ``step``; ValueError names the argument that is wrong."""
    # A NaN or infinite loss is the training's problem, not a reason to crash it: such
    # values are left out (strict JSON cannot carry them).
    checked = {
        str(name): number
        for name, value in metrics.items()
        if math.isfinite(number := _metric(name, value))
    }
    return _encode({"type": "progress", "step": _count(step, "step"), "metrics": checked})


def checkpoint_line(step: object, path: object) -> bytes:
    """The checkpoint line for ``step`` at ``path`` (a str or ``os.PathLike[str]``)."""
    number = _count(step, "step")
    if not isinstance(path, str | os.PathLike) or not isinstance(os.fspath(path), str):
        raise ValueError(f"path must be a str or os.PathLike[str], not {path!r}")
    text = os.fspath(path)
    if not text:
        raise ValueError("path must not be empty")
    return _encode({"type": "checkpoint", "step": number, "path": text})


def stop_pending_line(generation: int, reason: str) -> bytes:
    """The stop_pending line for workers of ``generation`` or older."""
    return _encode(
        {"type": "stop_pending", "generation": _count(generation, "generation"), "reason": reason}
    )


def fault_line(generation: int, exception: str, message: str, traceback: str) -> bytes:
    """The fault line; ``message`` keeps its start, ``traceback`` its end (where the
    exception was raised), each cut to its limit."""
    number = _count(generation, "generation")
    keep_message, keep_traceback = MAX_FAULT_MESSAGE, MAX_FAULT_TRACEBACK
    while True:  # characters outside the BMP escape to 12 bytes: cut until it fits
        try:
            return _encode(
                {
                    "type": "fault",
                    "generation": number,
                    "exception": exception[:200],
                    "message": message[:keep_message],
                    "traceback": traceback[-keep_traceback:] if keep_traceback else "",
                }
            )
        except ValueError:
            keep_message, keep_traceback = keep_message // 2, keep_traceback // 2


def rejoining_line(generation: int, rank: int) -> bytes:
    """The rejoining line: the new ``generation`` and the worker's new global ``rank``."""
    return _encode(
        {
            "type": "rejoining",
            "generation": _count(generation, "generation"),
            "rank": _count(rank, "rank"),
        }
    )


def restored_line(
    generation: int,
    step: int | None,
    source: str,
    detail: str,
    sharded: bool = False,
    reshardable: bool = False,
) -> bytes:
    """The restored line; ValueError names the argument that is wrong."""
    if source not in RESTORE_SOURCES:
        raise ValueError(f"source must be one of {', '.join(RESTORE_SOURCES)}, not {source!r}")
    if (step is None) != (source == "start"):
        raise ValueError(f"step must be None exactly when source is 'start', not {step!r}")
    return _encode(
        {
            "type": "restored",
            "generation": _count(generation, "generation"),
            "step": None if step is None else _count(step, "step"),
            "source": source,
            "detail": detail[:MAX_FAULT_MESSAGE],
            "sharded": bool(sharded),
            "reshardable": bool(sharded and reshardable),
        }
    )


def restart_line(generation: int, environment: dict[str, str], unset: list[str]) -> bytes:
    """ValueError when the environment does not fit in one line."""
    return _encode(
        {
            "type": "restart",
            "generation": _count(generation, "generation"),
            "environment": {str(name): str(value) for name, value in environment.items()},
            "unset": [str(name) for name in unset],
        }
    )


def raise_line(generation: int) -> bytes:
    """The raise line for workers still at ``generation``."""
    return _encode({"type": "raise", "generation": _count(generation, "generation")})


def checkpoint_now_line(generation: int, reason: str, hold_seconds: float = 0.0) -> bytes:
    """The checkpoint_now line for the workers of ``generation``; ``reason`` is cut to
    1,000 characters; ``hold_seconds`` (>= 0, finite) is sent only when above 0."""
    message: dict[str, Any] = {
        "type": "checkpoint_now",
        "generation": _count(generation, "generation"),
        "reason": str(reason)[:1000],
    }
    if (
        isinstance(hold_seconds, bool)
        or not isinstance(hold_seconds, numbers.Real)
        or not math.isfinite(hold_seconds)
        or hold_seconds < 0
    ):
        raise ValueError(f"hold_seconds must be a finite number >= 0, not {hold_seconds!r}")
    if hold_seconds > 0:
        message["hold_seconds"] = float(hold_seconds)
    return _encode(message)


# -- parsing lines (strict JSON types; errors carry a reason for counting) --


def _object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as error:  # bad UTF-8 is a ValueError too
        raise ProtocolError("not_json", str(error)[:200]) from None
    if not isinstance(value, dict):
        raise ProtocolError("not_object", f"a JSON {type(value).__name__}")
    return value


def _int(message: dict[str, Any], name: str, minimum: int = 0) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProtocolError("bad_field", f"{name} must be an integer >= {minimum}")
    return value


def _metrics(message: dict[str, Any]) -> dict[str, float]:
    value = message.get("metrics", {})
    if not isinstance(value, dict):
        raise ProtocolError("bad_field", "metrics must be an object")
    metrics: dict[str, float] = {}
    for name, number in value.items():
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ProtocolError("bad_field", f"metric {name!r} must be a number")
        if not math.isfinite(number):
            raise ProtocolError("bad_field", f"metric {name!r} must be finite")
        metrics[name] = float(number)
    return metrics


def _text(message: dict[str, Any], name: str, *, empty: bool) -> str:
    value = message.get(name)
    if not isinstance(value, str) or (not empty and not value):
        raise ProtocolError("bad_field", f"{name} must be a {'' if empty else 'non-empty '}string")
    return value


def _seconds(message: dict[str, Any], name: str) -> float:
    value = message.get(name, 0.0)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ProtocolError("bad_field", f"{name} must be a finite number >= 0")
    return float(value)


def _bool(message: dict[str, Any], name: str) -> bool:
    value = message.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolError("bad_field", f"{name} must be true or false")
    return value


def _strings(message: dict[str, Any], name: str) -> dict[str, str]:
    value = message.get(name)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ProtocolError("bad_field", f"{name} must be an object of strings")
    return value


def _names(message: dict[str, Any], name: str) -> tuple[str, ...]:
    value = message.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError("bad_field", f"{name} must be a list of strings")
    return tuple(value)


def parse_worker_message(line: bytes) -> WorkerMessage:
    """One line a worker sent (with or without its newline)."""
    message = _object(line)
    kind = message.get("type")
    if kind == "hello":
        return Hello(
            local_rank=_int(message, "local_rank"),
            rank=_int(message, "rank"),
            pid=_int(message, "pid", minimum=1),
            generation=_int(message, "generation"),
            in_process=_bool(message, "in_process"),
        )
    if kind == "progress":
        return ProgressReport(step=_int(message, "step"), metrics=_metrics(message))
    if kind == "checkpoint":
        return CheckpointReport(
            step=_int(message, "step"), path=_text(message, "path", empty=False)
        )
    if kind == "fault":
        return FaultReport(
            generation=_int(message, "generation"),
            exception=_text(message, "exception", empty=False),
            message=_text(message, "message", empty=True),
            traceback=_text(message, "traceback", empty=True),
        )
    if kind == "rejoining":
        return Rejoining(generation=_int(message, "generation"), rank=_int(message, "rank"))
    if kind == "restored":
        source = _text(message, "source", empty=False)
        step = None if message.get("step") is None else _int(message, "step")
        if source not in RESTORE_SOURCES or (step is None) != (source == "start"):
            raise ProtocolError("bad_field", f"source {source[:20]!r} with step {step!r}")
        return RestoreReport(
            generation=_int(message, "generation"),
            step=step,
            source=source,
            detail=_text(message, "detail", empty=True)[:MAX_FAULT_MESSAGE],
            sharded=_bool(message, "sharded"),
            reshardable=_bool(message, "reshardable"),
        )
    raise ProtocolError("unknown_type", f"type {str(kind)[:50]!r}")


def parse_agent_message(line: bytes) -> AgentMessage:
    """One line an agent sent (with or without its newline)."""
    message = _object(line)
    kind = message.get("type")
    if kind == "stop_pending":
        return StopPending(
            generation=_int(message, "generation"), reason=_text(message, "reason", empty=True)
        )
    if kind == "restart":
        return RestartCommand(
            generation=_int(message, "generation"),
            environment=_strings(message, "environment"),
            unset=_names(message, "unset"),
        )
    if kind == "raise":
        return RaiseCommand(generation=_int(message, "generation"))
    if kind == "checkpoint_now":
        return CheckpointRequest(
            generation=_int(message, "generation"),
            reason=_text(message, "reason", empty=True) if "reason" in message else "",
            hold_seconds=_seconds(message, "hold_seconds"),
        )
    raise ProtocolError("unknown_type", f"type {str(kind)[:50]!r}")
