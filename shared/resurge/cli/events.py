"""``resurge events``: the stored history, then (``--follow``) what happens next.

Live events are subscribed to before the history is read, so nothing falls between the
two; an event seen in both is printed once (by id). ``--job`` naming a job with neither a
record nor a stored event is an error (exit 1), as ``kubectl`` says of an unknown
object. Output piped into a reader that stops early ends the command quietly
(``resurge.cli.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import stat
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from resurge.control.effects.client import job_status
from resurge.control.views.event_words import event_line
from resurge.control.views.history import read_history
from resurge.events import Event
from resurge.runtime.bus import Bus

__all__ = ["show_events"]


def _print(line: str) -> None:
    print(line, flush=True)


class _Lines:
    """Each event once, as the line ``args`` asks for, handed to ``write``."""

    def __init__(self, args: argparse.Namespace, write: Callable[[str], None]) -> None:
        self.args = args
        self.write = write
        self.seen: set[str] = set()

    def show(self, event: Event) -> None:
        if event.id in self.seen:
            return
        self.seen.add(event.id)
        args = self.args
        line = event_line(
            event, verbose=args.verbose or bool(args.filter), as_json=args.json, every=args.every
        )
        if line is not None:
            self.write(line)


async def show_events(
    bus: Bus, args: argparse.Namespace, write: Callable[[str], None] = _print
) -> int:
    """Print (or hand ``write``) the events ``args`` asks for, a line each; 0, 1 for a job
    that does not exist, or 2 for a filter that names no family."""
    root = bus.subjects.root
    subject = f"{root}.{args.filter}" if args.filter else None
    since = datetime.now(UTC) - timedelta(seconds=args.since) if args.since else None
    lines = _Lines(args, write)
    live: asyncio.Queue[Event] = asyncio.Queue()

    async def on_live(event: Event, on: str) -> None:
        if args.job is None or event.job == args.job:
            live.put_nowait(event)

    sub = await bus.subscribe(subject or f"{root}.>", on_live) if args.follow else None
    try:
        history = await read_history(bus, job=args.job, since=since, subject=subject)
        narrowed = subject is not None or since is not None
        if args.job and not history.events and not await _known(bus, args.job, narrowed):
            print(
                f"resurge events: no job named {args.job!r} (no record and no stored event)",
                file=sys.stderr,
            )
            return 1
        for stored in history.events:
            lines.show(stored.event)
        if sub is not None:
            await _follow(live, lines)
    except ValueError as error:
        print(f"resurge events: {error}", file=sys.stderr)
        return 2
    finally:
        if sub is not None:
            await sub.unsubscribe()
    return 0


async def _known(bus: Bus, job: str, narrowed: bool) -> bool:
    """Whether ``job`` has a record, or any stored event (also one that ``--since`` or a
    filter, ``narrowed``, kept out of the history just read)."""
    if await job_status(bus, job):
        return True
    return narrowed and bool((await read_history(bus, job=job)).events)


async def _follow(live: asyncio.Queue[Event], lines: _Lines) -> None:
    """Show live events until cancelled, or until the pipe stdout writes into is closed
    by its reader (``| head``): then BrokenPipeError, as a write would raise, at once
    rather than at the next event."""
    closed = asyncio.Event()
    fd = _pipe_fd()
    if fd is not None:  # a pipe's writing end turns "readable" (an error) once its reader is gone
        asyncio.get_running_loop().add_reader(fd, closed.set)
    gone = asyncio.ensure_future(closed.wait())
    getting: asyncio.Future[Event] | None = None
    try:
        while True:
            getting = asyncio.ensure_future(live.get())
            await asyncio.wait((getting, gone), return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                raise BrokenPipeError("the reader of the output went away")
            lines.show(getting.result())
    finally:
        for waiting in (getting, gone):
            if waiting is not None:
                waiting.cancel()
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)


def _pipe_fd() -> int | None:
    """Stdout's file descriptor when it is a pipe; None otherwise (a terminal, a file,
    or no descriptor at all, as under a test's capture)."""
    try:
        fd = sys.stdout.fileno()
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
