import itertools
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from resurge.cluster import NodeInfo
from resurge.control.decisions.elastic_decision import (
    ZONE_LABEL,
    Cluster,
    GrowWait,
    JobShape,
    Kind,
    Node,
    Phase,
    Resize,
    applied,
    decide,
    plan,
)
from resurge.control.state.records import JobRecord, Placement, RestartEntry
from resurge.events import JobPhase, RecoveryLevel
from resurge.local import job_factory
from resurge_scaler.shapes import lost_since, ready_since, shapes_from

NOW = 10_000.0


def cluster(*slots: int, down: tuple[str, ...] = (), zones: tuple[str, ...] = ()) -> Cluster:
    return Cluster(
        nodes=tuple(
            Node(
                name=f"n{i}",
                slots=s,
                schedulable=f"n{i}" not in down,
                labels={ZONE_LABEL: zones[i]} if zones else {},
            )
            for i, s in enumerate(slots)
        )
    )


def job(
    name: str,
    sizes: tuple[int, ...] = (1,),
    *,
    priority: int = 0,
    submitted: float = 0.0,
    nodes: tuple[str, ...] = (),
    nproc: int = 1,
    **more: object,
) -> JobShape:
    phase = Phase.RUNNING if nodes else Phase.PENDING
    shape = JobShape(
        name=name,
        sizes=sizes,
        priority=priority,
        submitted=submitted,
        nodes=nodes,
        nproc=nproc,
        phase=phase,
    )
    return replace(shape, **more)  # type: ignore[arg-type]


def by_job(resizes: list[Resize]) -> dict[str, Resize]:
    assert len({r.job for r in resizes}) == len(resizes), "one resize per job"
    return {r.job: r for r in resizes}


def test_equal_priority_goes_by_submission_time_then_name() -> None:
    jobs = [
        job("late", (2,), submitted=5.0),
        job("early", (2,), submitted=1.0),
        job("b-same", (2,), submitted=3.0),
        job("a-same", (2,), submitted=3.0),
    ]
    result = plan(cluster(1, 1, 1, 1, 1), jobs, NOW)
    assert {r.job for r in result.resizes} == {"early", "a-same"}
    assert set(result.waiting) == {"b-same", "late"}
    assert all(r.kind is Kind.ADMIT and r.to_replicas == 2 for r in result.resizes)


def test_higher_priority_comes_first_whatever_its_submission() -> None:
    jobs = [job("old", (2,), submitted=1.0), job("urgent", (2,), priority=5, submitted=9.0)]
    got = by_job(decide(cluster(1, 1, 1), jobs, NOW))
    assert set(got) == {"urgent"}


def test_discrete_sizes_take_the_largest_allowed_size_that_fits() -> None:
    got = by_job(decide(cluster(*[1] * 6), [job("d", (2, 4, 8))], NOW))
    assert got["d"].kind is Kind.ADMIT and got["d"].to_replicas == 4
    running = job("d", (2, 4, 8), nodes=("n0", "n1"))
    got = by_job(decide(cluster(*[1] * 7), [running], NOW))
    assert got["d"].kind is Kind.GROW and (got["d"].from_replicas, got["d"].to_replicas) == (2, 4)
    assert len(got["d"].add) == 2 and got["d"].nodes[:2] == ("n0", "n1")


def test_step_sizes_grow_in_steps_from_min() -> None:
    sizes = tuple(range(1, 8, 3))  # min 1, max 7, step 3: 1, 4, 7
    got = by_job(decide(cluster(*[1] * 6), [job("s", sizes)], NOW))
    assert got["s"].to_replicas == 4


def test_a_job_that_cannot_reach_its_min_waits_and_takes_nothing() -> None:
    jobs = [job("big", (4, 8), priority=1), job("small", (1, 2))]
    result = plan(cluster(1, 1, 1), jobs, NOW)
    assert (
        "big" in result.waiting
        and "needs 4 replica(s) of 1 slot(s), 3 fit" in (result.waiting["big"])
    )
    got = by_job(list(result.resizes))
    assert set(got) == {"small"} and got["small"].to_replicas == 2  # all it can use


