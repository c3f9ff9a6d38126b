"""Recovery decisions: pure functions over a job record, a fault and a view of the nodes.

The restarter service decides with them, and so does the goodput simulator
(:mod:`resurge.simulation`): one policy, no copy of it.

:func:`apply_fault` edits a record in place and returns what was decided; the record,
with the plan in ``pending_recovery``, is written (compare-and-set) before any command
goes out, so a fault is acted on once: a fault already in ``handled_faults``, or from
a generation older than the record's, changes nothing.

The ladder (DESIGN section 4), cheapest first: ``in_process``, ``process``, ``pod``,
``node``, ``job``. Choosing a level:

1. A node fault about a node the job no longer runs on, or that the job already avoids,
   changes nothing: it is the tail of an incident already acted on (an XID and its
   node's health fault are one incident, in either order). Faults of an older
   generation change nothing either (a dead rank's peers failing their collectives),
   except a lost node the current generation still runs on: it breaks that one too.
2. The fault's scope sets the floor (process -> in_process, node -> node, job -> job),
   raised to the detector's ``suggested_level``; ``in_process`` needs workers that run
   under ``resurge.worker.restartable`` (else ``process``). An XID whose action is
   ``reset_gpu`` starts at ``process`` instead, with the GPU reset between the Stop and
   the Assign (``PendingRecovery.reset_gpus``), where the caller says the cluster resets
   GPUs (``gpu_resets``), its node is not cordoned, and it is a new incident: not a
   repeat offender, not the same fault at the same place again within the window, not
   a generation that did not train. Otherwise it takes the node floor (the job leaves).
3. A fault escalates only when the last restart did not fix it, a fact about the
   generation it started, not about time: it climbs one rung above the restart before
   it when it is a fault of the generation that restart started and that generation did
   not train (:func:`generation_fixed`), or when the same fault at the same place (its
   reason, and the same rank, else replica, for process faults; the same node for node
   faults) was restarted inside ``evalPeriodSeconds`` (one rung above its rung then).
   Independent faults each get the floor. ``node`` is a rung only for faults about a
   node (node scope, or a node that became a repeat offender: ``maxRepeatOffenders``
   node faults in the window); a crashing process climbs process -> pod -> job, never
   cordoning. The restarts of one incident (``RestartEntry.stalled``: each for a fault
   of a generation that did not train) count in the window however long ago they were,
   so a failure loop slower than ``evalPeriodSeconds`` (a start-up hang judged after the
   learned 600 s) climbs and ends too; its message says what its generations had in
   common (the step they got no further than, or that they ended before the rendezvous).
4. The first rung listed in ``recovery.levels`` at or above that is taken (past the top
   listed rung, the top one); a rung whose ``maxRestartsPerLevel`` is spent inside the
   window passes to the next; the top rung's limit (``TOP_RUNG_LIMIT`` unless set) spent
   fails the job: that is what ends a crash loop. ``numRestartBeforeFullJobRestart``
   restarts below ``job`` inside the window make it ``job``.
5. The job fails, saying which fault and which limit, when the top rung's limit is
   spent, ``maxFullJobRestarts`` full restarts are spent, or ``jobMaxRetryCount``
   restarts are (a lifetime cap only when the user sets one).

A generation trained (:func:`generation_fixed`; the same fact ends a recovery, see
:func:`apply_sign_of_life`, :func:`apply_rendezvous`, :func:`apply_settled`): for
workers that report progress, a step past its resume point; for workers that report
none, every rank passed its rendezvous (``RendezvousPassed``, from the agent hosting the
generation's store). A worker that exits 0 did its work: its generation trained too
(:func:`apply_worker_succeeded`). A worker start is not training. Only for a job none
of whose generations ever passed a rendezvous (its scripts never join the agent's
store: no ``torch.distributed``, an ``init_method`` of their own, or an agent that could
not start the store) does ``SETTLE_SECONDS`` of running count instead.

A generation that trained but failed the same way as the one before it (the same fault
at the same place) without getting past the furthest step the generations of the
incident reached (``reached``, which the caller passes: the restarter's own view of the
progress) did not get further either: a crash at the same step every time, resumed
from an older checkpoint, climbs however slowly it repeats.

A failed job's message ends with the failing rank's own last output lines (the fault's
``last_output`` evidence).

Backoff is for faults that persist: a new incident is restarted at once; the n-th
restart for one fault that the restarts before did not fix (each escalation above
counts one) waits ``min(initialSeconds * multiplier**(n-2), maxSeconds)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from resurge.cluster import NodeInfo
from resurge.contract.xid import XidAction
from resurge.control.decisions.checkpoint_count import apply_checkpoint
from resurge.control.decisions.job_end import begin_ending
from resurge.control.decisions.ladder import LADDER, SCOPE_FLOOR, one_above, rung
from resurge.control.decisions.lifecycle import move_to
from resurge.control.decisions.planner import master_port_for
from resurge.control.state.records import (
    GpuOnNode,
    JobRecord,
    LastFault,
    LastRecovery,
    Move,
    PendingRecovery,
    Placement,
    RestartEntry,
)
from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel
from resurge.jobspec import TrainingJob
from resurge.jobspec.recovery import TOP_RUNG_LIMIT

__all__ = [
    "SETTLE_SECONDS",
    "ClusterView",
    "Decision",
    "Verdict",
    "apply_checkpoint",
    "apply_fault",
    "apply_progress_capability",
    "apply_rendezvous",
    "apply_settled",
    "apply_sign_of_life",
    "apply_worker_succeeded",
    "backoff_seconds",
    "claim",
    "fault_signature",
    "generation_fixed",
    "last_output_words",
    "mark_dispatched",
    "same_plan",
    "settle_due",
    "supersede",
]

# A generation of a job whose workers report no progress and never pass a rendezvous
# (the fallback: see the module docstring) counts as having trained once it has run this
# long without a fault.
SETTLE_SECONDS = 30.0

# The failing rank's last output lines a failed job's message quotes (all are in the
# fault's evidence).
LAST_LINES_SHOWN = 2

# Reasons of faults that judge a rank hung: its workers are stopped without a grace period.
HANG_REASONS = frozenset({"hang", "log_hang"})


class Verdict(Enum):
    """What :func:`apply_fault` decided: change nothing, restart, or fail the job."""

    IGNORE = "ignore"
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    """A verdict, why (in words), and the level of a restart."""

    verdict: Verdict
    why: str
    level: RecoveryLevel = RecoveryLevel.PROCESS


@dataclass(frozen=True)
class ClusterView:
    """What a `node` recovery may move a replica to: live nodes and slots taken on each."""

    nodes: list[NodeInfo] = field(default_factory=list)
    used: dict[str, int] = field(default_factory=dict)


def fault_signature(fault: FaultDetected) -> str:
    """What makes two faults 'the same fault' for escalation: the reason and the place."""
    if fault.scope is FaultScope.NODE:
        return f"{fault.reason}@{fault.node}"
    if fault.scope is FaultScope.PROCESS and fault.rank is not None:
        return f"{fault.reason}@rank{fault.rank}"
    if fault.scope is FaultScope.PROCESS and fault.replica is not None:
        return f"{fault.reason}@replica{fault.replica}"
    return fault.reason


def generation_fixed(record: JobRecord, generation: int, now: datetime) -> bool:
    """Whether ``generation`` trained: for workers that report progress, a step past its
    resume point; for workers that report none, its ranks passed their rendezvous; or,
    for a job none of whose generations ever passed one (its scripts never join the
    agent's rendezvous store), it has been running ``SETTLE_SECONDS``."""
    if record.progressed_generation is not None and record.progressed_generation >= generation:
        return True
    if record.reports_progress:
        return False
    if record.rendezvous_generation is not None:
        return record.rendezvous_generation >= generation
    if generation != record.generation or record.alive_since is None:
        return False
    return (now - record.alive_since).total_seconds() >= SETTLE_SECONDS


def backoff_seconds(job: TrainingJob, failed_before: int) -> float:
    """Delay before a restart that follows ``failed_before`` restarts that did not fix
    the same fault."""
    if failed_before <= 0:
        return 0.0
    backoff = job.spec.recovery.backoff
    delay = backoff.initial_seconds * backoff.multiplier ** (failed_before - 1)
    return float(min(delay, backoff.max_seconds))


def _rank(level: RecoveryLevel) -> int:
    return LADDER.index(level)


def _fault_node(record: JobRecord, fault: FaultDetected) -> str | None:
    if fault.node is not None:
        return fault.node
    for p in record.placements:
        if p.replica == fault.replica:
            return p.node
    return None


@dataclass(frozen=True)
class _Choice:
    level: RecoveryLevel | None  # None: a limit is spent
    why: str
    attempt: int = 1  # 1: a new incident; n: the n-th restart for one that persists


def _chain(history: list[RestartEntry]) -> list[RestartEntry]:
    """The newest restarts that are one incident: the last one and, back from it, each
    one before a restart flagged ``stalled`` (the oldest of them started the incident)."""
    start = len(history) - 1
    while start > 0 and history[start].stalled:
        start -= 1
    return history[max(start, 0) :]


def _unfixed(
    record: JobRecord, fault: FaultDetected, now: datetime, reached: int | None
) -> list[RestartEntry]:
    """The restarts of the incident the fault continues, oldest first, or none: the
    last restart started the fault's generation and that generation did not train
    (:func:`generation_fixed`), so that restart did not fix what it was for."""
    history = record.history
    if fault.generation is None or fault.generation != record.generation or not history:
        return []
    if history[-1].to_generation != fault.generation:
        return []
    chain = _chain(history)
    if not generation_fixed(record, fault.generation, now):
        return chain
    # It trained, but failed the same way as the generation before it without getting
    # past the furthest step the generations of the incident reached: a crash at the same
    # step every time, resuming from an older checkpoint.
    reference = max((e.reached for e in chain if e.reached is not None), default=None)
    same = history[-1].signature == fault_signature(fault)
    stuck = same and reached is not None and reference is not None and reached <= reference
    return chain if stuck else []


def _stall_words(
    record: JobRecord, chain: list[RestartEntry], generation: int, reached: int | None
) -> str:
    """What the generations of an incident that never trained had in common."""
    first = chain[0].to_generation if chain[0].to_generation is not None else generation
    if not record.reports_progress and not chain[0].rendezvous and chain[0].reached is None:
        first = max(first - 1, 0)  # the generation before it did not train either
    span = f"generations {first}-{generation}" if first < generation else f"generation {first}"
    stalled = [e.reached for e in chain[1:] if e.reached is not None]
    if reached is not None:
        stalled.append(reached)
    if stalled:
        reference = max([*stalled, *(e.reached for e in chain[:1] if e.reached is not None)])
        return f"{span} got no further than step {reference}"
    passed = record.rendezvous_generation is not None and record.rendezvous_generation >= generation
    if passed or any(e.rendezvous for e in chain[1:]):
        return f"{span} passed the rendezvous and made no step past the resume point"
    if record.reports_progress:
        return f"{span} made no step past the resume point"
    return f"{span} ended before the rendezvous"


def _floor(
    record: JobRecord, fault: FaultDetected, offender: bool, reset: bool = False
) -> RecoveryLevel:
    """The lowest rung ``fault`` may take (rule 2): its scope's, raised to the detector's
    suggestion, to ``node`` for a repeat offender, past ``in_process`` for a job whose
    workers cannot restart in their processes; ``process`` for a GPU ``reset`` (the
    processes leave the GPU, the job stays on its node)."""
    if reset:
        return RecoveryLevel.PROCESS
    floor = SCOPE_FLOOR[fault.scope]
    if fault.suggested_level is not None and _rank(fault.suggested_level) > _rank(floor):
        floor = fault.suggested_level
    if offender and _rank(floor) < _rank(RecoveryLevel.NODE):
        floor = RecoveryLevel.NODE
    if rung(floor).in_process and not record.in_process_capable:
        floor = one_above(floor, _node_rung(fault, offender))
    return floor


def _node_rung(fault: FaultDetected, offender: bool) -> bool:
    """Whether the rungs for node faults are open to ``fault``."""
    return fault.scope is FaultScope.NODE or offender


def _escalated(
    fault: FaultDetected, incident: _Incident, floor: RecoveryLevel
) -> tuple[RecoveryLevel, str, int]:
    """Rule 3: the floor raised one rung above a restart that did not fix the fault, or
    above the same fault's restarts at the same place in the window; why; and which
    attempt at this fault the restart is (1: a new incident)."""
    node_rung = _node_rung(fault, incident.offender)
    why = "lowest allowed level"
    previous = incident.unfixed[-1] if incident.unfixed else None
    signature = fault_signature(fault)
    repeats = [e for e in incident.window if e.signature == signature]
    earlier = [e for e in (previous, repeats[-1] if repeats else None) if e is not None]
    attempt = 1 + max((e.attempt for e in earlier), default=0)
    if previous is not None:
        above = one_above(previous.level, node_rung)
        if _rank(above) > _rank(floor):
            floor = above
        why = incident.stall
    if repeats:
        above = one_above(max((e.level for e in repeats), key=_rank), node_rung)
        if _rank(above) > _rank(floor):
            floor = above
            why = "the same fault at the same place repeated within evalPeriodSeconds"
    return floor, why, attempt


def _choose_level(
    record: JobRecord, fault: FaultDetected, incident: _Incident, reset: bool = False
) -> _Choice:
    """Rules 2-4: the floor, raised by escalation, then the first listed rung at or above
    it whose restarts in the window are not spent (or ``job`` once
    ``numRestartBeforeFullJobRestart`` is reached); ``reset``: the floor of a GPU reset."""
    recovery = record.spec.spec.recovery
    window = incident.window
    floor, why, attempt = _escalated(
        fault, incident, _floor(record, fault, incident.offender, reset)
    )
    if reset:
        why = "its XID asks for a GPU reset: the GPU is reset, the job restarts where it was"
    node_rung = _node_rung(fault, incident.offender)
    usable = [lv for lv in recovery.levels if node_rung or not rung(lv).node_faults_only]
    usable = usable or list(recovery.levels)
    candidates = [lv for lv in usable if _rank(lv) >= _rank(floor)] or [usable[-1]]
    below_job = sum(1 for e in window if e.level is not RecoveryLevel.JOB)
    stall = incident.stall
    where = f"for one incident ({stall})" if stall else "within evalPeriodSeconds"
    limit = recovery.num_restart_before_full_job_restart
    if (
        limit is not None
        and below_job >= limit
        and RecoveryLevel.JOB in recovery.levels
        and candidates[0] is not RecoveryLevel.JOB
    ):
        return _Choice(
            RecoveryLevel.JOB,
            f"{below_job} restarts below job level {where}: numRestartBeforeFullJobRestart={limit}",
            attempt,
        )
    top = usable[-1]
    for level in candidates:
        cap = recovery.max_restarts_per_level.get(level)
        if cap is None and level is top:
            cap = TOP_RUNG_LIMIT
        if cap is None or sum(1 for e in window if e.level is level) < cap:
            return _Choice(level, why, attempt)
    last = candidates[-1]
    if last in recovery.max_restarts_per_level:
        spent = f"maxRestartsPerLevel.{last.value}={recovery.max_restarts_per_level[last]}"
    else:
        spent = f"maxRestartsPerLevel.{last.value}={TOP_RUNG_LIMIT} (the top rung's default)"
    return _Choice(None, f"{spent} spent {where}")


def last_output_words(fault: FaultDetected, lines: int = LAST_LINES_SHOWN) -> str:
    """The failing rank's own last output lines (the fault's ``last_output`` evidence),
    the newest ``lines`` of them on one line, or empty when the fault has none."""
    output = fault.evidence.get("last_output")
    if not isinstance(output, str):
        return ""
    shown = [line.strip() for line in output.splitlines() if line.strip()][-lines:]
    return " | ".join(shown)


def _fail(record: JobRecord, fault: FaultDetected, limit: str) -> Decision:
    why = f"{fault.reason} ({fault.fault_id}) after {record.total_restarts} restarts: {limit}"
    output = last_output_words(fault)
    if output:
        who = "its worker" if fault.rank is None else f"rank {fault.rank}"
        why += f"; {who}'s last output: {output}"
    move_to(record, JobPhase.FAILED, why)
    record.pending_recovery = None
    return Decision(Verdict.FAIL, why)


def _move_targets(
    record: JobRecord, leaving: list[Placement], cluster: ClusterView
) -> list[Move] | None:
    """Where each replica in ``leaving`` goes (spares first), or None if one fits nowhere."""
    nproc = record.spec.spec.nproc_per_node
    gone = {p.node for p in leaving}
    staying: dict[str, int] = {}  # the job's own replicas that stay: ``used`` leaves them out
    for p in record.placements:
        if p not in leaving:
            staying[p.node] = staying.get(p.node, 0) + nproc
    avoid = set(record.avoid_nodes)
    free = {
        n.name: n.slots - cluster.used.get(n.name, 0) - staying.get(n.name, 0)
        for n in cluster.nodes
        if n.schedulable and n.name not in gone and n.name not in avoid
    }
    spares = [n for n in record.spare_nodes if n in free]  # held by the scaler, not used
    moves = []
    for placement in leaving:
        fits = [n for n in free if free[n] >= nproc]
        if not fits:
            return None
        target = min(fits, key=lambda n: (n not in spares, -free[n], n))
        free[target] -= nproc
        moves.append(Move(replica=placement.replica, from_node=placement.node, to_node=target))
    return moves


def _moved(placements: list[Placement], moves: list[Move], cluster: ClusterView) -> list[Placement]:
    address = {n.name: n.address for n in cluster.nodes}
    moved = {m.replica: m.to_node for m in moves}
    return [
        p
        if p.replica not in moved
        else Placement(
            replica=p.replica,
            node=moved[p.replica],
            address=address.get(moved[p.replica], p.address),
        )
        for p in placements
    ]


def apply_fault(
    record: JobRecord,
    fault: FaultDetected,
    *,
    now: datetime,
    cluster: ClusterView | None = None,
    claimant: str = "",
    lease_seconds: float = 5.0,
    reached: int | None = None,
    gpu_resets: bool = False,
) -> Decision:
    """Decide what ``fault`` calls for and edit ``record`` to match (the module's
    ladder): on a restart, the next generation and its plan in ``pending_recovery``,
    claimed by ``claimant`` until ``lease_seconds`` past its backoff; on a failure, the
    job's last steps in ``ending`` (:mod:`resurge.control.decisions.job_end`), claimed the same
    way. ``reached``: the furthest step the record's current generation completed, if
    the caller knows it. ``gpu_resets``: the cluster's monitors reset GPUs
    (``RESURGE_GPU_RESET``), so an XID that asks for a reset may restart in place.

    A plan the record held that was not carried out yet (waiting out its backoff, or a
    resize no restarter took yet) is replaced, and what it still owed passes to what
    replaces it (:func:`supersede`): its Stops, cordons, moves and recreated or released
    worker groups."""
    previous, plan = record.phase, record.pending_recovery
    decision = _decide(
        record,
        fault,
        now=now,
        cluster=cluster,
        claimant=claimant,
        lease_seconds=lease_seconds,
        reached=reached,
        gpu_resets=gpu_resets,
    )
    if decision.verdict is Verdict.FAIL:
        begin_ending(
            record,
            previous=previous,
            reason=decision.why,
            plan=plan,
            claimant=claimant,
            now=now,
            lease_seconds=lease_seconds,
        )
    elif decision.verdict is Verdict.RESTART and record.pending_recovery is not None:
        record.pending_recovery = supersede(plan, record.pending_recovery)
    return decision


def supersede(old: PendingRecovery | None, new: PendingRecovery) -> PendingRecovery:
    """``new``, with what ``old`` (the plan it replaces) still owed if ``old`` was not
    carried out: Stops to its ``stop_placements`` too (whose worker groups are deleted
    where the record no longer places them), its cordons, moves and recreations, and
    its GPU resets on nodes ``new`` does not leave."""
    if old is None or old.dispatched:
        return new
    have = {(p.replica, p.node) for p in new.stop_placements}
    owed = [p for p in old.stop_placements if (p.replica, p.node) not in have]
    left = {*new.cordon, *(m.from_node for m in new.moves)}  # no GPU reset owed there
    return new.model_copy(
        update={
            "stop_placements": [*new.stop_placements, *owed],
            "cordon": [*new.cordon, *(n for n in old.cordon if n not in new.cordon)],
            "moves": [*old.moves, *new.moves],
            "recreate": sorted({*old.recreate, *new.recreate}),
            "reset_gpus": [
                *new.reset_gpus,
                *(g for g in old.reset_gpus if g not in new.reset_gpus and g.node not in left),
            ],
        }
    )


@dataclass(frozen=True)
class _Incident:
    """What the record says about the fault's past: the restarts that count (inside the
    window, or of the incident it continues), those that did not fix it, in words, and
    the fault's node and whether that node is a repeat offender."""

    window: list[RestartEntry]
    unfixed: list[RestartEntry]
    stall: str
    node: str | None
    offender: bool


def _ignored(record: JobRecord, fault: FaultDetected) -> str | None:
    """Why ``fault`` changes nothing (rule 1 of the module docstring), or None."""
    if fault.alert_only:
        return "an alert: reported, not acted on"
    if record.phase.finished:
        return f"job is {record.phase.value}"
    if fault.fault_id in record.handled_faults:
        return "fault already handled"
    stale = fault.generation is not None and fault.generation < record.generation
    if stale and not _still_on_a_lost_node(record, fault):
        return f"fault of generation {fault.generation}, job is at {record.generation}"
    if record.phase is JobPhase.PENDING or not record.placements:
        return "job is not running"
    if fault.scope is FaultScope.NODE and fault.node is not None:
        if fault.node in record.avoid_nodes:
            return f"{fault.node} is already avoided by this job"
        if fault.node not in {p.node for p in record.placements}:
            return f"the job no longer runs on {fault.node}"
    return None


def _gpu_to_reset(
    fault: FaultDetected, incident: _Incident, cluster: ClusterView | None, gpu_resets: bool
) -> GpuOnNode | None:
    """The GPU to reset for ``fault`` instead of leaving its node (rule 2), or None."""
    gpu, node = fault.evidence.get("gpu"), incident.node
    if not gpu_resets or fault.reason != "gpu_xid" or node is None:
        return None
    if fault.evidence.get("action") != XidAction.RESET_GPU.value or not isinstance(gpu, int):
        return None
    if incident.offender or incident.unfixed or gpu < 0:
        return None
    signature = fault_signature(fault)
    if any(e.signature == signature for e in incident.window):
        return None  # the reset before did not fix it
    if cluster is not None and any(n.name == node and n.cordoned for n in cluster.nodes):
        return None  # cordoned (quarantined, drained): the job leaves it anyway
    return GpuOnNode(node=node, gpu=gpu)


def _still_on_a_lost_node(record: JobRecord, fault: FaultDetected) -> bool:
    """Whether ``fault`` says a node is lost that the record's generation still runs on:
    it breaks that generation too, whichever generation saw it first (two nodes lost
    together: the first loss's recovery started a generation on the second)."""
    placed = {p.node for p in record.placements}
    return fault.reason == "node_lost" and fault.node is not None and fault.node in placed


def _incident(
    record: JobRecord, fault: FaultDetected, now: datetime, reached: int | None
) -> _Incident:
    recovery = record.spec.spec.recovery
    period = timedelta(seconds=recovery.eval_period_seconds)
    history = record.history
    unfixed = _unfixed(record, fault, now, reached)
    stall = _stall_words(record, unfixed, record.generation, reached) if unfixed else ""
    # The restarts inside the window, and those of the incident the fault continues
    # however long ago they were: both are newest-last runs of the history.
    in_period = sum(1 for e in history if now - e.time < period)
    kept = max(in_period, len(unfixed))
    window = history[len(history) - kept :] if kept else []
    node = _fault_node(record, fault)
    node_scoped = fault.scope is FaultScope.NODE
    offences = sum(1 for e in window if e.node == node and e.node_scoped) + int(node_scoped)
    offender = node is not None and offences >= recovery.max_repeat_offenders
    return _Incident(window, unfixed, stall, node, offender)


def _choose(
    record: JobRecord, fault: FaultDetected, incident: _Incident, reset: bool = False
) -> _Choice:
    """The rung for ``fault`` (rules 2-4), or none and why (rule 5: a cap is spent)."""
    spent = _limit_spent(record, None)
    if spent is None:
        choice = _choose_level(record, fault, incident, reset)
        if choice.level is None:
            return choice
        spent = _limit_spent(record, choice.level)
        if spent is None:
            return choice
    return _Choice(None, f"{spent} ({incident.stall})" if incident.stall else spent)


def _limit_spent(record: JobRecord, level: RecoveryLevel | None) -> str | None:
    """The lifetime cap a restart at ``level`` (None: before choosing one) would pass."""
    recovery = record.spec.spec.recovery
    cap = recovery.max_restarts
    if level is None and cap is not None and record.total_restarts >= cap:
        return f"restart limit jobMaxRetryCount={cap} spent"
    full = recovery.max_full_job_restarts
    if level is RecoveryLevel.JOB and full is not None and record.restarts.get(level, 0) >= full:
        return f"full job restart limit maxFullJobRestarts={full} spent"
    return None


@dataclass
class _Effects:
    """What a restart does to the job's worker groups (its rung's row, applied)."""

    recreate: list[int] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    cordon: list[str] = field(default_factory=list)
    requeue: bool = False


def _effects(
    record: JobRecord,
    fault: FaultDetected,
    level: RecoveryLevel,
    incident: _Incident,
    cluster: ClusterView,
) -> _Effects:
    """Apply ``level``'s row of the ladder to ``record``: replicas moved off the fault's
    node, worker groups recreated, or the job back to wait for capacity where a moved
    replica fits nowhere."""
    row, node = rung(level), incident.node
    replicas = sorted(p.replica for p in record.placements)
    out = _Effects()
    if row.recreates == "faulty":
        out.recreate = [fault.replica] if fault.replica in replicas else replicas
    node_fault = fault.scope is FaultScope.NODE or incident.offender
    if node is not None and (
        row.leaves_node == "always" or (row.leaves_node == "node_faults" and node_fault)
    ):
        _leave(record, node, fault.scope is FaultScope.NODE, cluster, out)
    if row.recreates == "all":
        moved = {m.replica for m in out.moves}
        out.recreate = [] if out.requeue else [r for r in replicas if r not in moved]
    for replica in out.recreate:
        record.incarnations = {
            **record.incarnations,
            replica: record.incarnations.get(replica, 0) + 1,
        }
    return out


def _leave(record: JobRecord, node: str, cordon: bool, cluster: ClusterView, out: _Effects) -> None:
    """Move the replicas on ``node`` elsewhere (spares first), which the job then avoids
    (cordoned too for a node's own fault); where one fits nowhere, the job waits for
    capacity (``out.requeue``)."""
    placements = list(record.placements)
    if cordon:
        out.cordon = [node]
    if node not in record.avoid_nodes:
        record.avoid_nodes = [*record.avoid_nodes, node]
    targets = _move_targets(record, [p for p in placements if p.node == node], cluster)
    if targets is None:
        out.requeue = True
        return
    out.moves = targets
    record.placements = _moved(placements, targets, cluster)
    used_spares = {m.to_node for m in targets}
    record.spare_nodes = [n for n in record.spare_nodes if n not in used_spares]


def _decide(
    record: JobRecord,
    fault: FaultDetected,
    *,
    now: datetime,
    cluster: ClusterView | None,
    claimant: str,
    lease_seconds: float,
    reached: int | None,
    gpu_resets: bool,
) -> Decision:
    """The ladder in order: ignore, pick a level, edit the record."""
    ignored = _ignored(record, fault)
    if ignored is not None:
        return Decision(Verdict.IGNORE, ignored)
    record.remember_fault(fault.fault_id)
    record.last_fault = LastFault(
        fault_id=fault.fault_id, reason=fault.reason, scope=fault.scope.value, time=fault.time
    )
    incident = _incident(record, fault, now, reached)
    reset = _gpu_to_reset(fault, incident, cluster, gpu_resets)
    choice = _choose(record, fault, incident, reset is not None)
    if choice.level is None:
        return _fail(record, fault, choice.why)
    level = choice.level
    old_placements = list(record.placements)
    effects = _effects(record, fault, level, incident, cluster or ClusterView())
    record.history = [
        *incident.window,
        RestartEntry(
            time=now,
            level=level,
            signature=fault_signature(fault),
            node=incident.node,
            node_scoped=fault.scope is FaultScope.NODE,
            to_generation=record.generation + 1,
            attempt=choice.attempt,
            stalled=bool(incident.unfixed),
            reached=reached if fault.generation == record.generation else None,
            rendezvous=record.rendezvous_generation is not None
            and record.rendezvous_generation >= record.generation,
        ),
    ]
    start_at = now + timedelta(seconds=backoff_seconds(record.spec, choice.attempt - 1))
    from_generation = _next_generation(record, level)
    if effects.requeue:
        record.placements = []
        move_to(
            record,
            JobPhase.PENDING,
            f"{fault.reason} on {incident.node}: no node to move to; waiting for capacity "
            f"(avoiding {', '.join(record.avoid_nodes)})",
        )
    else:
        why = f"recovering from {fault.reason} at level {level.value} ({choice.why})"
        move_to(record, JobPhase.RECOVERING, why)
    record.pending_recovery = PendingRecovery(
        fault_id=fault.fault_id,
        level=level,
        reason=fault.reason,
        detected_at=fault.time,
        from_generation=from_generation,
        to_generation=record.generation,
        stop_placements=old_placements,
        recreate=effects.recreate,
        moves=effects.moves,
        cordon=effects.cordon,
        hung_ranks=[fault.rank] if fault.reason in HANG_REASONS and fault.rank is not None else [],
        requeue=effects.requeue,
        reset_gpus=[reset] if reset is not None and rung(level).leaves_node == "never" else [],
        start_at=start_at,
        claimed_by=claimant,
        claimed_until=max(now, start_at) + timedelta(seconds=lease_seconds),
    )
    return Decision(Verdict.RESTART, record.message, level)


def _next_generation(record: JobRecord, level: RecoveryLevel) -> int:
    """Start the record's next generation after a restart at ``level``; the one it left."""
    from_generation = record.generation
    record.generation += 1
    record.alive_since = None
    record.resume_step = None if record.latest_checkpoint is None else record.latest_checkpoint.step
    record.restarts = {**record.restarts, level: record.restarts.get(level, 0) + 1}
    record.master_port = master_port_for(record.name, record.generation, record.uid)
    record.finished_replicas = []
    return from_generation


def claim(
    record: JobRecord,
    claimant: str,
    now: datetime,
    lease_seconds: float,
    expected: PendingRecovery | None = None,
) -> bool:
    """Take over an undispatched plan whose claim expired (or is ours). True if taken.
    ``expected``: the plan the caller means to carry out; a record that holds another
    one (it was replaced meanwhile) is not claimed."""
    plan = record.pending_recovery
    if plan is None or plan.dispatched:
        return False
    if expected is not None and not same_plan(plan, expected):
        return False
    if plan.claimed_by != claimant and plan.claimed_until is not None and now < plan.claimed_until:
        return False
    until = max(now, plan.start_at) + timedelta(seconds=lease_seconds)
    record.pending_recovery = plan.model_copy(
        update={"claimed_by": claimant, "claimed_until": until}
    )
    return True


def same_plan(plan: PendingRecovery, other: PendingRecovery) -> bool:
    """Whether two plans are one (the same fault's or resize's, to the same generation),
    whatever their claims and whether dispatched."""
    return plan.fault_id == other.fault_id and plan.to_generation == other.to_generation


def mark_dispatched(record: JobRecord, to_generation: int) -> bool:
    """Mark the plan to ``to_generation`` carried out. True if it was not yet."""
    plan = record.pending_recovery
    if plan is None or plan.to_generation != to_generation or plan.dispatched:
        return False
    record.pending_recovery = plan.model_copy(update={"dispatched": True})
    return True


def apply_progress_capability(record: JobRecord, in_process: bool) -> bool:
    """Remember whether the job's workers can be restarted in-process."""
    if record.in_process_capable == in_process:
        return False
    record.in_process_capable = in_process
    return True


def apply_sign_of_life(
    record: JobRecord,
    generation: int,
    seen_at: datetime,
    *,
    progress: bool,
    step: int | None = None,
) -> bool:
    """A worker of ``generation`` started (``progress`` False) or completed ``step`` (True).

    A step past the generation's resume point marks it as having trained (its restart
    worked), and the first step of the new generation closes a pending recovery. A
    worker start only notes when the generation began running: a start is no sign it
    trained (a script that dies at once starts too), so it closes nothing; see
    :func:`apply_rendezvous` and :func:`apply_settled` for workers that report no
    progress. True if anything changed.
    """
    changed = False
    if progress and not record.reports_progress:
        record.reports_progress = True
        changed = True
    if generation == record.generation and not record.phase.finished:
        if not progress and record.alive_since is None:
            record.alive_since = seen_at
            changed = True
        past_resume = step is None or record.resume_step is None or step > record.resume_step
        if progress and past_resume and (record.progressed_generation or -1) < generation:
            record.progressed_generation = generation
            changed = True
    if not progress:
        return changed
    return _close_recovery(record, generation, seen_at) or changed


def apply_rendezvous(record: JobRecord, generation: int, seen_at: datetime) -> bool:
    """Every rank of ``generation`` passed its rendezvous (``init_process_group``).

    For workers that report no progress this is the sign the generation trained: it
    closes a pending recovery to it (its duration: the fault's detection to
    ``seen_at``), and a fault of it later is a new incident. True if anything changed."""
    changed = False
    if record.rendezvous_generation is None or record.rendezvous_generation < generation:
        record.rendezvous_generation = generation
        changed = True
    if record.reports_progress:
        return changed
    return _close_recovery(record, generation, seen_at) or changed


def apply_worker_succeeded(record: JobRecord, generation: int, exited_at: datetime) -> bool:
    """A worker of ``generation`` exited 0 (not stopped by its agent): it did its work, so
    the generation trained, whatever sign of it came or did not (a script that needs no
    rendezvous and finishes in seconds; a resumed job with no step left). A pending
    recovery to it ends (its duration: the fault's detection to ``exited_at``). True if
    anything changed."""
    if generation != record.generation:
        return False
    return _close_recovery(record, generation, exited_at)


def apply_settled(record: JobRecord, generation: int, now: datetime) -> bool:
    """The fallback close for a job whose scripts never join the agent's rendezvous
    store (no generation of it ever passed one) and report no progress: ``generation``
    has run ``SETTLE_SECONDS`` without a fault, so its pending recovery ends (its
    duration: the fault's detection to the generation's first worker start). True if
    anything changed."""
    if record.reports_progress or record.rendezvous_generation is not None:
        return False
    if generation != record.generation or not generation_fixed(record, generation, now):
        return False
    assert record.alive_since is not None  # generation_fixed needs it
    return _close_recovery(record, generation, record.alive_since)


def settle_due(record: JobRecord) -> datetime | None:
    """When :func:`apply_settled` may close the record's pending recovery (None: it is
    not a job that closes so, or nothing is pending or running yet)."""
    pending = record.pending_recovery
    if pending is None or pending.to_generation != record.generation:
        return None
    if record.reports_progress or record.rendezvous_generation is not None:
        return None
    if record.alive_since is None:
        return None
    return record.alive_since + timedelta(seconds=SETTLE_SECONDS)


def _close_recovery(record: JobRecord, generation: int, seen_at: datetime) -> bool:
    """End the pending recovery to ``generation``: the new generation trained."""
    pending = record.pending_recovery
    if pending is None or pending.to_generation != generation or record.phase.finished:
        return False
    record.pending_recovery = None
    seconds = max(0.0, (seen_at - pending.detected_at).total_seconds())
    if pending.resize:
        if record.last_resize is not None and record.last_resize.to_generation == generation:
            record.last_resize = record.last_resize.model_copy(update={"seconds": seconds})
        why = f"resized to {len(record.placements)} replica(s) ({pending.reason})"
        move_to(record, JobPhase.RUNNING, why)
        return True
    record.last_recovery_seconds = seconds
    record.last_recovery = LastRecovery(
        fault_id=pending.fault_id,
        level=pending.level,
        reason=pending.reason,
        to_generation=pending.to_generation,
        seconds=seconds,
    )
    move_to(record, JobPhase.RUNNING, f"recovered at level {pending.level.value}")
    return True
