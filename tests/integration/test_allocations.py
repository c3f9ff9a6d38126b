"""The allocation ledger's compare-and-set on a real nats-server KV bucket."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from resurge.control.state.allocations import AllocationConflict, Allocations, open_allocations
from resurge.runtime.bus import Bus


async def test_a_viewer_finds_no_ledger_before_a_placer_made_it(bus: Bus) -> None:
    assert await open_allocations(bus, "viewer", create=False) is None
    placer = await open_allocations(bus, "scaler-0")
    assert placer is not None
    assert await placer.read() == ([], 0)
    assert await open_allocations(bus, "viewer", create=False) is not None


async def test_of_two_placers_that_read_one_revision_only_the_first_writes(bus: Bus) -> None:
    kv = await bus.allocations_bucket()
    assert kv is not None
    one, two = Allocations(kv, "scaler-0"), Allocations(kv, "restarter-1")
    held, revision = await one.read()
    assert (held, revision) == ([], 0)
    mine = [one.make("a", 1, "n2", 4, ttl=60)]
    written = await one.claim(held, revision, mine)
    with pytest.raises(AllocationConflict):
        await two.claim(held, revision, [two.make("b", 0, "n2", 4, ttl=60)])
    held, revision = await two.read()
    assert (held, revision) == (mine, written), "the loser reads the winner's claim"
    theirs = [two.make("b", None, "n3", 4, ttl=60)]
    await two.claim(held, revision, theirs)
    await one.release(mine)
    assert (await one.read())[0] == theirs


async def test_a_lapsed_claim_no_longer_counts_and_goes_with_the_next_release(bus: Bus) -> None:
    kv = await bus.allocations_bucket()
    assert kv is not None
    now = datetime.now(UTC)
    late = Allocations(kv, "scaler-0", clock=lambda: now + timedelta(seconds=120))
    early = Allocations(kv, "scaler-1", clock=lambda: now)
    dead = early.make("a", 0, "n0", 2, ttl=30)  # its scaler died holding it
    live = early.make("b", 0, "n1", 2, ttl=600)
    await early.claim([], 0, [dead, live])
    assert (await late.read())[0] == [live]
    await late.release([live])
    assert (await early.read())[0] == [], "the lapsed claim went with the release"


async def test_racing_placers_never_take_one_slot_twice(bus: Bus) -> None:
    """Eight placers want one of three single-slot nodes each, all at once: each reads,
    picks a node no claim holds, and claims it; a lost compare-and-set decides again."""
    kv = await bus.allocations_bucket()
    assert kv is not None
    nodes = ["n0", "n1", "n2"]

    async def place(i: int) -> str | None:
        ledger = Allocations(kv, f"placer-{i}")
        while True:
            held, revision = await ledger.read()
            free = [n for n in nodes if n not in {c.node for c in held}]
            if not free:
                return None
            try:
                await ledger.claim(held, revision, [ledger.make(f"j{i}", 0, free[0], 1, ttl=60)])
            except AllocationConflict:
                continue
            return free[0]

    got = await asyncio.gather(*(place(i) for i in range(8)))
    taken = [node for node in got if node is not None]
    assert sorted(taken) == nodes, got
    claims, _ = await Allocations(kv, "check").read()
    assert sorted(c.node for c in claims) == nodes
