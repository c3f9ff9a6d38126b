"""The scaler's decision for elastic jobs (DESIGN section 5): a pure function, no I/O.

The scaler service decides with it, and so does the goodput simulator
(:mod:`resurge.simulation`).

:func:`decide` takes the cluster (:class:`Cluster`: nodes with their slots,
schedulability and labels), every unfinished job's shape (:class:`JobShape`) and the
clock ``now`` (seconds, any epoch, the same as the shapes' times) and returns the
resizes to carry out (:class:`Resize`); :func:`plan` also says why each job that gets
nothing waits. The same input always gives the same answer. A finished job is simply
absent from the input, so its slots are free at once.

Slots: a node's free slots are its ``slots`` less its ``reserved`` slots (taken by what
no shape names: a grow of another scaler still warming up, a placement claimed and not
yet written; :meth:`resurge.control.views.cluster_snapshot.ClusterSnapshot.reserved`) and
less ``nproc`` for each replica and each held spare of a Running job on it.
Unschedulable (unhealthy or cordoned) nodes, and nodes absent from the cluster, offer
nothing; a job's replica on one of them is *lost*.

The policy, in passes over the jobs in priority order (higher ``priority`` first,
then earlier ``submitted``, then name):

0. Above ``max``, or held. A Running job holding more replicas than its largest
   allowed size (its ``replicas.max`` lowered by an edit) shrinks to that size,
   highest index first, unless busy: no cool-down holds back what its owner asked for.
   A Running job that is ``held`` (its ``spec.suspend``, or Kueue's admission withdrawn)
   is suspended the same way; a held job is never admitted nor grown.
1. Lost capacity. A Running job whose lost replicas outnumber its usable spares (spares
   on schedulable nodes, which the restarter moves replicas onto) shrinks once a lost
   node has been gone ``faulty_timeout`` seconds: the overdue lost replicas go, then
   more from the highest index down to the next allowed size; with no allowed size
   left it is suspended. Until then it waits for its node and does not grow. A
   fixed-size job (one allowed size) is left to the restarter, which moves or requeues it.
2. Admission. Each Pending or Suspended job gets its ``min`` replicas or waits. When
   free slots are short, jobs of strictly lower priority make room: first each is
   shrunk toward its ``min``, one allowed size at a time, lowest priority first (latest
   submitted first among equals); only when that is not enough are whole jobs
   suspended (back to Pending with their checkpoint, never failed), again lowest
   first, and then shrinks that turn out unneeded are undone. Jobs of equal or higher
   priority are never shrunk or suspended for a waiting job. If even that is not
   enough the job takes nothing and waits, with the reason; a lower-priority job that
   fits may still start (it can be made to yield later).
3. Growth. Free slots go to Running (and just admitted) jobs in priority order: each
   goes to the largest allowed size up to ``max`` whose new replicas fit, in one
   resize (discrete sizes ``[2, 4, 8]`` with room for 6 replicas give 4, never 6).

Placement: a new replica goes to the schedulable node the job does not avoid with the
most free slots, preferring nodes in the job's topology groups (nodes sharing the
values of ``Cluster.topology_keys``, by default the zone label, with the job's current
nodes; a job being admitted keeps to the group with the most room). A shrink removes
replicas on lost nodes first, then the highest index first.

Debounce: no resize of any kind within ``cooldown`` seconds of the job's last resize
(``resized_at``); no grow (nor growth past ``min`` at admission) within ``snooze``
seconds of its last restart (``restarted_at``); no grow within ``settle`` seconds of
the newest node that became schedulable (``Node.ready_since``), so that capacity
arriving together (nodes added a second apart) is grown into together, in one resize
to the size all of it allows; a loss-forced shrink also waits ``faulty_timeout``. A
running job's grow held back by one of these is in :attr:`Plan.held`: the size it
would grow to, what holds it and until when (the latest of them). A job gets at most
one :class:`Resize` per decision. Carrying out the resizes in the order returned
(suspensions and shrinks first) never puts more on a node than it has.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from resurge.control.decisions.free_slots import Group, Pool

__all__ = [
    "SETTLE_SECONDS",
    "ZONE_LABEL",
    "Cluster",
    "GrowWait",
    "JobShape",
    "Kind",
    "Node",
    "Phase",
    "Plan",
    "Resize",
    "applied",
    "decide",
    "plan",
]

ZONE_LABEL = "topology.kubernetes.io/zone"
"""The default topology label: replicas of a job prefer nodes in the zone of its others."""

SETTLE_SECONDS = 10.0
"""How long a grow waits after a node became schedulable, for more capacity arriving."""


class Phase(StrEnum):
    """Where a job stands for the scaler."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"


