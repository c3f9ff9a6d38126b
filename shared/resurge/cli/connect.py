"""How a ``resurge`` command finds and talks to its cluster.

``RESURGE_NATS_URL`` and ``RESURGE_NAMESPACE`` when set, else the local cluster recorded
in the state folder by ``resurge up``; with none recorded there, or one whose supervisor
or NATS server is gone, a command fails at once, naming the folder and how to point at a
cluster. On a local cluster a command connects as the NATS user of its role, from the
folder's credentials: ``viewer`` to read, ``admin`` to change; against
``RESURGE_NATS_URL`` it uses ``RESURGE_NATS_CREDENTIALS`` (or ``RESURGE_NATS_USER`` and
``RESURGE_NATS_PASSWORD``). A server that does not answer is reported after
:data:`CLI_CONNECT_SECONDS` (``RESURGE_CONNECT_TIMEOUT_SECONDS`` sets another limit).
:func:`on_cluster` runs a command's work and turns each way of failing into one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus
    from resurge.runtime.settings import Settings

__all__ = ["CLI_CONNECT_SECONDS", "NoClusterError", "cluster_settings", "on_bus", "on_cluster"]

# A person waits on the command: a server that does not answer in this long is reported
# (a service waits longer, RESURGE_CONNECT_TIMEOUT_SECONDS, for a server starting up).
CLI_CONNECT_SECONDS = 5.0

Role = Literal["viewer", "admin"]


class NoClusterError(Exception):
    """No cluster to talk to: the message says where resurge looked and what to do."""


def cluster_settings(
    state_dir: Path | None, local_only: bool = False, role: Role = "viewer"
) -> tuple[Settings, bool]:
    """Settings for the cluster to talk to, and whether it is a local one.

    With ``RESURGE_NATS_URL`` set (and not ``local_only``), that server; else the local
    cluster recorded in the state folder, which must be running (:class:`NoClusterError`
    at once otherwise), as ``role``'s NATS user from the folder's credentials."""
    from resurge.local.state import ClusterState, StateLock, credentials_path, resolve_state_dir
    from resurge.runtime.settings import Settings

    if "RESURGE_NATS_URL" in os.environ and not local_only:
        return _briefly(Settings()), False
    folder = resolve_state_dir(state_dir)
    how = (
        "start one there with `resurge up`, point at another with --state-dir DIR or "
        "RESURGE_STATE_DIR, or at a NATS server with RESURGE_NATS_URL"
    )
    state = ClusterState.load(folder)
    if state is None:
        raise NoClusterError(f"no local cluster found in {folder}: {how}")
    elsewhere = how.split(", ", 1)[1]
    if not StateLock(folder).held_elsewhere():
        raise NoClusterError(
            f"the local cluster recorded in {folder} is not running (its supervisor, pid "
            f"{state.pid}, is gone): `resurge up` starts it again; or {elsewhere}"
        )
    if not state.nats_answers():
        raise NoClusterError(
            f"the local cluster recorded in {folder} is broken: its supervisor (pid "
            f"{state.pid}) runs but its NATS server at {state.nats_url} does not answer (see "
            f"{folder / 'logs'}): `resurge down` then `resurge up` starts it again; or "
            f"{elsewhere}"
        )
    credentials = credentials_path(folder, role)
    settings = Settings(
        nats_url=state.nats_url,
        namespace=state.namespace,
        nats_credentials=credentials if credentials.exists() else None,
        nats_tls_ca=Path(state.tls_ca) if state.tls_ca else None,
    )
    return _briefly(settings), True


def _briefly(settings: Settings) -> Settings:
    """``settings`` that give up on an unreachable server after
    :data:`CLI_CONNECT_SECONDS`, unless RESURGE_CONNECT_TIMEOUT_SECONDS says otherwise."""
    if "RESURGE_CONNECT_TIMEOUT_SECONDS" in os.environ:
        return settings
    return settings.model_copy(update={"connect_timeout_seconds": CLI_CONNECT_SECONDS})


def on_cluster(
    args: argparse.Namespace,
    work: Callable[[Settings, bool], Coroutine[Any, Any, int]],
    *,
    role: Role = "viewer",
    local_only: bool = False,
) -> int:
    """Run ``work(settings, local)`` against the command's cluster; its exit status, or 2
    with one line on stderr where no cluster answers (130 on Ctrl-C). ``local_only``: the
    state folder's cluster, whatever ``RESURGE_NATS_URL`` says."""
    import nats.errors

    # The bus's reconnect warnings are for services' logs; the CLI says what failed itself.
    logging.getLogger("resurge.runtime.bus").setLevel(logging.ERROR)
    local = False
    try:
        settings, local = cluster_settings(args.state_dir, local_only, role)
        return asyncio.run(work(settings, local))
    except NoClusterError as error:
        print(f"resurge {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output's reader went away: not a NATS connection error
        raise
    except ConnectionError as error:
        where = "" if local else " (RESURGE_NATS_URL)"
        print(f"resurge {args.command}: {error}{where}", file=sys.stderr)
        return 2
    except nats.errors.Error as error:  # the server went away mid-command (`resurge down`)
        print(
            f"resurge {args.command}: the cluster stopped answering ({error}); is it running?",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


def on_bus(
    args: argparse.Namespace,
    work: Callable[[Bus, bool], Coroutine[Any, Any, int]],
    *,
    role: Role = "viewer",
    local_only: bool = False,
) -> int:
    """:func:`on_cluster` with a bus connected for ``work(bus, local)``."""

    async def connect(settings: Settings, local: bool) -> int:
        from resurge.control.effects.client import connected

        async with connected(settings) as bus:
            return await work(bus, local)

    return on_cluster(args, connect, role=role, local_only=local_only)