def test_a_higher_priority_job_shrinks_a_lower_one_toward_min_before_suspending() -> None:
    low = job("low", (1, 2, 3, 4), nodes=("n0", "n1", "n2", "n3"), resized_at=0.0)
    urgent = job("urgent", (2,), priority=5)
    got = by_job(decide(cluster(1, 1, 1, 1), [low, urgent], NOW))
    assert got["low"].kind is Kind.SHRINK and got["low"].to_replicas == 2
    assert got["low"].remove == (2, 3)  # highest index first
    assert "for higher-priority job urgent" in got["low"].why
    assert got["urgent"].kind is Kind.ADMIT and set(got["urgent"].add) == {"n2", "n3"}
    resizes = decide(cluster(1, 1, 1, 1), [low, urgent], NOW)
    assert [r.kind for r in resizes] == [Kind.SHRINK, Kind.ADMIT]  # room first


def test_suspension_only_when_shrinking_is_not_enough() -> None:
    lowest = job("lowest", (2, 4), nodes=("n0", "n1", "n2", "n3"), submitted=1.0)
    low = job("low", (2, 3), priority=1, nodes=("n4", "n5", "n6"))
    urgent = job("urgent", (4,), priority=5)
    got = by_job(decide(cluster(*[1] * 7), [lowest, low, urgent], NOW))
    # Shrinking both to min frees 3 slots; not enough: the lowest is suspended, and low's
    # shrink, needless once lowest is gone, is undone.
    assert got["lowest"].kind is Kind.SUSPEND and got["lowest"].to_replicas == 0
    assert got["lowest"].nodes == ()
    assert "low" not in got
    assert got["urgent"].to_replicas == 4


def test_undone_shrinks_leave_a_job_at_an_allowed_size() -> None:
    fixed = job("fixed", (2,), nodes=("n0", "n1"))
    uneven = job("uneven", (1, 3, 4), priority=1, nodes=("n2", "n3", "n4", "n5"))
    got = by_job(decide(cluster(*[1] * 6), [fixed, uneven, job("u", (4,), priority=5)], NOW))
    # Shrinking alone frees 3 of the 4 slots; suspending fixed frees 2 more; uneven's
    # 3 -> 1 shrink is still needed and its 4 -> 3 one cannot be undone alone (size 2).
    assert got["fixed"].kind is Kind.SUSPEND
    assert got["uneven"].to_replicas == 1 and got["u"].to_replicas == 4


def test_lowest_priority_and_latest_submitted_yield_first() -> None:
    first = job("first", (1, 2), nodes=("n0", "n1"), submitted=1.0)
    second = job("second", (1, 2), nodes=("n2", "n3"), submitted=2.0)
    got = by_job(decide(cluster(1, 1, 1, 1), [first, second, job("u", (1,), priority=3)], NOW))
    assert set(got) == {"second", "u"} and got["second"].to_replicas == 1


def test_equal_priority_is_never_preempted() -> None:
    running = job("running", (1, 4), nodes=("n0", "n1", "n2", "n3"), priority=2)
    waiting = job("waiting", (2,), priority=2, submitted=-5.0)  # even if submitted earlier
    result = plan(cluster(1, 1, 1, 1), [running, waiting], NOW)
    assert result.resizes == ()
    assert "no lower-priority job" in result.waiting["waiting"]


def test_a_job_above_a_lowered_max_shrinks_to_it_highest_index_first() -> None:
    """An edit lowered ``replicas.max`` below what the job holds: it shrinks at once,
    cool-down or not (its owner asked), and never while a recovery is under way."""
    running = job("j", (2, 3), nodes=("n0", "n1", "n2", "n3"), resized_at=NOW - 1)
    (resize,) = decide(cluster(1, 1, 1, 1), [running], NOW)
    assert (resize.kind, resize.to_replicas, resize.remove) == (Kind.SHRINK, 3, (3,))
    assert "above its max of 3 replicas" in resize.why
    assert decide(cluster(1, 1, 1, 1), [replace(running, busy=True)], NOW) == []


def test_a_held_job_is_suspended_at_once_and_neither_admitted_nor_grown() -> None:
    """``held`` (its spec.suspend, or Kueue's admission withdrawn): a Running job is
    suspended whatever its priority and cool-down, never during a recovery; a held
    Pending or Suspended job waits with the reason, and its slots go to others."""
    running = job("j", (2, 4), nodes=("n0", "n1", "n2"), resized_at=NOW - 1, priority=9)
    (resize,) = decide(cluster(1, 1, 1), [replace(running, held=True)], NOW)
    assert (resize.kind, resize.to_replicas) == (Kind.SUSPEND, 0)
    assert "held" in resize.why
    assert decide(cluster(1, 1, 1), [replace(running, held=True, busy=True)], NOW) == []
    suspended = replace(job("s", (1,), priority=9), phase=Phase.SUSPENDED, held=True)
    other = job("o", (1,))
    result = plan(cluster(1), [suspended, other], NOW)
    assert [(r.job, r.kind) for r in result.resizes] == [("o", Kind.ADMIT)]
    assert "held" in result.waiting["s"]
    (resumed,) = decide(cluster(1), [replace(suspended, held=False)], NOW)
    assert resumed.kind is Kind.RESUME