class Kind(StrEnum):
    """What a resize does."""

    GROW = "grow"
    SHRINK = "shrink"
    ADMIT = "admit"
    SUSPEND = "suspend"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class Node:
    """A node: its slots (GPUs) in all, whether new work may go there, its labels,
    when it last became schedulable (None: long before any decision), and the slots
    taken by what no job shape names (``reserved``)."""

    name: str
    slots: int
    schedulable: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    ready_since: float | None = None
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class Cluster:
    """The nodes, and the label keys whose values make a topology group."""

    nodes: tuple[Node, ...] = ()
    topology_keys: tuple[str, ...] = (ZONE_LABEL,)

    def group(self, node: Node) -> Group:
        """``node``'s topology group: its values of :attr:`topology_keys`."""
        return tuple(node.labels.get(key, "") for key in self.topology_keys)

    def groups(self) -> dict[str, Group]:
        """Each node's topology group, by node name."""
        if len(self.topology_keys) == 1:
            (key,) = self.topology_keys
            return {n.name: (n.labels.get(key, ""),) for n in self.nodes}
        return {n.name: self.group(n) for n in self.nodes}


@dataclass(frozen=True, slots=True)
class JobShape:
    """One unfinished job as the scaler sees it. Times are seconds on ``now``'s clock.

    ``nodes`` holds the node of each replica, by replica index (empty unless Running).
    ``sizes`` are the allowed replica counts, smallest first (``min`` to ``max``).
    ``lost`` maps a node to when it was first seen gone or unschedulable; a replica on
    such a node not listed counts as lost since ``now``. ``busy``: a recovery or resize
    is under way; the job keeps its slots and is left alone. ``held``: it may hold no
    replica (suspended by its owner, or not admitted by Kueue).
    """

    name: str
    nproc: int = 1
    sizes: tuple[int, ...] = (1,)
    priority: int = 0
    submitted: float = 0.0
    phase: Phase = Phase.PENDING
    nodes: tuple[str, ...] = ()
    resized_at: float | None = None
    restarted_at: float | None = None
    avoid: frozenset[str] = frozenset()
    lost: Mapping[str, float] = field(default_factory=dict)
    spares: tuple[str, ...] = ()
    busy: bool = False
    held: bool = False
    cooldown: float = 60.0
    snooze: float = 60.0
    faulty_timeout: float = 60.0
    settle: float = SETTLE_SECONDS

    def __post_init__(self) -> None:
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise ValueError(f"job {self.name}: sizes must be positive, sorted and unique")
        if self.nproc < 1:
            raise ValueError(f"job {self.name}: nproc must be at least 1")

    @property
    def min(self) -> int:
        """The fewest replicas it runs with."""
        return self.sizes[0]

    @property
    def max(self) -> int:
        """The most replicas it runs with."""
        return self.sizes[-1]

    @property
    def replicas(self) -> int:
        """Replicas it holds now."""
        return len(self.nodes) if self.phase is Phase.RUNNING else 0


