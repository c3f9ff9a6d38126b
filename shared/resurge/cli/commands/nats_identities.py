"""``resurge nats-identities``: a new install's NATS identities, for operator mode.

Writes, into a new folder: ``nats-operator.conf`` (the server's ``operator``,
``resolver: MEMORY`` and ``resolver_preload`` block, to ``include`` in its config),
``<role>.creds`` for every role (the services', ``agent`` for the node monitors, ``viewer``
and ``admin`` for the CLI), ``account-signer.seed`` (the signing key the scaler's
controller makes each pod's own user with) and ``account.pub`` (the account's public
key). Every file is 0600; the seed and creds are secrets (deploy/README.md, "NATS
users", says where each goes).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``nats-identities``."""
    parser = commands.add_parser(
        "nats-identities",
        help="make a new install's NATS operator, account and users (operator mode)",
        description="Write a new install's NATS identities into DIR: the server's operator "
        "block (nats-operator.conf), a .creds file per role, the account's signing key "
        "(account-signer.seed, the scaler's, to give each Kubernetes pod its own user) and "
        "the account's public key (account.pub).",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new folder")
    parser.add_argument(
        "--namespace",
        default=os.environ.get("RESURGE_NAMESPACE", "resurge"),
        help="the bus namespace the users' permissions are for (default: RESURGE_NAMESPACE "
        "or 'resurge')",
    )
    parser.set_defaults(run=run)


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def run(args: argparse.Namespace) -> int:
    """Write the identities; the exit status (2 where DIR exists or the namespace is bad)."""
    from resurge.access.server_config import nats_identities
    from resurge.contract.subjects import Subjects

    try:
        subjects = Subjects(args.namespace)
    except ValueError as error:
        print(f"resurge nats-identities: --namespace: {error}", file=sys.stderr)
        return 2
    out: Path = args.out
    try:
        out.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        print(f"resurge nats-identities: {out} exists; give a new folder", file=sys.stderr)
        return 2
    identities = nats_identities(subjects)
    _write(out / "nats-operator.conf", identities.server_config())
    for role, creds in identities.role_creds.items():
        _write(out / f"{role}.creds", creds)
    _write(out / "account-signer.seed", identities.signing_key.seed + "\n")
    _write(out / "account.pub", identities.account.public + "\n")
    print(
        f"wrote {out}: nats-operator.conf, {len(identities.role_creds)} role .creds files, "
        "account-signer.seed, account.pub (deploy/README.md, 'NATS users')"
    )
    return 0