def test_cooldown_blocks_every_resize_until_it_ends() -> None:
    running = job("r", (1, 2, 3), nodes=("n0",), resized_at=NOW - 30.0, cooldown=60.0)
    assert decide(cluster(1, 1, 1), [running], NOW) == []
    assert by_job(decide(cluster(1, 1, 1), [running], NOW + 30.0))["r"].to_replicas == 3
    victim = replace(running, nodes=("n0", "n1", "n2"))
    urgent = job("u", (1,), priority=9)
    result = plan(cluster(1, 1, 1), [victim, urgent], NOW)
    assert result.resizes == () and "u" in result.waiting
    suspended = replace(job("s", (1,)), phase=Phase.SUSPENDED, resized_at=NOW - 1.0)
    result = plan(cluster(1), [suspended], NOW)
    assert result.resizes == () and "cool-down" in result.waiting["s"]


def test_snooze_blocks_growth_after_a_restart_but_not_shrinking() -> None:
    running = job("r", (1, 2), nodes=("n0",), restarted_at=NOW - 10.0, snooze=60.0)
    assert decide(cluster(1, 1), [running], NOW) == []
    assert decide(cluster(1, 1), [running], NOW + 50.0)[0].kind is Kind.GROW
    snoozing = replace(running, nodes=("n0", "n1"))
    got = by_job(decide(cluster(1, 1), [snoozing, job("u", (1,), priority=1)], NOW))
    assert got["r"].kind is Kind.SHRINK
    pending = job("p", (1, 2), restarted_at=NOW - 10.0)
    result = plan(cluster(1, 1), [pending], NOW)
    assert by_job(list(result.resizes))["p"].to_replicas == 1  # min only
    assert result.held == {}, "an admission is no resize that waits"


def test_a_held_grow_says_to_what_size_what_holds_it_and_until_when() -> None:
    running = job("r", (1, 2, 3), nodes=("n0",), restarted_at=NOW - 10.0, snooze=60.0)
    result = plan(cluster(1, 1, 1), [running], NOW)
    assert result.resizes == ()
    assert result.held == {"r": GrowWait("r", 3, "the snooze after a restart", NOW + 50.0)}
    # The latest of what holds it is the one it waits for.
    cooling = replace(running, resized_at=NOW - 5.0, cooldown=60.0)
    assert plan(cluster(1, 1, 1), [cooling], NOW).held["r"] == GrowWait(
        "r", 3, "the cool-down after its last resize", NOW + 55.0
    )
    # Nothing to grow into: nothing held.
    assert plan(cluster(1), [running], NOW).held == {}
    assert plan(cluster(1, 1, 1), [running], NOW + 50.0).held == {}


def arrived(*ready: float | None) -> Cluster:
    """One node per entry, 1 slot each, schedulable since that time (None: always)."""
    return Cluster(nodes=tuple(Node(f"n{i}", 1, ready_since=t) for i, t in enumerate(ready)))


def test_capacity_arriving_together_is_grown_into_in_one_resize() -> None:
    # Two nodes come up a second apart under a job of 2 replicas, 2 to 4.
    shape = job("r", (2, 3, 4), nodes=("n0", "n1"), settle=5.0)
    resizes = []
    for second in range(70):
        now = NOW + second
        ready: list[float | None] = [None, None]
        ready += [t for t in (NOW, NOW + 1.0) if t <= now]
        result = plan(arrived(*ready), [shape], now)
        if second < 6:
            assert result.resizes == ()
            until = NOW + (5.0 if second == 0 else 6.0)
            assert result.held["r"] == GrowWait(
                "r", 3 if second == 0 else 4, "capacity still arriving (a node came up)", until
            )
        for resize in result.resizes:
            resizes.append((now, resize.from_replicas, resize.to_replicas))
            shape = applied(shape, resize, now)
    assert resizes == [(NOW + 6.0, 2, 4)]


