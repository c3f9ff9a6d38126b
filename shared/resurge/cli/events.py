"""``resurge events``: the stored history, then (``--follow``) what happens next.

Live events are subscribed to before the history is read, so nothing falls between the
two; an event seen in both is printed once (by id). Output piped into a reader that
stops early ends the command quietly (``resurge.cli.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from resurge.control.event_words import event_line
from resurge.control.history import read_history
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
    """Print (or hand ``write``) the events ``args`` asks for, a line each; 0, or 2 for a
    filter that names no family."""
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
        for stored in history.events:
            lines.show(stored.event)
        while sub is not None:
            lines.show(await live.get())
    except ValueError as error:
        print(f"resurge events: {error}", file=sys.stderr)
        return 2
    finally:
        if sub is not None:
            await sub.unsubscribe()
    return 0
