"""Scaler benchmark: how long the elastic decision takes, and what it buys on a trace.

Part 1, decision time. Synthetic clusters of 8-slot nodes in 16 zones with a mix of
jobs (priorities 0-3; 8 or 4 processes per replica; fixed, stepped and discrete
sizes), first admitted from nothing, then disturbed once per sample: some nodes go
down (their loss some seconds old), some jobs finish, new jobs arrive (some urgent),
some jobs sit in their cool-down. Printed, for 1,024 nodes x 100 jobs
(goal p99 <= 10 ms) and 16,384 nodes x 1,000 jobs (goal p99 <= 250 ms), each beside
two baselines timed on the same samples: today's fixed-size admission pass
(``admission.py``: slots in use, admission order, ``place`` for each Pending job) and
a bare sort of the jobs into priority order (the floor): p50 and p99 of one call over
the samples, in wall time and in CPU time of the calling thread (on a loaded machine
wall time also counts the waits for a core), garbage collected before each call and
paused during it, as timeit does; the first decision, from an empty cluster, apart.

Part 2, trace replay. 32 nodes x 8 GPUs (256) in 2 zones; a day reservation of 12
nodes (96 GPUs, a fixed-size job of top priority) leaves at 20:00 and comes back at
08:00 every day (the trace starts at 08:00); training jobs of mixed priority and sizes
arrive over 72 hours (36 with ``--quick``), each with its work: the GPU-seconds it needs
at its min size (2 to 10 hours there). A job on N GPUs does N x e^log2(N / its min GPUs)
GPUs' worth of work per second, e (``--efficiency``, default 0.9) the share of each GPU's
throughput kept per doubling (data parallelism's communication and smaller per-GPU
batches cost a little at each doubling; 0.9 is an assumption to vary, not a
measurement); it leaves once its work is done. Every start, resize, suspension and
resumption stops the job ``--resize-pause`` seconds (default 60: the checkpoint, restart
and reload of a large model, far above the < 1 s bench/resize_pause.py measures for
the small example), elastic or not; a job with a replica on a lost node trains nothing
until it moves. One node fails for two hours. ``decide`` runs every 30 simulated seconds
(60 with ``--quick``), until every job's work is done.

The same trace runs elastic (each job's sizes as generated) and fixed-size three ways,
each training job held at one size, by a rule: ``max-fit`` (the baseline) asks for the
largest of its sizes that the training queue can admit by day (256 - 96 = 160 GPUs):
without elasticity a user asks for the size that finishes the work soonest, and the
size that the elastic run grows the job to when GPUs are free, but not one that could
only start at night; ``middle``, the middle one of its allowed sizes (a user who sizes for
the typical free capacity); ``min``, its smallest (the size that starts soonest; this
bench's baseline before). Printed for each: GPU
utilisation over the arrival window (nights apart), work done in it, job completion time
(arrival to its work done: mean and 90th percentile), resizes per job per hour (grow,
shrink, suspend, resume; not the first admission); and for elastic against each fixed
run: the share of the GPU-hours the fixed run leaves idle that the elastic run uses,
the same over the nights, the work done and the
completion times as ratios.

This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/scaler.py [--quick] [--samples N] [--no-trace | --trace-only]
        [--efficiency 0.9] [--resize-pause 60]
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from published import Figure, record

from resurge.cluster import NodeInfo
from resurge.control.decisions.admission import admission_order, place
from resurge.control.decisions.elastic_decision import (
    ZONE_LABEL,
    Cluster,
    JobShape,
    Kind,
    Node,
    Phase,
    applied,
    decide,
)
from resurge.control.state.records import JobRecord, Placement
from resurge.events import JobPhase
from resurge.jobspec import TrainingJob
from resurge.local import job_factory

SLOTS = 8
ZONES = 16
SCALES = ((1_024, 100, 10.0), (16_384, 1_000, 250.0))  # nodes, jobs, p99 goal (ms)


# Part 1: decision time


def make_nodes(count: int, zones: int, rng: random.Random) -> list[Node]:
    return [
        Node(name=f"node-{i:05d}", slots=SLOTS, labels={ZONE_LABEL: f"zone-{rng.randrange(zones)}"})
        for i in range(count)
    ]


def make_sizes(rng: random.Random, mean_min: float) -> tuple[int, ...]:
    low = max(1, round(rng.uniform(0.3, 1.7) * mean_min))
    shape = rng.random()
    if shape < 0.25:
        return (low,)
    if shape < 0.6:
        return tuple(range(low, 4 * low + 1, max(1, low // 2)))
    return tuple(sorted({low, 2 * low, 4 * low}))


def make_job(k: int, rng: random.Random, mean_min: float, submitted: float) -> JobShape:
    return JobShape(
        name=f"job-{k:05d}",
        nproc=SLOTS if rng.random() < 0.8 else SLOTS // 2,
        sizes=make_sizes(rng, mean_min),
        priority=rng.choice((0, 0, 1, 1, 2, 3)),
        submitted=submitted,
    )


def settle(cluster: Cluster, jobs: list[JobShape], now: float) -> list[JobShape]:
    """The jobs once one decision from this state is carried out."""
    changes = {r.job: r for r in decide(cluster, jobs, now)}
    return [applied(j, changes[j.name], now) if j.name in changes else j for j in jobs]


def disturbed(
    cluster: Cluster, jobs: list[JobShape], now: float, rng: random.Random, next_id: int
) -> tuple[Cluster, list[JobShape]]:
    """One sample: nodes down, jobs finished, jobs arrived, some jobs cooling down."""
    down = {n.name for n in rng.sample(cluster.nodes, max(1, len(cluster.nodes) // 50))}
    nodes = tuple(replace(n, schedulable=n.name not in down) for n in cluster.nodes)
    kept = [j for j in jobs if rng.random() > 0.05]
    mean_min = len(cluster.nodes) / len(jobs) / 2
    new = [
        make_job(next_id + i, rng, mean_min, now - rng.uniform(0, 100))
        for i in range(max(1, len(jobs) // 10))
    ]
    out = []
    for job in kept:
        lost = {n: now - rng.uniform(0, 120) for n in job.nodes if n in down}
        cooling = now - rng.uniform(0, 60) if rng.random() < 0.3 else job.resized_at
        out.append(replace(job, lost=lost, resized_at=cooling))
    return replace(cluster, nodes=nodes), out + new


def training_job(shape: JobShape) -> TrainingJob:
    return job_factory.job(
        shape.name, nproc=shape.nproc, replicas=shape.min, priority=shape.priority
    )


def records_of(jobs: list[JobShape], specs: dict[str, TrainingJob]) -> list[JobRecord]:
    records = []
    for shape in jobs:
        if shape.name not in specs:
            specs[shape.name] = training_job(shape)
        running = shape.phase is Phase.RUNNING
        records.append(
            JobRecord(
                name=shape.name,
                spec=specs[shape.name],
                phase=JobPhase.RUNNING if running else JobPhase.PENDING,
                placements=[Placement(replica=i, node=n) for i, n in enumerate(shape.nodes)],
            )
        )
    return records


def admission_pass(records: list[JobRecord], nodes: list[NodeInfo]) -> int:
    """Today's fixed-size pass: slots in use, then each Pending job placed in order."""
    used: dict[str, int] = {}
    for r in records:
        if r.phase is JobPhase.RUNNING:
            for p in r.placements:
                used[p.node] = used.get(p.node, 0) + r.spec.spec.nproc_per_node
    placed = 0
    for r in admission_order(records):
        if place(r.spec, nodes, used, r.avoid_nodes) is not None:
            placed += 1
    return placed


