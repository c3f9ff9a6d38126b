"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does.

Every scaler runs a :class:`LeaderElector` on the same Lease; the one whose identity the
Lease names leads and runs the parts that must have one writer (the controller, the status
writer), the others stand by. The record is the Lease's spec: ``holderIdentity``,
``leaseDurationSeconds``, ``acquireTime``, ``renewTime``, ``leaseTransitions``.

- **Taking or renewing** (:meth:`LeaderElector.try_once`): read the Lease (create it,
  naming this process, if there is none); if :func:`may_take` says so, write this process
  into it with a PUT carrying the resourceVersion read, so that of two writers one gets
  409 Conflict and loses.
- **Expiry by the standby's own clock** (:func:`observe`, :func:`may_take`): a standby
  notes when it last saw the record *change* (on its monotonic clock) and takes the Lease
  only after ``leaseDurationSeconds`` more have passed with no change. Clocks of different
  machines are never compared; ``renewTime`` is for people, not for the decision.
- **Stopping before the Lease expires**: a leader renews every ``retry`` seconds; if no
  renewal succeeds within ``renew_deadline`` (less than the duration) of the last one,
  it stops leading: what it runs is cancelled, and it campaigns again. A standby
  measures from when it saw that last renewal, which is after the leader sent it, so the
  leader has stopped before any standby takes over.
- **Giving it back**: a leader that is cancelled (the scaler stopping) or whose work ends
  writes an empty holder (``leaseDurationSeconds: 1``), so a standby takes over at once.

:func:`timings` derives the renew deadline and the retry period from the duration in
client-go's default proportions (15 s, 10 s, 2 s). A standby reads the Lease every retry
period, so it sees a renewal at most that late, and tries again the moment the Lease
expires by its clock: it takes over between ``duration - retry`` and ``duration + retry``
after the leader's death (its last renewal came at most one retry period before).
Each change of leadership is logged; :func:`leading_gauge` makes it a metric.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from resurge.cluster.kubernetes.api import KubeApi, conflict, json_of
from resurge.cluster.kubernetes.times import micro_time

__all__ = [
    "LeaderElector",
    "Seen",
    "claim",
    "identity",
    "leading_gauge",
    "may_take",
    "observe",
    "timings",
]

log = logging.getLogger("resurge.cluster.kubernetes.leader")

# The pod's name, which Kubernetes sets as the container's hostname.
HOSTNAME = "HOSTNAME"

Spec = dict[str, Any]
"""A Lease's ``spec``: the leader election record."""

_FIELDS = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")


_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def leading_gauge(registry: CollectorRegistry, lease: str) -> Callable[[bool], None]:
    """Sets ``resurge_leader{lease}`` in ``registry`` (made there on first use): 1 while
    this process leads, 0 while it stands by."""
    gauge = _GAUGES.get(registry)
    if gauge is None:
        gauge = _GAUGES[registry] = Gauge(
            "resurge_leader",
            "1 while this process holds the Lease (runs the Kubernetes controller and "
            "writes the jobs' statuses), 0 while it stands by.",
            ["lease"],
            registry=registry,
        )
    series = gauge.labels(lease)
    series.set(0)
    return lambda leading: series.set(1 if leading else 0)


def identity() -> str:
    """This process's identity in the Lease: the pod's name plus a random suffix, so a
    restarted container (same pod name) is a new candidate, as client-go's is."""
    return f"{os.environ.get(HOSTNAME) or 'resurge'}_{secrets.token_hex(4)}"


def timings(duration: float) -> tuple[float, float]:
    """The renew deadline and the retry period of a Lease of ``duration`` seconds, in
    client-go's default proportions (15 s: 10 s and 2 s)."""
    return duration * 2 / 3, duration * 2 / 15


@dataclass(frozen=True)
class Seen:
    """The Lease's record as this process last saw it change, and when (its own
    monotonic clock)."""

    spec: Spec
    at: float


def _record(spec: Spec) -> Spec:
    return {key: spec.get(key) for key in _FIELDS}


