"""The scaler service: admits jobs onto nodes, starts them, ends them.

- job submitted -> Pending record; then every Pending job that fits is placed, its
  worker groups are created through the cluster backend, and generation g is assigned.
- capacity changed, job finished or deleted -> try the Pending jobs again.
- every replica finished -> Succeeded, written with the job's last steps
  (:mod:`resurge.control.decisions.job_end`), then those done: the final Stops, the phase
  announced, the worker groups deleted; a restarter finishes what a failure leaves.
  Any finished job's worker groups are deleted when its phase is announced, too.
- any job record changed -> its status view is written through the backend (its own
  task: :class:`~resurge_scaler.status_writer.StatusWriter`, which must have one writer:
  it runs beside the backend's ``reconcile``, so on Kubernetes only in the scaler that
  holds the Lease, :mod:`resurge.cluster.kubernetes.leader`).
- after each of these, and every second (so that timeouts run out): admission again,
  then elastic resizes (grow into free slots, shrink for a higher-priority job or off
  lost and departing nodes, suspend), decided and written by
  :class:`~resurge_scaler.resizer.Resizer`; the restarter carries them out.

The backend comes from :func:`resurge.cluster.open_backend` (``RESURGE_CLUSTER``) and
is used only through the :class:`~resurge.cluster.ClusterBackend` protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from functools import partial

from resurge.access.pod_users import PodIssuer
from resurge.cluster import ClusterBackend, open_backend
from resurge.contract.subscriptions import SCALER_ACTIONS, SCALER_CAPACITY, SCALER_JOBS
from resurge.control.decisions.admission import (
    admission_order,
    mark_replica_finished,
    needed_replicas,
    new_record,
    place,
    start,
    update_live,
    wait_reason,
    why_waiting,
)
from resurge.control.decisions.job_end import ENDING_LEASE_SECONDS, begin_ending
from resurge.control.decisions.worker_groups import worker_groups
from resurge.control.effects.job_finish import finish_job
from resurge.control.effects.job_messages import announce_phase, send_assignments, send_stops
from resurge.control.state.allocations import (
    AllocationConflict,
    Allocations,
    Claim,
    open_allocations,
)
from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.control.views.cluster_snapshot import ClusterReads, ClusterSnapshot, read_snapshot
from resurge.events import (
    CapacityChanged,
    JobDeleted,
    JobPhase,
    JobSubmitted,
    PhaseChanged,
    RecoveryFinished,
    RecoveryStarted,
    ReplicaFinished,
    ScaleDecided,
)
from resurge.runtime.bus import TransientError
from resurge.runtime.service import ServiceContext
from resurge_scaler.metrics import ScalerMetrics
from resurge_scaler.resizer import Resizer
from resurge_scaler.status_writer import StatusWriter

__all__ = ["TICK_SECONDS", "Scaler", "setup"]

TICK_SECONDS = 1.0
# How long an admission's claims hold if this scaler dies before writing the record.
_CLAIM_SECONDS = 60.0
_ATTEMPTS = 20

_Fit = tuple[list[Placement], list[str]] | str
"""A Pending job's placements and spares, or why it waits."""