def test_a_job_admitted_onto_a_node_just_come_up_starts_as_large_as_fits() -> None:
    pending = job("p", (1, 2))
    got = by_job(decide(arrived(NOW, NOW), [pending], NOW))["p"]
    assert (got.kind, got.to_replicas) == (Kind.ADMIT, 2)


def test_nodes_count_as_come_up_from_when_the_scaler_first_saw_them_schedulable() -> None:
    first = ready_since(None, [NodeInfo(name="a", slots=1)], NOW)
    assert first == {"a": None}, "nodes there at the first look came up long ago"
    nodes = [NodeInfo(name="a", slots=1), NodeInfo(name="b", slots=1), NodeInfo(name="c", slots=1)]
    nodes[2].cordoned = True
    later = ready_since(first, nodes, NOW + 1.0)
    assert later == {"a": None, "b": NOW + 1.0}
    nodes[2].cordoned = False
    assert ready_since(later, nodes, NOW + 2.0) == {"a": None, "b": NOW + 1.0, "c": NOW + 2.0}
    pool, _ = shapes_from([], nodes, NOW + 2.0, ready=later)
    assert [n.ready_since for n in pool.nodes] == [None, NOW + 1.0, None]


def test_lost_capacity_shrinks_only_after_the_faulty_timeout_then_grows_back() -> None:
    nodes = ("n0", "n1", "n2", "n3")
    running = job("r", (2, 3, 4), nodes=nodes, faulty_timeout=60.0, resized_at=0.0)
    lost = replace(running, lost={"n1": NOW})
    down = cluster(1, 1, 1, 1, down=("n1",))
    assert decide(down, [lost], NOW) == []
    assert decide(down, [lost], NOW + 59.0) == []  # nor does it grow meanwhile
    shrink = by_job(decide(down, [lost], NOW + 60.0))["r"]
    assert shrink.kind is Kind.SHRINK and shrink.remove == (1,)
    assert shrink.nodes == ("n0", "n2", "n3") and "lost node(s) n1" in shrink.why
    after = applied(lost, shrink, NOW + 60.0)
    assert after.lost == {} and after.replicas == 3
    back = cluster(1, 1, 1, 1)
    assert decide(back, [after], NOW + 61.0) == []  # cool-down
    grow = by_job(decide(back, [after], NOW + 120.0))["r"]
    assert grow.kind is Kind.GROW and grow.add == ("n1",)


def test_a_spare_covers_a_lost_node_and_too_few_left_suspends() -> None:
    with_spare = job("r", (2, 3), nodes=("n0", "n1"), spares=("n2",), lost={"n1": 0.0})
    assert decide(cluster(1, 1, 1, down=("n1",)), [with_spare], NOW) == []
    bare = replace(with_spare, spares=())
    got = by_job(decide(cluster(1, 1, 1, down=("n1",)), [bare], NOW))
    assert got["r"].kind is Kind.SUSPEND and "fewer than min 2" in got["r"].why
    fixed = replace(bare, sizes=(2,))  # the restarter moves or requeues it
    assert decide(cluster(1, 1, 1, down=("n1",)), [fixed], NOW) == []


def test_lost_replicas_go_first_when_shrinking_to_an_allowed_size() -> None:
    running = job("r", (2, 4), nodes=("n0", "n1", "n2", "n3"), lost={"n0": 0.0})
    got = by_job(decide(cluster(1, 1, 1, 1, down=("n0",)), [running], NOW))["r"]
    assert got.remove == (0, 3) and got.nodes == ("n1", "n2")


def test_growth_prefers_the_zone_of_the_jobs_nodes_and_skips_bad_nodes() -> None:
    zones = ("a", "b", "a", "b", "a")
    pool = cluster(1, 4, 1, 4, 1, down=("n4",), zones=zones)
    running = job("r", (1, 2, 3), nodes=("n0",), avoid=frozenset({"n2"}))
    got = by_job(decide(pool, [running], NOW))["r"]
    assert got.to_replicas == 3 and set(got.add) <= {"n1", "n3"}  # n2 avoided, n4 down
    other = cluster(2, 2, 2, 2, zones=("a", "b", "a", "b"))
    got = by_job(decide(other, [job("z", (2, 3), nodes=("n0", "n2"))], NOW))["z"]
    assert got.add == ("n0",) or got.add == ("n2",)  # room in zone a first