@dataclass(frozen=True, slots=True)
class Resize:
    """One change of one job's size, and where.

    ``remove``: replica indices (of the current numbering) that go. ``add``: one node
    per new replica. ``nodes``: the node of each replica afterwards, survivors in their
    old order, then the new ones; empty after a suspension.
    """

    job: str
    kind: Kind
    from_replicas: int
    to_replicas: int
    why: str
    add: tuple[str, ...] = ()
    remove: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GrowWait:
    """A grow that free slots allow and a debounce holds back: the size it would grow to
    (if the slots are still free then), what holds it, in words, and until when."""

    job: str
    to_replicas: int
    why: str
    until: float


@dataclass(frozen=True, slots=True)
class Plan:
    """A decision: the resizes, in the order to carry them out, why each job that gets
    nothing yet waits (job name to reason, in words), and the grows held back (job name
    to :class:`GrowWait`)."""

    resizes: tuple[Resize, ...]
    waiting: Mapping[str, str]
    held: Mapping[str, GrowWait] = field(default_factory=dict)


def decide(cluster: Cluster, jobs: list[JobShape], now: float) -> list[Resize]:
    """The resizes to carry out now, in order (see the module's docstring)."""
    return list(plan(cluster, jobs, now).resizes)


def plan(cluster: Cluster, jobs: list[JobShape], now: float) -> Plan:
    """The resizes to carry out now and why the jobs left waiting wait."""
    state = _State.build(cluster, jobs, now)
    for work in state.works:
        _drop_above_max(state, work)
    for work in state.works:
        _drop_lost(state, work)
    for work in state.works:
        _admit(state, work)
    for work in state.works:
        _grow(state, work)
    found = [(work, _resize(work)) for work in state.works]
    ordered = sorted(
        ((_KIND_ORDER[r.kind], rank, r) for rank, (_, r) in enumerate(found) if r is not None),
        key=lambda item: (item[0], item[1]),
    )
    return Plan(resizes=tuple(r for _, _, r in ordered), waiting=state.waiting, held=state.held)


def applied(job: JobShape, resize: Resize, now: float) -> JobShape:
    """``job`` once ``resize`` is carried out at ``now`` (for simulations and tests)."""
    phase = Phase.SUSPENDED if resize.kind is Kind.SUSPEND else Phase.RUNNING
    gone = set(resize.nodes)
    lost = {node: since for node, since in job.lost.items() if node in gone}
    return replace(
        job,
        phase=phase,
        nodes=resize.nodes,
        resized_at=now,
        lost=lost,
        spares=() if phase is Phase.SUSPENDED else job.spares,
    )


_KIND_ORDER = {Kind.SUSPEND: 0, Kind.SHRINK: 1, Kind.RESUME: 2, Kind.ADMIT: 2, Kind.GROW: 3}


@dataclass(slots=True, eq=False)
class _Work:
    """A job's state while a decision is made: which replicas it keeps, which it adds."""

    shape: JobShape
    held: int
    """Replicas it held when the decision began."""
    lost_since: dict[int, float]
    dropped: int = 0
    added: list[str] = field(default_factory=list)
    admitted: bool = False
    suspended: bool = False
    notes: list[str] = field(default_factory=list)
    _order: list[int] | None = None

    def order(self) -> list[int]:
        """Its replicas in the order they would go: lost ones (oldest loss first), then
        the highest index first."""
        if self._order is None:
            lost = self.lost_since
            first = sorted(lost, key=lambda i: (lost[i], -i))
            self._order = first + [i for i in range(self.held - 1, -1, -1) if i not in lost]
        return self._order

    @property
    def size(self) -> int:
        """Replicas it holds in the decision so far."""
        return self.held - self.dropped + len(self.added)

    @property
    def kept(self) -> list[int]:
        """Its current replicas it keeps, by index."""
        if not self.dropped:
            return list(range(self.held))
        return sorted(self.order()[self.dropped :])

    def cooling(self, now: float) -> float:
        """Seconds of cool-down left (0 when none)."""
        at = self.shape.resized_at
        return 0.0 if at is None else max(at + self.shape.cooldown - now, 0.0)


