"""``resurge``: the user's command line (DESIGN section 7)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from resurge.events import Event

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resurge",
        description=(
            "resurge keeps distributed PyTorch jobs alive: it detects faults and restarts "
            "what failed. Commands that talk to a cluster read RESURGE_NATS_URL and "
            "RESURGE_NAMESPACE."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="run the whole story locally: a job crashes once and is restarted"
    )
    demo.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="keep the server data and logs here (default: a temporary folder)",
    )
    submit = commands.add_parser("submit", help="submit a TrainingJob YAML file")
    submit.add_argument("file", type=Path)
    delete = commands.add_parser("delete", help="delete a job and stop its workers")
    delete.add_argument("job")
    status = commands.add_parser("status", help="show one job's status, or every job's")
    status.add_argument("job", nargs="?")
    status.add_argument("--json", action="store_true", help="print JSON")
    events = commands.add_parser("events", help="print events as they happen (Ctrl-C stops)")
    events.add_argument(
        "filter",
        nargs="?",
        default=">",
        help="subject filter under <namespace>.v1, e.g. 'fault.>' (default: all)",
    )
    events.add_argument("--json", action="store_true", help="print each event as JSON")
    schema = commands.add_parser("schema", help="write the JSON Schema of every event kind")
    schema.add_argument(
        "--out",
        type=Path,
        default=Path("docs/schemas"),
        help="folder to write into (default docs/schemas)",
    )
    return parser


async def _with_bus(action: str, args: argparse.Namespace) -> int:
    from resurge.client import (
        connected,
        delete_job,
        event_line,
        job_status,
        submit_job,
        watch_events,
    )
    from resurge.jobspec import JobSpecError, load_job
    from resurge.settings import Settings

    settings = Settings()
    if action == "submit":
        try:
            job = load_job(args.file)
        except (JobSpecError, OSError) as error:
            print(f"resurge submit: {error}", file=sys.stderr)
            return 2
    async with connected(settings) as bus:
        if action == "submit":
            await submit_job(bus, job)
            print(f"trainingjob {job.name} submitted")
        elif action == "delete":
            await delete_job(bus, args.job)
            print(f"trainingjob {args.job} deleted")
        elif action == "status":
            views = await job_status(bus, args.job)
            if args.job and not views:
                print(f"resurge status: no job named {args.job!r}", file=sys.stderr)
                return 1
            if args.json:
                print(json.dumps(views[0] if args.job else views, indent=2))
            else:
                for view in views:
                    print(
                        f"{view['name']:<24} {view['phase']:<11} gen={view['generation']} "
                        f"restarts={view['restarts']} {view['message']}"
                    )
        elif action == "events":

            async def show(event: Event, subject: str) -> None:
                print(event_line(event, args.json), flush=True)

            await watch_events(bus, f"{bus.subjects.root}.{args.filter}", show, asyncio.Event())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from resurge.demo import run_demo

        return run_demo(args.state_dir)
    if args.command == "schema":
        from resurge.schemas import write_schemas

        for path in write_schemas(args.out):
            print(path)
        return 0
    try:
        return asyncio.run(_with_bus(args.command, args))
    except ConnectionError as error:
        print(f"resurge {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