def observe(last: Seen | None, spec: Spec, now: float) -> Seen:
    """What this process has seen after reading ``spec`` at ``now``: ``last`` if the
    record is the same (its time stands), else the new record seen now."""
    if last is not None and _record(last.spec) == _record(spec):
        return last
    return Seen(_record(spec), now)


def may_take(seen: Seen | None, me: str, now: float) -> bool:
    """Whether ``me`` may write itself into the Lease now: there is none, nobody holds
    it, ``me`` holds it (a renewal), or it has not changed for its duration since it
    was ``seen`` (it expired by this process's clock)."""
    if seen is None:
        return True
    holder = seen.spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    duration = seen.spec.get("leaseDurationSeconds") or 0
    return now >= seen.at + float(duration)


def claim(old: Spec | None, me: str, duration: int, now: datetime) -> Spec:
    """The record ``me`` writes to take or renew a Lease whose record is ``old`` (None:
    no Lease yet): renewed now; the acquire time and the transitions kept on a renewal,
    a new acquire time and one more transition on a takeover."""
    stamp = micro_time(now)
    spec: Spec = {
        "holderIdentity": me,
        "leaseDurationSeconds": duration,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": 0,
    }
    if old is None:
        return spec
    transitions = int(old.get("leaseTransitions") or 0)
    if old.get("holderIdentity") == me:
        spec["acquireTime"] = old.get("acquireTime") or stamp
        spec["leaseTransitions"] = transitions
    else:
        spec["leaseTransitions"] = transitions + 1
    return spec


def _released(old: Spec, now: datetime) -> Spec:
    """The record a leader writes to give the Lease back (client-go's release)."""
    stamp = micro_time(now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": int(old.get("leaseTransitions") or 0),
    }