@dataclass(slots=True, eq=False)
class _State:
    now: float
    pool: Pool
    groups: _Groups
    works: list[_Work]
    ranks: list[int]
    """Minus each work's priority, in the order of ``works`` (ascending)."""
    arrived: float | None
    """When the newest schedulable node became schedulable, if known."""
    waiting: dict[str, str] = field(default_factory=dict)
    held: dict[str, GrowWait] = field(default_factory=dict)

    @staticmethod
    def build(cluster: Cluster, jobs: list[JobShape], now: float) -> _State:
        groups = _Groups(cluster)
        free = {n.name: n.slots - n.reserved for n in cluster.nodes if n.schedulable}
        lost = _take_used(free, jobs)
        pool = Pool(free, groups.of, max((n.slots for n in cluster.nodes), default=0))
        shapes = sorted(jobs, key=lambda j: (-j.priority, j.submitted, j.name))
        works = [_work(shape, lost, now) for shape in shapes]
        ranks = [-w.shape.priority for w in works]
        arrived = max(
            (n.ready_since for n in cluster.nodes if n.schedulable and n.ready_since is not None),
            default=None,
        )
        return _State(now=now, pool=pool, groups=groups, works=works, ranks=ranks, arrived=arrived)


class _Groups:
    """Nodes' topology groups, worked out when first asked for."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nodes = {n.name: n for n in cluster.nodes}
        self.known: dict[str, Group] = {}

    def of(self, name: str) -> Group:
        """``name``'s group (a node not in the cluster: no labels)."""
        group = self.known.get(name)
        if group is None:
            node = self.nodes.get(name)
            keys = self.cluster.topology_keys
            group = ("",) * len(keys) if node is None else self.cluster.group(node)
            self.known[name] = group
        return group


def _take_used(free: dict[str, int], jobs: list[JobShape]) -> set[str]:
    """Take from ``free`` the slots of Running jobs' replicas and spares; the nodes they
    are on that ``free`` lacks (gone or unschedulable)."""
    by_nproc: dict[int, Counter[str]] = {}
    for shape in jobs:
        if shape.phase is Phase.RUNNING:
            counter = by_nproc.setdefault(shape.nproc, Counter())
            counter.update(shape.nodes)
            counter.update(shape.spares)
    lost: set[str] = set()
    for nproc, counter in by_nproc.items():
        for node, count in counter.items():
            if node in free:
                free[node] -= nproc * count
            else:
                lost.add(node)
    return lost


def _work(shape: JobShape, lost: set[str], now: float) -> _Work:
    if shape.phase is not Phase.RUNNING:
        return _Work(shape=shape, held=0, lost_since={})
    since: dict[int, float] = {}
    if lost and not lost.isdisjoint(shape.nodes):
        since = {i: shape.lost.get(n, now) for i, n in enumerate(shape.nodes) if n in lost}
    return _Work(shape=shape, held=len(shape.nodes), lost_since=since)


def _at_most(sizes: tuple[int, ...], count: int) -> int | None:
    at = bisect.bisect_right(sizes, count)
    return sizes[at - 1] if at else None


def _below(sizes: tuple[int, ...], count: int) -> int | None:
    at = bisect.bisect_left(sizes, count)
    return sizes[at - 1] if at else None


def _drop(state: _State, work: _Work, count: int) -> None:
    nodes = [work.shape.nodes[i] for i in work.order()[work.dropped : work.dropped + count]]
    state.pool.give_all(nodes, work.shape.nproc)
    work.dropped += count


def _undrop(state: _State, work: _Work, count: int) -> None:
    work.dropped -= count
    nodes = [work.shape.nodes[i] for i in work.order()[work.dropped : work.dropped + count]]
    state.pool.take_all(nodes, work.shape.nproc)