class Scaler:
    """The scaler's handlers over one bus, one job store and one cluster backend."""

    def __init__(self, ctx: ServiceContext, store: JobStore, backend: ClusterBackend) -> None:
        self.ctx = ctx
        self.bus = ctx.bus
        self.store = store
        self.backend = backend
        self.reads = ClusterReads(
            backend.list_nodes,
            backend.live_nodes,
            backend.list_worker_groups,
            backend.unfit_nodes,
        )
        self.metrics = ScalerMetrics(ctx.registry)
        self._allocations: Allocations | None = None
        self.resizer = Resizer(ctx, store, backend, self.metrics, self.allocations)
        self._admitting = asyncio.Lock()

    @classmethod
    async def open(cls, ctx: ServiceContext) -> Scaler:
        """A scaler on ``ctx``'s bus with the backend its settings choose."""
        store = JobStore(await ctx.bus.jobs_bucket())
        pod_users = PodIssuer.from_settings(ctx.settings)  # None unless NATS signs users
        return cls(ctx, store, await open_backend(ctx.bus, ctx.settings, pod_users))

    async def start(self) -> None:
        """Reconcile and write job statuses in the background (both single writers: on
        Kubernetes, only while this scaler leads) and consume the scaler's subjects."""

        def write_statuses() -> Awaitable[None]:  # a new writer each time
            return StatusWriter(self.store.kv, self.backend, self.metrics.job_seen).run()

        self.ctx.spawn(partial(self.backend.reconcile, write_statuses), name="reconcile")
        self.ctx.spawn(self.tick, name="tick")
        bus = self.bus
        await bus.bind(SCALER_JOBS, self.on_job_event)
        await bus.bind(SCALER_ACTIONS, self.on_action)
        await bus.bind(SCALER_CAPACITY, self.on_capacity)

    # -- admission ----------------------------------------------------------------------

    async def admit_pending(self) -> None:
        """Start every Pending job that fits now, in admission order; say why the rest
        wait. The placements are decided on the one cluster snapshot and claimed in the
        allocation ledger before any record is written; a lost claim decides again."""
        async with self._admitting:
            allocations = await self.allocations()
            for _ in range(_ATTEMPTS):
                snapshot = await read_snapshot(self.reads, self.store, allocations)
                pending = admission_order(list(snapshot.records))
                if not pending:
                    return
                fits, claims = self._place(snapshot, pending, allocations)
                try:
                    if claims:
                        await allocations.claim(snapshot.claims, snapshot.revision, claims)
                except AllocationConflict:
                    continue
                try:
                    for record, fit in fits:
                        await self._start_or_wait(record, fit)
                finally:
                    await allocations.release(claims)
                return
            self.ctx.log.warning("admission skipped: the allocation ledger kept moving")

    def _place(
        self, snapshot: ClusterSnapshot, pending: list[JobRecord], allocations: Allocations
    ) -> tuple[list[tuple[JobRecord, _Fit]], list[Claim]]:
        """Each Pending record's placements and spares, or why it waits; the claims."""
        nodes = snapshot.nodes
        live = {node.name for node in nodes}
        silent = [n.name for n in snapshot.known if n.name not in live]
        used = snapshot.used()
        now = datetime.now(UTC)
        local = self.ctx.settings.cluster == "local"
        fits: list[tuple[JobRecord, _Fit]] = []
        claims: list[Claim] = []
        for record in pending:
            before = dict(used)
            need = needed_replicas(record, now)
            unfit = snapshot.unfit.get(record.name, {})
            fit = place(
                record.spec, snapshot.nodes_for(record.name), used, record.avoid_nodes, need
            )
            if fit is None:
                why = why_waiting(
                    record.spec,
                    nodes,
                    before,
                    record.avoid_nodes,
                    need,
                    local=local,
                    silent=silent,
                    unfit=unfit,
                )
                fits.append((record, why))
                continue
            fits.append((record, fit))
            nproc = record.spec.spec.nproc_per_node
            claims += [
                allocations.make(record.name, p.replica, p.node, nproc, _CLAIM_SECONDS)
                for p in fit[0]
            ]
            claims += [
                allocations.make(record.name, None, node, nproc, _CLAIM_SECONDS) for node in fit[1]
            ]
        return fits, claims

    async def _start_or_wait(self, record: JobRecord, fit: _Fit) -> None:
        """Write why ``record`` waits, or start it on its placements."""
        if isinstance(fit, str):
            await self.store.mutate(record.name, partial(wait_reason, reason=fit))
            return
        placements, spares = fit
        result = await self.store.mutate(
            record.name, partial(start, placements=placements, spares=spares)
        )
        if result is None or result[0] is result[1]:
            return
        before, after = result
        for group in worker_groups(after):
            await self.backend.create_worker_group(group)
        await send_assignments(self.bus, after)
        self.ctx.log.info("started %s: %s", after.name, after.message, extra={"job": after.name})
        await announce_phase(self.bus, before.phase, after)

    async def allocations(self) -> Allocations:
        """The allocation ledger (its bucket made on first use)."""
        if self._allocations is None:
            self._allocations = await open_allocations(self.bus, self.bus.source.instance)
            assert self._allocations is not None
        return self._allocations

    async def release(self, record: JobRecord) -> None:
        """Delete the worker groups of ``record``'s placements."""
        for p in record.placements:
            await self.backend.delete_worker_group(record.name, p.replica, p.node)

    # -- handlers -----------------------------------------------------------------------

    async def on_job_event(self, event: JobSubmitted | ReplicaFinished | JobDeleted) -> None:
        """One event of the job subjects, to its handler."""
        if isinstance(event, JobSubmitted):
            await self.on_submitted(event)
        elif isinstance(event, ReplicaFinished):
            await self.on_finished(event)
        else:
            await self.on_deleted(event)

    async def on_submitted(self, event: JobSubmitted) -> None:
        """A new job (or a finished one's name again) becomes Pending and is admitted if it
        fits; a running job submitted again takes its new monitoring settings,
        replicas.max and suspend, acted on at once. An edit
        (``update``) never starts a job: one that finished, or has no record, is left."""
        job = event.spec
        # The name it was submitted under: on Kubernetes the TrainingJob's bus name
        # (``team-b/llama`` outside the install's namespace), not only metadata.name.
        name = event.job or job.name
        found = await self.store.get(name)
        if event.update and (found is None or found[0].phase.finished):
            self.ctx.log.info(
                "%s: an edit of a job that is %s: not started again",
                name,
                "gone" if found is None else found[0].phase.value,
                extra={"job": name},
            )
            return
        if found is not None and not found[0].phase.finished:
            await self.store.mutate(name, partial(update_live, job=job))
            self.ctx.log.info(
                "%s is already %s: monitoring settings, replicas.max and suspend taken, the "
                "rest kept",
                name,
                found[0].phase.value,
            )
            await self.settle()
            return
        # The run is named by the submission that started it: `resurge status JOB --uid`
        # finds it in the job stream after its record is gone.
        record = new_record(job, found[0] if found else None, name).model_copy(
            update={"uid": event.id, "worker_domain": self.backend.worker_domain(job)}
        )
        written = (
            await self.store.create(record)
            if found is None
            else await self.store.replace(record, found[1])
        )
        if not written:
            raise TransientError(f"job record {name} changed while admitting it")
        await announce_phase(self.bus, None, record)
        await self.settle()

    async def on_finished(self, event: ReplicaFinished) -> None:
        """A replica finished its generation; the job succeeds when every replica has."""
        if event.job is None or event.replica is None or event.generation is None:
            return
        replica, generation = event.replica, event.generation
        me = self.bus.source.instance

        def finished(record: JobRecord) -> bool:
            previous, plan = record.phase, record.pending_recovery
            if not mark_replica_finished(record, replica, generation):
                return False
            if record.phase is JobPhase.SUCCEEDED:
                begin_ending(
                    record,
                    previous=previous,
                    reason="job succeeded",
                    plan=plan,
                    claimant=me,
                    now=datetime.now(UTC),
                    lease_seconds=ENDING_LEASE_SECONDS,
                )
            return True

        result = await self.store.mutate(event.job, finished)
        if result is None or result[0] is result[1]:
            return
        after = result[1]
        if after.phase is JobPhase.SUCCEEDED:
            self.ctx.log.info("job %s succeeded", after.name, extra={"job": after.name})
            # Its last steps, each marked done in the record (a restarter finishes what
            # a failure here leaves): the final Stops, the phase, the worker groups deleted.
            await finish_job(self.bus, self.backend, self.store, after)

    async def on_deleted(self, event: JobDeleted) -> None:
        """A deleted job: stop its workers, free its nodes, forget its record."""
        if event.job is None:
            return
        found = await self.store.get(event.job)
        if found is None:
            return
        await send_stops(self.bus, found[0], found[0].generation, "job deleted", final=True)
        await self.release(found[0])
        await self.store.kv.delete(self.store.key(event.job))
        await self.settle()

    async def settle(self) -> None:
        """Admit what fits, then decide resizes."""
        await self.admit_pending()
        await self.resizer.rebalance()

    async def tick(self) -> None:
        """:meth:`settle` every ``TICK_SECONDS``, so that cool-downs, snoozes and timeouts
        that run out are acted on without an event (a failed round is logged)."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                await self.settle()
            except Exception:
                self.ctx.log.exception("admitting and resizing failed; trying again")
            try:
                allocations = await self.allocations()
                self.metrics.gpus(await read_snapshot(self.reads, self.store, allocations))
            except Exception as error:  # the next tick tries again
                self.ctx.log.warning("could not count the GPUs in use: %r", error)

    async def on_action(
        self, event: PhaseChanged | RecoveryStarted | RecoveryFinished | ScaleDecided
    ) -> None:
        """A requeued or suspended job is admitted again, a resized job's freed slots
        taken; a finished job's nodes are freed."""
        if not isinstance(event, PhaseChanged) or event.job is None:
            return
        if event.phase is JobPhase.PENDING and event.previous is not None:
            await self.settle()  # requeued (no node to move a replica to) or suspended
            return
        if event.phase is JobPhase.RUNNING and event.previous is JobPhase.RESIZING:
            await self.settle()
            return
        if not event.phase.finished:
            return
        found = await self.store.get(event.job)
        if found is not None and found[0].phase.finished:
            await self.release(found[0])
            await self.settle()

    async def on_capacity(self, event: CapacityChanged) -> None:
        """A node's capacity changed: try the Pending jobs again, then resize."""
        await self.settle()


async def setup(ctx: ServiceContext) -> None:
    """The service runner's entry: open a :class:`Scaler` and start it."""
    scaler = await Scaler.open(ctx)
    await scaler.start()
