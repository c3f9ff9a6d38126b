"""One module per ``resurge`` command, each with ``add_parser(commands)``, which
registers the command's parser and sets its ``run`` (``args -> exit status``).
:data:`COMMANDS` lists them in the order ``resurge --help`` shows them; those in
:data:`WITHOUT_STATE` take no ``--state-dir``."""

from __future__ import annotations

from resurge.cli.commands import (
    convert,
    delete,
    demo,
    down,
    events,
    inject,
    nats_identities,
    node,
    report,
    schema,
    simulate,
    status,
    submit,
    up,
)

__all__ = [
    "COMMANDS",
    "WITHOUT_STATE",
    "convert",
    "delete",
    "demo",
    "down",
    "events",
    "inject",
    "nats_identities",
    "node",
    "report",
    "schema",
    "simulate",
    "status",
    "submit",
    "up",
]

COMMANDS = (up, down, submit, delete, status, events, inject, demo, node, schema, report)
WITHOUT_STATE = (convert, simulate, nats_identities)