def _suspend(state: _State, work: _Work) -> int:
    """Suspend ``work``: drop every replica left and free its spares; the count dropped."""
    count = work.held - work.dropped
    _drop(state, work, count)
    state.pool.give_all(work.shape.spares, work.shape.nproc)
    work.suspended = True
    return count


def _unsuspend(state: _State, work: _Work, count: int) -> None:
    state.pool.take_all(work.shape.spares, work.shape.nproc)
    work.suspended = False
    _undrop(state, work, count)


def _drop_above_max(state: _State, work: _Work) -> None:
    """Pass 0: shrink a job holding more replicas than its largest allowed size."""
    shape = work.shape
    if shape.busy or work.size == 0:
        return
    if shape.held:
        _suspend(state, work)
        work.notes.append("held: suspended by its spec.suspend, or not admitted by Kueue")
        return
    if work.size <= shape.max:
        return
    _drop(state, work, work.size - shape.max)
    work.notes.append(f"above its max of {shape.max} replicas")


def _drop_lost(state: _State, work: _Work) -> None:
    """Pass 1: shrink a job whose lost replicas waited ``faulty_timeout`` in vain."""
    shape, now = work.shape, state.now
    if shape.busy or not work.lost_since or len(shape.sizes) == 1:
        return
    spares = sum(1 for node in shape.spares if node in state.pool.free)
    overdue = [i for i, t in work.lost_since.items() if now - t >= shape.faulty_timeout]
    excess = len(overdue) - spares
    if excess <= 0 or work.cooling(now) > 0:
        return
    gone = sorted({shape.nodes[i] for i in overdue})
    why = (
        f"{len(overdue)} replica(s) on lost node(s) {', '.join(gone)} gone "
        f"{shape.faulty_timeout:g} s or more with no spare"
    )
    target = _at_most(shape.sizes, work.size - excess)
    if target is None:
        _suspend(state, work)
        work.notes.append(f"{why}; fewer than min {shape.min} left")
        return
    _drop(state, work, work.size - target)
    work.notes.append(why)


def _try_place(state: _State, shape: JobShape, count: int, prefer: list[Group]) -> list[str] | None:
    """Room for exactly ``count`` replicas of ``shape``, taken; None (nothing taken) if
    it does not fit."""
    if count <= 0:
        return []
    if state.pool.total < count * shape.nproc:
        return None
    placed = state.pool.place(shape.nproc, count, prefer, shape.avoid)
    if len(placed) < count:
        state.pool.give_all(placed, shape.nproc)
        return None
    return placed


def _admission_groups(state: _State, shape: JobShape) -> list[Group]:
    group = state.pool.roomiest_group(shape.nproc)
    return [] if group is None else [group]


def _admit(state: _State, work: _Work) -> None:
    """Pass 2: give a waiting job its ``min``, making room from lower priorities."""
    shape = work.shape
    if shape.phase is Phase.RUNNING or shape.busy:
        return
    if shape.held:
        state.waiting[shape.name] = "held: suspended by its spec.suspend, or not admitted by Kueue"
        return
    left = work.cooling(state.now)
    if left > 0:
        state.waiting[shape.name] = f"in cool-down after its last resize: {left:.0f} s left"
        return
    prefer = _admission_groups(state, shape)
    placed = _try_place(state, shape, shape.min, prefer)
    if placed is None:
        placed = _preempt(state, work, prefer)
    if placed is None:
        state.waiting[shape.name] = _why_waiting(state, work)
        return
    work.added = placed
    work.admitted = True
    verb = "resumed" if shape.phase is Phase.SUSPENDED else "admitted"
    work.notes.insert(0, f"{verb} at min {shape.min} on {_listing(placed)}")