def test_an_admitted_job_keeps_to_one_zone_when_it_fits() -> None:
    pool = cluster(1, 1, 1, 1, 1, zones=("a", "b", "b", "a", "b"))
    got = by_job(decide(pool, [job("j", (3,))], NOW))["j"]
    assert set(got.add) == {"n1", "n2", "n4"}


def test_slots_count_nproc_and_spares() -> None:
    running = job("r", (1,), nodes=("n0",), nproc=4, spares=("n1",))
    result = plan(cluster(8, 4), [running, job("p", (2,), nproc=4)], NOW)
    assert result.resizes == () and "1 fit" in result.waiting["p"]


def test_busy_jobs_keep_their_slots_and_are_left_alone() -> None:
    busy = job("b", (1, 3), nodes=("n0", "n1"), busy=True)
    result = plan(cluster(1, 1, 1), [busy, job("u", (2,), priority=5)], NOW)
    assert result.resizes == () and "u" in result.waiting


def test_a_suspended_job_resumes() -> None:
    suspended = replace(job("s", (1, 2)), phase=Phase.SUSPENDED, resized_at=0.0)
    got = by_job(decide(cluster(1, 1, 1), [suspended], NOW))["s"]
    assert got.kind is Kind.RESUME and got.to_replicas == 2


def test_invalid_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="sorted"):
        JobShape(name="x", sizes=(4, 2))


