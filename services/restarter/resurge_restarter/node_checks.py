"""Health checks of quarantined nodes: asked when due; a node that passes is released.

For each node under an enforced quarantine, :class:`NodeChecks` keeps a timer (every
restarter instance does, as they all watch the node records):
``RESURGE_NODE_HEALTH_CHECK_AFTER_SECONDS`` after the quarantine began, and again that
long after each check asked, it asks the node's monitor for a check (CheckNode on
``cmd._.<node>``; the id derives from the node, the quarantine's start and the attempt,
so the instances' requests are one, de-duplicated by JetStream), once no job runs on the
node (until then it looks again every few seconds). 0 asks for none.

A NodeChecked that passed, for a check made after the quarantine began, releases the
node (:func:`resurge.control.decisions.node_score.release_after_check`: released by
``health_check``, the check's words as why, the score lowered to half the threshold)
and uncordons it. A failed one is logged; the next attempt comes at its time. A dry
run's quarantine is never checked: nothing was cordoned.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime

from resurge.cluster import ClusterBackend
from resurge.control.decisions.node_score import NodePolicy, release_after_check
from resurge.control.state.node_health import NodeHealth, NodeHealthStore
from resurge.control.state.records import JobStore
from resurge.events import CheckNode, NodeChecked
from resurge.runtime.service import ServiceContext
from resurge_restarter.node_moves import runs_on

__all__ = ["NodeChecks"]

_EMPTY_POLL_SECONDS = 5.0


def check_id(node: str, since: datetime, attempt: int) -> str:
    """The id of a node's ``attempt``-th check in the quarantine that began at ``since``."""
    digest = hashlib.blake2b(f"{node}\0{since.isoformat()}\0{attempt}".encode(), digest_size=10)
    return f"check-node-{digest.hexdigest()}"


class NodeChecks:
    """Asks quarantined nodes for health checks and releases those that pass."""

    def __init__(
        self,
        ctx: ServiceContext,
        backend: ClusterBackend,
        nodes: NodeHealthStore,
        jobs: JobStore,
        records: Mapping[str, NodeHealth],
        policy: NodePolicy,
    ) -> None:
        self.ctx = ctx
        self.backend = backend
        self.nodes = nodes
        self.jobs = jobs
        self.records = records  # the ledger's view of the bucket, kept by its watch
        self.policy = policy
        self.after = ctx.settings.node_health_check_after_seconds
        self._timers: dict[str, tuple[datetime, asyncio.Task[None]]] = {}

    def seen(self, record: NodeHealth) -> None:
        """A node record as the bucket holds it now: start, keep or stop its timer."""
        held = record.quarantine
        timer = self._timers.get(record.name)
        wanted = held is not None and not held.dry_run and self.after > 0
        if timer is not None and (not wanted or held is None or timer[0] != held.since):
            timer[1].cancel()  # released, or a quarantine other than the timer's
            self._timers.pop(record.name, None)
            timer = None
        if wanted and held is not None and (timer is None or timer[1].done()):
            task = self.ctx.spawn(
                self._ask_when_due(record.name, held.since), name=f"check-{record.name}"
            )
            self._timers[record.name] = (held.since, task)

    def _still_held(self, node: str, since: datetime) -> bool:
        record = self.records.get(node)
        return (
            record is not None
            and record.quarantine is not None
            and (record.quarantine.since == since)
        )

    async def _emptied(self, node: str, since: datetime) -> bool:
        """Wait until no job runs on ``node``; False if its quarantine ended first."""
        while self._still_held(node, since):
            if not any(runs_on(r, node) for r in await self.jobs.all()):
                return True
            await asyncio.sleep(min(_EMPTY_POLL_SECONDS, self.after))
        return False

    async def _ask_when_due(self, node: str, since: datetime) -> None:
        attempt = 1
        while self._still_held(node, since):
            due = since.timestamp() + self.after * attempt
            await asyncio.sleep(max(0.0, due - datetime.now(UTC).timestamp()))
            if not await self._emptied(node, since):
                return
            bus = self.ctx.bus
            ask = CheckNode(
                id=check_id(node, since, attempt),
                source=bus.source,
                node=node,
                reason=f"quarantined since {since:%Y-%m-%d %H:%M:%S} UTC",
            )
            self.ctx.log.info(
                "asking quarantined node %s for health check %d", node, attempt,
                extra={"node": node},
            )  # fmt: skip
            await bus.publish(bus.subjects.node_cmd(node), ask)
            attempt = max(
                attempt + 1, int((datetime.now(UTC) - since).total_seconds() // self.after) + 1
            )

    async def on_checked(self, event: NodeChecked) -> None:
        """Release the node if it passed a check made during its quarantine."""
        node = event.node
        if node is None:
            return
        if not event.passed:
            self.ctx.log.warning(
                "node %s failed its health check; it stays quarantined: %s",
                node, event.message, extra={"node": node},
            )  # fmt: skip
            return
        now = datetime.now(UTC)
        before, after = await self.nodes.mutate(
            node, lambda r: release_after_check(r, now, event.time, event.message, self.policy)
        )
        if after is before:
            return
        await self.backend.uncordon(node)
        self.ctx.log.warning(
            "node %s passed its health check: quarantine released, score %.2f (%s)",
            node, after.score, event.message, extra={"node": node},
        )  # fmt: skip