class LeaderElector:
    """One candidate for the Lease ``name`` in ``kube``'s namespace (module docstring)."""

    def __init__(
        self,
        kube: KubeApi,
        name: str,
        duration: int,
        *,
        me: str | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_change(True)`` when this process starts leading, ``(False)`` when it stops."""
        self.kube = kube
        self.name = name
        self.namespace = kube.namespace
        self.duration = duration
        self.renew_deadline, self.retry = timings(duration)
        self.me = me or identity()
        self.on_change = on_change
        self.clock = clock
        self.seen: Seen | None = None
        self.renewed = 0.0  # when the last successful write was sent (monotonic)
        self._lease: dict[str, Any] | None = None  # as our last successful write left it
        self._holder: str | None = None  # the holder last logged

    # -- one try ----------------------------------------------------------------------------

    async def try_once(self) -> bool:
        """Read the Lease and take or renew it if :func:`may_take` allows; whether this
        process holds it now. Any refusal or error is a False (logged)."""
        try:
            return await self._try()
        except Exception as error:  # the API unreachable, a 409: not held this time
            log.warning("could not take or renew Lease %s: %r", self.name, error)
            return False

    async def _try(self) -> bool:
        lease = await self.kube.read(
            f"read Lease {self.name}",
            self.kube.coordination.read_namespaced_lease,
            self.name,
            self.namespace,
        )
        if lease is None:
            return await self._create()
        spec = dict(lease.get("spec") or {})
        self.seen = observe(self.seen, spec, self.clock())
        self._note_holder(spec.get("holderIdentity"))
        if not may_take(self.seen, self.me, self.clock()):
            return False
        sent = self.clock()
        lease["spec"] = claim(spec, self.me, self.duration, datetime.now(UTC))
        written = await self.kube.call(
            f"update Lease {self.name}",
            self.kube.coordination.replace_namespaced_lease,
            self.name,
            self.namespace,
            lease,  # carries the resourceVersion read: 409 if another wrote since
            _preload_content=False,
        )
        self._held(json_of(written), sent)
        return True

    async def _create(self) -> bool:
        sent = self.clock()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": claim(None, self.me, self.duration, datetime.now(UTC)),
        }
        created = await self.kube.call(
            f"create Lease {self.name}",
            self.kube.coordination.create_namespaced_lease,
            self.namespace,
            body,
            _preload_content=False,
        )
        self._held(json_of(created), sent)
        return True

    def _held(self, lease: dict[str, Any], sent: float) -> None:
        self._lease = lease
        self.seen = Seen(_record(lease.get("spec") or {}), self.clock())
        self.renewed = sent
        self._note_holder(self.me)

    def _note_holder(self, holder: str | None) -> None:
        if holder != self._holder and holder != self.me and holder:
            log.info("Lease %s is held by %s; %s stands by", self.name, holder, self.me)
        self._holder = holder

    def holder(self) -> str | None:
        """The holder this process last saw in the Lease."""
        return self._holder

    # -- leading ----------------------------------------------------------------------------

    async def run(self, work: Callable[[], Awaitable[None]]) -> None:
        """Campaign, run ``work()`` while leading, and campaign again each time the
        Lease is lost (``work`` cancelled first), until cancelled or ``work`` ends; a
        ``work`` that raises raises here. The Lease is given back on the way out."""
        try:
            while True:
                await self._acquire()
                if await self._lead(work):
                    return
        finally:
            await self._release()

    async def _acquire(self) -> None:
        while True:
            if await self.try_once():
                return
            await asyncio.sleep(self._wait())

    def _wait(self) -> float:
        """Until the next try: the retry period, or less when the Lease expires sooner."""
        if self.seen is None or not self.seen.spec.get("holderIdentity"):
            return self.retry
        expires = self.seen.at + float(self.seen.spec.get("leaseDurationSeconds") or 0)
        return max(0.01, min(self.retry, expires - self.clock()))

    async def _lead(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run ``work`` while renewing; True if it ended (its error raised), False if the
        Lease was lost (it was cancelled)."""
        log.info("%s leads: holds Lease %s", self.me, self.name)
        self._changed(True)
        working = asyncio.ensure_future(work())
        keeping = asyncio.ensure_future(self._keep())
        try:
            done, _ = await asyncio.wait({working, keeping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (working, keeping):
                task.cancel()
            await asyncio.gather(working, keeping, return_exceptions=True)
            self._changed(False)
        if working in done:
            working.result()  # its error, if it failed
            return True
        keeping.result()
        log.warning(
            "%s stopped leading: Lease %s not renewed within %.1f s",
            self.me,
            self.name,
            self.renew_deadline,
        )
        return False

    async def _keep(self) -> None:
        """Renew every retry period; return once no renewal succeeded within the renew
        deadline of the last one, or another process holds the Lease."""
        while True:
            await asyncio.sleep(self.retry)
            while True:
                left = self.renewed + self.renew_deadline - self.clock()
                if left <= 0:
                    return
                try:
                    async with asyncio.timeout(left):
                        renewed = await self.try_once()
                except TimeoutError:
                    return
                if renewed:
                    break
                if self._holder not in (None, self.me):
                    return  # another took it: stop at once
                await asyncio.sleep(min(self.retry, max(0.0, left)))

    async def _release(self) -> None:
        """Give the Lease back if this process holds it (best effort)."""
        lease = self._lease
        self._lease = None
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.me:
            return
        lease = {**lease, "spec": _released(lease.get("spec") or {}, datetime.now(UTC))}
        try:
            await self.kube.call(
                f"give back Lease {self.name}",
                self.kube.coordination.replace_namespaced_lease,
                self.name,
                self.namespace,
                lease,
                _preload_content=False,
            )
        except Exception as error:  # it expires by itself
            if conflict(error):  # written since this process last renewed it: not ours
                log.info("%s: Lease %s was taken meanwhile", self.me, self.name)
            else:
                log.warning("could not give back Lease %s: %r", self.name, error)
        else:
            log.info("%s gave back Lease %s", self.me, self.name)

    def _changed(self, leading: bool) -> None:
        if self.on_change is not None:
            self.on_change(leading)