def flapping_run(seed: int) -> dict[str, list[float]]:
    """A minute of capacity changing every second; the resize times of each job."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(12)]
    jobs = {
        f"j{k}": job(
            f"j{k}",
            (1, 2, 3, 4),
            priority=rng.randint(0, 2),
            submitted=float(k),
            cooldown=30.0,
            snooze=10.0,
            faulty_timeout=5.0,
        )
        for k in range(5)
    }
    down_since: dict[str, float] = {}
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for second in range(61):
        now = NOW + second
        for node in rng.sample(names, 3):
            if node in down_since:
                del down_since[node]
            else:
                down_since[node] = now
        pool = Cluster(nodes=tuple(Node(n, 1, n not in down_since) for n in names))
        shapes = [
            replace(j, lost={n: down_since[n] for n in j.nodes if n in down_since})
            for j in jobs.values()
        ]
        for resize in decide(pool, shapes, now):
            times[resize.job].append(now)
            jobs[resize.job] = applied(jobs[resize.job], resize, now)
    return times


@pytest.mark.parametrize("seed", range(20))
def test_no_flapping_at_most_one_resize_per_job_per_cooldown(seed: int) -> None:
    run = flapping_run(seed)
    assert sum(len(times) for times in run.values()) >= len(run)  # it did resize
    for name, times in run.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(gap >= 30.0 for gap in gaps), (name, times)


# From records and nodes: what the service will call.


def test_a_suspended_spec_is_a_held_shape() -> None:
    now = datetime.fromtimestamp(NOW, UTC)
    running = record("r", JobPhase.RUNNING, ["a"], suspend=True)
    [shape] = shapes_from([running], [NodeInfo(name="a", slots=4)], now.timestamp())[1]
    assert shape.held
    (resize,) = decide(*shapes_from([running], [NodeInfo(name="a", slots=4)], NOW), NOW)
    assert resize.kind is Kind.SUSPEND


def record(name: str, phase: JobPhase, nodes: list[str], **spec: Any) -> JobRecord:
    training = job_factory.job(
        name, nproc=2, replicas={"min": 1, "max": 4, "discrete": [1, 2, 4]}, **spec
    )
    return JobRecord(
        name=name,
        spec=training,
        phase=phase,
        placements=[Placement(replica=i, node=n) for i, n in enumerate(nodes)],
        submitted=datetime.fromtimestamp(100.0, UTC),
    )


def test_shapes_from_records_and_nodes() -> None:
    now = datetime.fromtimestamp(NOW, UTC)
    running = record("r", JobPhase.RUNNING, ["a", "b"], priority=3, elastic={"cooldownSeconds": 5})
    running.history = [
        RestartEntry(time=now - timedelta(seconds=7), level=RecoveryLevel.PROCESS, signature="s")
    ]
    running.avoid_nodes = ["c"]
    recovering = record("v", JobPhase.RECOVERING, ["c"])
    done = record("d", JobPhase.SUCCEEDED, ["a"])
    waiting = record("w", JobPhase.PENDING, [])
    nodes = [
        NodeInfo(name="a", slots=4, labels={ZONE_LABEL: "z"}),
        NodeInfo(name="b", slots=4, healthy=False),
    ]
    records = [running, recovering, done, waiting]
    lost = lost_since({"b": NOW - 3.0}, records, nodes, NOW)
    assert lost == {"b": NOW - 3.0, "c": NOW}
    pool, shapes = shapes_from(records, nodes, NOW, resized_at={"r": NOW - 1.0}, lost=lost)
    assert [n.schedulable for n in pool.nodes] == [True, False]
    assert pool.group(pool.nodes[0]) == ("z",)
    r, v, w = shapes
    assert (r.name, r.phase, r.nodes, r.nproc, r.sizes) == (
        "r",
        Phase.RUNNING,
        ("a", "b"),
        2,
        (1, 2, 4),
    )
    assert (r.priority, r.submitted, r.resized_at, r.cooldown) == (3, 100.0, NOW - 1.0, 5.0)
    assert r.restarted_at == NOW - 7.0 and r.avoid == {"c"} and r.lost == {"b": NOW - 3.0}
    assert v.busy and v.phase is Phase.RUNNING
    assert w.phase is Phase.PENDING and w.nodes == ()
    # r cools down and waits for b, v is busy, w gets the 2 free slots of a.
    assert [(r.job, r.kind, r.nodes) for r in decide(pool, shapes, NOW)] == [
        ("w", Kind.ADMIT, ("a",))
    ]


def random_state(rng: random.Random) -> tuple[Cluster, list[JobShape]]:
    names = [f"n{i}" for i in range(rng.randint(2, 10))]
    pool = Cluster(
        nodes=tuple(
            Node(n, rng.choice((1, 2, 4)), rng.random() > 0.15, {ZONE_LABEL: rng.choice("ab")})
            for n in names
        )
    )
    free = {n.name: n.slots for n in pool.nodes}
    shapes = []
    for k in range(rng.randint(1, 8)):
        nproc = rng.choice((1, 1, 2))
        low = rng.randint(1, 3)
        sizes = rng.choice(((low,), (low, 2 * low, 4 * low), tuple(range(low, low + 4))))
        size = rng.choice(sizes)
        room = [n for n, f in free.items() for _ in range(f // nproc)]
        rng.shuffle(room)
        nodes: tuple[str, ...] = ()
        if rng.random() < 0.6 and len(room) >= size:
            nodes = tuple(room[:size])
            for n in nodes:
                free[n] -= nproc
        shapes.append(
            job(
                f"j{k}",
                sizes,
                priority=rng.randint(0, 3),
                submitted=float(rng.randint(0, 5)),
                nodes=nodes,
                nproc=nproc,
                resized_at=rng.choice((None, NOW - 10.0, NOW - 100.0)),
                faulty_timeout=rng.choice((1.0, 1000.0)),
                lost={n: NOW - 50.0 for n in nodes},
            )
        )
    return pool, shapes


@pytest.mark.parametrize("seed", range(300))
def test_every_decision_keeps_sizes_allowed_nodes_within_slots_and_priorities(
    seed: int,
) -> None:
    rng = random.Random(seed)
    pool, shapes = random_state(rng)
    now = NOW
    for _ in range(3):  # a few rounds, each carried out
        got = by_job(decide(pool, shapes, now))
        old = {j.name: j for j in shapes}
        shapes = [applied(j, got[j.name], now) if j.name in got else j for j in shapes]
        usable = {n.name: n.slots for n in pool.nodes if n.schedulable}
        for r in got.values():
            j = old[r.job]
            assert r.to_replicas == len(r.nodes)
            assert r.to_replicas in j.sizes or (r.kind is Kind.SUSPEND and r.to_replicas == 0)
            assert j.resized_at is None or now - j.resized_at >= j.cooldown
            assert all(n in usable and n not in j.avoid for n in r.add)
            if r.kind in (Kind.SHRINK, Kind.SUSPEND) and "lost node" not in r.why:
                assert "for higher-priority job" in r.why
                winner = r.why.split("for higher-priority job ")[1].split(" ")[0]
                assert old[winner].priority > j.priority
        for name, slots in usable.items():
            taken = sum(j.nproc * j.nodes.count(name) for j in shapes if j.phase is Phase.RUNNING)
            was = sum(
                j.nproc * j.nodes.count(name) for j in old.values() if j.phase is Phase.RUNNING
            )
            assert taken <= max(slots, was), (name, taken, slots)
        now += 200.0