def percentiles(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1e3, p99 * 1e3


def timed(series: Series, call: Callable[[], object]) -> None:
    """Time one call into ``series``: wall and CPU (this thread) seconds, garbage
    collected before and paused during, as timeit does."""
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        call()
        series.cpu.append(time.thread_time() - cpu)
        series.wall.append(time.perf_counter() - wall)
    finally:
        gc.enable()


@dataclass
class Series:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


@dataclass
class Timings:
    cold: Series = field(default_factory=Series)
    decide: Series = field(default_factory=Series)
    admission: Series = field(default_factory=Series)
    sort: Series = field(default_factory=Series)


def time_scale(nodes: int, jobs: int, samples: int, baseline_samples: int, seed: int) -> Timings:
    rng = random.Random(seed)
    cluster = Cluster(nodes=tuple(make_nodes(nodes, ZONES, rng)))
    mean_min = nodes / jobs / 2
    shapes = [make_job(k, rng, mean_min, float(k)) for k in range(jobs)]
    now = 10_000.0
    out = Timings()
    decide(cluster, shapes, now)  # warm-up
    timed(out.cold, lambda: decide(cluster, shapes, now))
    shapes = settle(cluster, shapes, now)
    shapes = [replace(j, resized_at=None) for j in shapes]
    specs: dict[str, TrainingJob] = {}
    for sample in range(samples):
        now += 300.0
        pool, state = disturbed(cluster, shapes, now, rng, jobs + sample * jobs)
        timed(out.decide, lambda: decide(pool, state, now))  # noqa: B023
        timed(out.sort, lambda: sorted(state, key=lambda j: (-j.priority, j.submitted, j.name)))  # noqa: B023
        if sample < baseline_samples:
            records = records_of(state, specs)
            infos = [
                NodeInfo(name=n.name, slots=n.slots, healthy=n.schedulable) for n in pool.nodes
            ]
            timed(out.admission, lambda: admission_pass(records, infos))  # noqa: B023
    return out


def report_scale(nodes: int, jobs: int, goal_ms: float, t: Timings) -> None:
    print(f"{nodes:,} nodes x {jobs:,} jobs: {len(t.decide.wall)} disturbed samples")
    for clock in ("wall", "cpu"):
        p50, p99 = percentiles(getattr(t.decide, clock))
        verdict = "meets" if p99 <= goal_ms else "MISSES"
        print(
            f"  decide   {clock:4}  p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  "
            f"({verdict} p99 <= {goal_ms:g} ms)"
        )
        for name, series in (("fixed admit", t.admission), ("bare sort", t.sort)):
            values = getattr(series, clock)
            if values:
                b50, b99 = percentiles(values)
                print(
                    f"    {name:11} p50 {b50:8.2f} ms  p99 {b99:8.2f} ms  "
                    f"decide/{name}: p50 x{p50 / b50:.2f}, p99 x{p99 / b99:.2f} "
                    f"({len(values)} samples)"
                )
    cold = t.cold.wall[0] * 1e3, t.cold.cpu[0] * 1e3
    print(
        f"  decide from nothing (every job admitted and grown): {cold[0]:.2f} ms wall, "
        f"{cold[1]:.2f} ms cpu"
    )


# Part 2: trace replay

HOUR = 3600.0
DAY = 24 * HOUR  # the trace starts at 08:00; 20:00 is 12 h in
RESERVED = 12  # nodes (96 GPUs) the day reservation holds
TRACE_GPUS = 32 * SLOTS
DAY_CAPACITY = TRACE_GPUS - RESERVED * SLOTS  # GPUs the training queue has by day
SCALING_EFFICIENCY = 0.9  # per-GPU throughput kept at each doubling of a job's GPUs
RESIZE_PAUSE = 60.0  # seconds without progress after every start, resize and resumption
DRAIN_HOURS = 14 * 24.0  # after the last arrival, at most this long for every job to end
FIXED_RULES = ("max-fit", "middle", "min")


def is_night(t: float) -> bool:
    return t % DAY >= 12 * HOUR


@dataclass(frozen=True)
class Arrival:
    """A job of the trace: the reservation leaves at ``end``; a training job when it has
    done ``work`` GPU-seconds at its min size."""

    shape: JobShape
    start: float
    end: float | None = None
    work: float = 0.0


def make_trace(hours: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    day = JobShape(name="day-reservation", nproc=SLOTS, sizes=(RESERVED,), priority=100)
    trace = [Arrival(day, d * DAY, end=d * DAY + 12 * HOUR) for d in range(int(hours // DAY) + 1)]
    t, k = 0.0, 0
    while t < hours * HOUR:
        low = rng.choice((1, 1, 2, 2, 3, 4))
        sizes = rng.choice(
            (
                tuple(range(low, 4 * low + 1)),
                tuple(sorted({low, 2 * low, 4 * low})),
                tuple(range(low, 3 * low + 1, max(1, low // 2))),
            )
        )
        shape = JobShape(
            name=f"train-{k:03d}",
            nproc=SLOTS if rng.random() < 0.75 else SLOTS // 2,
            sizes=sizes,
            priority=rng.choice((0, 1, 1, 2)),
            submitted=t,
        )
        min_hours = rng.uniform(2, 10)  # how long its work takes at its min size
        trace.append(Arrival(shape, t, work=min_hours * HOUR * shape.min * shape.nproc))
        t += rng.expovariate(1 / (0.5 * HOUR))
        k += 1
    return trace


def speed(shape: JobShape, replicas: int, efficiency: float) -> float:
    """Work per second (GPU-seconds at the min size) at ``replicas``: each doubling of the
    job's GPUs past its min keeps ``efficiency`` of each GPU's throughput."""
    gpus, least = replicas * shape.nproc, shape.min * shape.nproc
    return gpus * efficiency ** math.log2(gpus / least) if gpus else 0.0


def fixed_size(shape: JobShape, rule: str) -> int:
    """The one size a job asks for without elasticity, by ``rule``: ``max-fit``, the
    largest allowed size the training queue can admit by day (DAY_CAPACITY); ``middle``,
    the middle one of its allowed sizes; ``min``, its smallest."""
    if rule == "min":
        return shape.min
    if rule == "middle":
        return shape.sizes[len(shape.sizes) // 2]
    fits = [size for size in shape.sizes if size * shape.nproc <= DAY_CAPACITY]
    return fits[-1] if fits else shape.min


@dataclass
class Replay:
    gpu_seconds: float = 0.0  # held by any job, over the arrival window
    capacity_seconds: float = 0.0
    night_gpu_seconds: float = 0.0
    night_capacity_seconds: float = 0.0
    work_seconds: float = 0.0  # done by training jobs, over the arrival window
    completion: list[float] = field(default_factory=list)  # seconds, arrival -> work done
    unfinished: int = 0
    resizes: int = 0
    job_seconds: float = 0.0
    decide_seconds: float = 0.0
    decisions: int = 0


def trace_cluster(now: float, failed: tuple[float, float]) -> Cluster:
    nodes = tuple(
        Node(
            name=f"gpu-{i:02d}",
            slots=SLOTS,
            schedulable=not (i == 31 and failed[0] <= now < failed[1]),
            labels={ZONE_LABEL: "a" if i < 16 else "b"},
        )
        for i in range(32)
    )
    return Cluster(nodes=nodes)


@dataclass
class Costs:
    """What the replay charges: work per GPU past a job's min, and time lost per change."""

    efficiency: float = SCALING_EFFICIENCY
    pause: float = RESIZE_PAUSE


def replay(trace: list[Arrival], hours: float, step: float, fixed: str | None,
           costs: Costs) -> Replay:  # fmt: skip
    """Replay ``trace`` (elastic where ``fixed`` is None, else every training job held at
    its :func:`fixed_size`) until every training job did its work, or DRAIN_HOURS past the
    last arrival."""
    out = Replay()
    arrivals = {a.shape.name: a for a in trace}
    state: dict[str, JobShape] = {}
    done: dict[str, float] = {}  # work done so far
    finished: set[str] = set()
    paused_until: dict[str, float] = {}
    failed = (14 * HOUR, 16 * HOUR)
    lost: dict[str, float] = {}
    window, t = hours * HOUR, 0.0
    training = [a for a in trace if a.end is None]
    while t < window + DRAIN_HOURS * HOUR:
        if t >= window and len(finished) == len(training):
            break
        cluster = trace_cluster(t, failed)
        up = {n.name for n in cluster.nodes if n.schedulable}
        lost = {n: lost.get(n, t) for n in (n.name for n in cluster.nodes) if n not in up}
        present = {
            name: a
            for name, a in arrivals.items()
            if a.start <= t and name not in finished and (a.end is None or t < a.end)
        }
        state = {name: job for name, job in state.items() if name in present}
        for name, arrival in present.items():
            if name not in state:
                shape = arrival.shape
                sizes = (fixed_size(shape, fixed),) if fixed and arrival.end is None else None
                state[name] = replace(shape, sizes=sizes) if sizes else shape
        jobs = [replace(j, lost={n: lost[n] for n in j.nodes if n in lost}) for j in state.values()]
        start = time.perf_counter()
        resizes = decide(cluster, jobs, t)
        out.decide_seconds += time.perf_counter() - start
        out.decisions += 1
        for resize in resizes:
            state[resize.job] = applied(state[resize.job], resize, t)
            paused_until[resize.job] = t + costs.pause
            if resize.kind is not Kind.ADMIT:
                out.resizes += 1
        if t < window:
            tally(out, state, t, step, cluster)
        for name, job in state.items():
            arrival = arrivals[name]
            if arrival.end is not None or job.replicas == 0 or not up.issuperset(job.nodes):
                continue  # a job with a replica on a lost node trains no step until it moves
            stalled = min(step, max(0.0, paused_until.get(name, 0.0) - t))
            rate = speed(arrival.shape, job.replicas, costs.efficiency)
            need = arrival.work - done.get(name, 0.0)
            if rate * (step - stalled) >= need:
                out.completion.append(t + stalled + need / rate - arrival.start)
                finished.add(name)
                gained = need
            else:
                gained = rate * (step - stalled)
                done[name] = done.get(name, 0.0) + gained
            if t < window:
                out.work_seconds += gained
        t += step
    out.unfinished = len(training) - len(finished)
    return out


def tally(out: Replay, state: dict[str, JobShape], t: float, step: float,
          cluster: Cluster) -> None:  # fmt: skip
    up = {n.name for n in cluster.nodes if n.schedulable}
    used = sum(j.nproc for j in state.values() if j.replicas for node in j.nodes if node in up)
    capacity = sum(n.slots for n in cluster.nodes if n.schedulable)
    out.gpu_seconds += used * step
    out.capacity_seconds += capacity * step
    if is_night(t):
        out.night_gpu_seconds += used * step
        out.night_capacity_seconds += capacity * step
    out.job_seconds += sum(step for name in state if name != "day-reservation")


def completion_hours(r: Replay) -> tuple[float, float]:
    """Mean and 90th percentile (nearest rank) job completion time, hours."""
    ordered = sorted(r.completion)
    if not ordered:
        return math.nan, math.nan
    p90 = ordered[max(0, -(-9 * len(ordered) // 10) - 1)]
    return statistics.fmean(ordered) / HOUR, p90 / HOUR


def run_trace(hours: float, step: float, seed: int, costs: Costs) -> dict[str, Figure]:
    """Replay the trace elastic and fixed under each rule; what the docs quote of it."""
    made: dict[str, Figure] = {}
    trace = make_trace(hours, seed)
    training = [a for a in trace if a.end is None]
    elastic = replay(trace, hours, step, None, costs)
    print(
        f"trace: {hours:g} h of arrivals, {TRACE_GPUS} GPUs, {len(training)} training jobs "
        f"({sum(a.work for a in training) / HOUR:,.0f} GPU-hours of work at their min sizes), "
        f"96 GPUs freed 20:00-08:00, a decision every {step:g} s; a job on N GPUs works at "
        f"N x {costs.efficiency:g}^log2(N / its min) GPUs' worth; every start, resize, "
        f"suspension and resumption stops it {costs.pause:g} s; figures over the "
        f"{hours:g} h, completion times until every job's work is done"
    )
    print_replay("elastic", elastic)
    for rule in FIXED_RULES:
        fixed = replay(trace, hours, step, rule, costs)
        print_replay(f"fixed, {rule}", fixed)
        idle = fixed.capacity_seconds - fixed.gpu_seconds
        share = (elastic.gpu_seconds - fixed.gpu_seconds) / idle if idle else 0.0
        night_idle = fixed.night_capacity_seconds - fixed.night_gpu_seconds
        night = elastic.night_gpu_seconds - fixed.night_gpu_seconds
        mean, p90 = completion_hours(elastic)
        fixed_mean, fixed_p90 = completion_hours(fixed)
        print(
            f"    elastic against fixed, {rule}: idle GPU-hours it leaves that elastic uses "
            f"{share:.1%} (nights {night / night_idle if night_idle else 0.0:.1%}); "
            f"work done x{elastic.work_seconds / fixed.work_seconds:.2f}; completion time "
            f"mean x{mean / fixed_mean:.2f}, p90 x{p90 / fixed_p90:.2f}"
        )
        name = f"trace_{hours:g}h_against_{rule.replace('-', '_')}"
        made[f"{name}_idle_used_pct"] = (round(share * 100, 1), "%")
        made[f"{name}_work_x"] = (round(elastic.work_seconds / fixed.work_seconds, 2), "x")
        made[f"{name}_completion_mean_x"] = (round(mean / fixed_mean, 2), "x")
        made[f"{name}_completion_p90_x"] = (round(p90 / fixed_p90, 2), "x")
    return made


def print_replay(name: str, r: Replay) -> None:
    per_hour = r.resizes / (r.job_seconds / HOUR) if r.job_seconds else 0.0
    mean, p90 = completion_hours(r)
    print(
        f"  {name:14} GPU utilisation {r.gpu_seconds / r.capacity_seconds:6.1%}"
        f" (nights {r.night_gpu_seconds / max(r.night_capacity_seconds, 1):6.1%}),"
        f" work done {r.work_seconds / HOUR:7,.0f} GPU-h,"
        f" completion mean {mean:5.2f} h p90 {p90:5.2f} h"
        f"{f' ({r.unfinished} unfinished)' if r.unfinished else ''},"
        f" resizes per job per hour {per_hour:.3f},"
        f" decide mean {r.decide_seconds / r.decisions * 1e3:.3f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run: fewer samples")
    parser.add_argument("--samples", type=int, default=None, help="disturbed samples per scale")
    parser.add_argument("--no-trace", action="store_true", help="skip the trace replay")
    parser.add_argument("--trace-only", action="store_true", help="skip the decision timing")
    parser.add_argument(
        "--efficiency",
        type=float,
        default=SCALING_EFFICIENCY,
        help="per-GPU throughput kept per doubling of a job's GPUs (trace)",
    )
    parser.add_argument(
        "--resize-pause",
        type=float,
        default=RESIZE_PAUSE,
        help="seconds a job stops at each start, resize and resumption (trace)",
    )
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    samples = args.samples or (10 if args.quick else 100)
    baseline = 1 if args.quick else 3
    if not args.trace_only:
        for nodes, jobs, goal in SCALES:
            report_scale(nodes, jobs, goal, time_scale(nodes, jobs, samples, baseline, args.seed))
    if not args.no_trace:
        hours = 36.0 if args.quick else 72.0
        costs = Costs(efficiency=args.efficiency, pause=args.resize_pause)
        made = run_trace(hours, 60.0 if args.quick else 30.0, args.seed, costs)
        print(f"recorded in {record('scaler', made)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