def _victims(state: _State, work: _Work) -> list[_Work]:
    """Jobs that may make room for ``work``: strictly lower priority, holding replicas,
    not busy, not admitted now, out of cool-down; lowest priority, latest submitted first."""
    lower = bisect.bisect_right(state.ranks, -work.shape.priority)
    return [
        v
        for v in reversed(state.works[lower:])
        if v.shape.phase is Phase.RUNNING
        and not v.shape.busy
        and not v.suspended
        and v.size > 0
        and v.cooling(state.now) == 0
    ]


_Step = tuple[_Work, int, bool]
"""A victim, the replicas it gave up, and whether it was suspended."""


def _preempt(state: _State, work: _Work, prefer: list[Group]) -> list[str] | None:
    """Shrink, then suspend, lower-priority jobs until ``work``'s ``min`` fits; the
    placement taken, or None with everything as it was."""
    shape = work.shape
    victims = _victims(state, work)
    held = sum((v.size + len(v.shape.spares)) * v.shape.nproc for v in victims)
    if state.pool.total + held < shape.min * shape.nproc:
        return None
    steps: list[_Step] = []
    placed = _shrink_victims(state, work, victims, steps, prefer)
    if placed is None:
        placed = _suspend_victims(state, work, victims, steps, prefer)
    if placed is None:
        for victim, count, suspended in reversed(steps):
            (_unsuspend if suspended else _undrop)(state, victim, count)
        return None
    for victim, _, _ in steps:
        verb = "suspended" if victim.suspended else "shrunk"
        note = f"{verb} for higher-priority job {shape.name} (priority {shape.priority})"
        if note not in victim.notes:
            victim.notes.append(note)
    return placed


def _shrink_victims(
    state: _State, work: _Work, victims: list[_Work], steps: list[_Step], prefer: list[Group]
) -> list[str] | None:
    for victim in victims:
        while (size := _below(victim.shape.sizes, victim.size)) is not None:
            count = victim.size - size
            _drop(state, victim, count)
            steps.append((victim, count, False))
            placed = _try_place(state, work.shape, work.shape.min, prefer)
            if placed is not None:
                return placed
    return None


def _suspend_victims(
    state: _State, work: _Work, victims: list[_Work], steps: list[_Step], prefer: list[Group]
) -> list[str] | None:
    for victim in victims:
        steps.append((victim, _suspend(state, victim), True))
        if _fits(state, work.shape, prefer):
            _keep_unneeded_shrinks(state, work.shape, steps, prefer)
            return _try_place(state, work.shape, work.shape.min, prefer)
    return None


def _fits(state: _State, shape: JobShape, prefer: list[Group]) -> bool:
    placed = _try_place(state, shape, shape.min, prefer)
    if placed is None:
        return False
    state.pool.give_all(placed, shape.nproc)
    return True


def _keep_unneeded_shrinks(
    state: _State, shape: JobShape, steps: list[_Step], prefer: list[Group]
) -> None:
    """Undo the shrinks (latest first) of jobs not suspended that the suspensions made
    needless, each job's in the reverse of their order, so it stays at an allowed size;
    ``steps`` keeps only what stays done."""
    kept: set[int] = set()  # victims with a shrink that stays: their earlier ones stay too
    for step in reversed(list(steps)):
        victim, count, suspended = step
        if suspended or victim.suspended or id(victim) in kept:
            continue
        _undrop(state, victim, count)
        if _fits(state, shape, prefer):
            steps.remove(step)
        else:
            _drop(state, victim, count)
            kept.add(id(victim))


def _why_waiting(state: _State, work: _Work) -> str:
    shape = work.shape
    placed = state.pool.place(shape.nproc, shape.min, [], shape.avoid)
    state.pool.give_all(placed, shape.nproc)
    reason = (
        f"waiting for capacity: needs {shape.min} replica(s) of {shape.nproc} slot(s), "
        f"{len(placed)} fit in free slots"
    )
    if shape.avoid:
        avoided = sorted(shape.avoid)
        more = f" and {len(avoided) - 5} more" if len(avoided) > 5 else ""
        reason += f" (avoiding {', '.join(avoided[:5])}{more})"
    if _victims(state, work):
        return reason + "; shrinking and suspending lower-priority jobs would not make room"
    return reason + "; no lower-priority job to make room"


def _may_grow(state: _State, work: _Work) -> bool:
    shape = work.shape
    if work.size == 0 or work.size >= shape.max or shape.busy or work.dropped or shape.held:
        return False
    if work.lost_since:  # waiting for its lost node, or just shrunk without it
        return False
    return state.pool.total >= shape.nproc


def _hold(state: _State, work: _Work) -> tuple[str, float] | None:
    """What holds a grow of ``work`` back and until when (the latest to end), or None.
    A job just admitted keeps only the snooze: the rest is about resizing a running job."""
    shape = work.shape
    holds = []
    if shape.restarted_at is not None:
        holds.append(("the snooze after a restart", shape.restarted_at + shape.snooze))
    if not work.admitted:
        if shape.resized_at is not None:
            holds.append(("the cool-down after its last resize", shape.resized_at + shape.cooldown))
        if state.arrived is not None:
            holds.append(("capacity still arriving (a node came up)", state.arrived + shape.settle))
    held = [hold for hold in holds if hold[1] > state.now]
    return max(held, key=lambda hold: hold[1]) if held else None


def _grow(state: _State, work: _Work) -> None:
    """Pass 3: the largest allowed size up to ``max`` whose new replicas fit, unless a
    debounce holds it back (then :attr:`_State.held` says to what size and until when)."""
    if not _may_grow(state, work):
        return
    shape = work.shape
    here: dict[Group, int] = {}
    for i in work.kept:
        group = state.groups.of(shape.nodes[i])
        here[group] = here.get(group, 0) + 1
    prefer = sorted(here, key=lambda g: -here[g]) or [state.groups.of(n) for n in work.added[:1]]
    placed = state.pool.place(shape.nproc, shape.max - work.size, prefer, shape.avoid)
    target = _at_most(shape.sizes, work.size + len(placed))
    keep = 0 if target is None else max(target - work.size, 0)
    hold = _hold(state, work)
    if hold is not None:
        state.pool.give_all(placed, shape.nproc)
        if keep and not work.admitted:  # an admission says nothing of a resize
            why, until = hold
            state.held[shape.name] = GrowWait(shape.name, work.size + keep, why, until)
        return
    state.pool.give_all(placed[keep:], shape.nproc)
    if keep:
        work.added.extend(placed[:keep])
        if not work.admitted:
            work.notes.append(f"free slots on {_listing(placed[:keep])}")


def _listing(nodes: list[str]) -> str:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    shown = [f"{n}" if c == 1 else f"{n} (x{c})" for n, c in list(counts.items())[:8]]
    more = len(counts) - len(shown)
    return ", ".join(shown) + (f" and {more} more node(s)" if more else "")


def _resize(work: _Work) -> Resize | None:
    if not work.dropped and not work.added:
        return None
    shape = work.shape
    before = shape.replicas
    kept = work.kept
    nodes = tuple(shape.nodes[i] for i in kept) + tuple(work.added)
    if work.admitted:
        kind = Kind.RESUME if shape.phase is Phase.SUSPENDED else Kind.ADMIT
    elif work.suspended:
        kind, nodes = Kind.SUSPEND, ()
    else:
        kind = Kind.GROW if work.added else Kind.SHRINK
    if work.admitted and len(nodes) > shape.min:
        work.notes.append(f"grown to {len(nodes)} on free slots")
    why = f"{kind.value} {before} -> {len(nodes)}: " + "; ".join(work.notes)
    return Resize(
        job=shape.name,
        kind=kind,
        from_replicas=before,
        to_replicas=len(nodes),
        why=why,
        add=tuple(work.added),
        remove=tuple(sorted(work.order()[: work.dropped])),
        nodes=nodes,
    )
