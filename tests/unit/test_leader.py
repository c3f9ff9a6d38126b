"""The leader election's decisions, alone (resurge.cluster.kubernetes.leader): when a
candidate may write itself into the Lease, what it writes, and when a record counts as
changed. The rules are client-go's leaderelection (tryAcquireOrRenew): expiry is judged
by the candidate's own clock from when it saw the record change, never by the record's
timestamps ("Leases", https://kubernetes.io/docs/concepts/architecture/leases/)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resurge.cluster.kubernetes.leader import Seen, claim, identity, may_take, observe, timings

T0 = datetime(2026, 12, 6, 2, 0, 0, 123456, tzinfo=UTC)


def spec(
    holder: str, duration: int = 15, renew: datetime = T0, transitions: int = 0
) -> dict[str, object]:
    stamp = renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }


def test_no_lease_may_be_taken() -> None:
    assert may_take(None, "b", now=0.0)


def test_a_lease_held_by_another_may_be_taken_only_after_its_duration_by_my_clock() -> None:
    seen = Seen(spec("a", duration=15), at=100.0)
    assert not may_take(seen, "b", now=100.0)
    assert not may_take(seen, "b", now=114.9)
    assert may_take(seen, "b", now=115.0)


def test_the_holder_may_always_renew_and_an_empty_holder_may_be_taken_at_once() -> None:
    assert may_take(Seen(spec("a"), at=100.0), "a", now=100.0)
    assert may_take(Seen(spec(""), at=100.0), "b", now=100.0)


def test_expiry_runs_from_when_the_record_was_seen_to_change_not_from_its_timestamps() -> None:
    # The holder's clock is an hour behind: renewTime is long past by ours, yet the record
    # just changed, so it is live.
    first = observe(None, spec("a", renew=T0 - timedelta(hours=1)), now=50.0)
    assert first.at == 50.0
    assert not may_take(first, "b", now=60.0)
    # Read again unchanged: the time it was first seen stands, and it expires 15 s on.
    again = observe(first, spec("a", renew=T0 - timedelta(hours=1)), now=64.0)
    assert again is first
    assert may_take(again, "b", now=65.0)
    # Renewed (renewTime moved): seen changing now, live for another 15 s.
    renewed = observe(again, spec("a", renew=T0 - timedelta(hours=1) + timedelta(seconds=2)), 64.0)
    assert renewed.at == 64.0
    assert not may_take(renewed, "b", now=78.9)


def test_a_record_that_differs_only_outside_the_election_fields_is_unchanged() -> None:
    first = observe(None, spec("a"), now=1.0)
    assert observe(first, {**spec("a"), "preferredHolder": "x"}, now=9.0) is first


def test_taking_over_counts_a_transition_and_sets_the_acquire_time() -> None:
    now = T0 + timedelta(seconds=30)
    taken = claim(spec("a", duration=15, transitions=3), "b", 20, now)
    assert taken == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 20,
        "acquireTime": "2026-12-06T02:00:30.123456Z",
        "renewTime": "2026-12-06T02:00:30.123456Z",
        "leaseTransitions": 4,
    }


def test_renewing_keeps_the_acquire_time_and_the_transitions() -> None:
    renewed = claim(spec("a", transitions=3), "a", 15, T0 + timedelta(seconds=2))
    assert renewed["acquireTime"] == spec("a")["acquireTime"]
    assert renewed["renewTime"] == "2026-12-06T02:00:02.123456Z"
    assert renewed["leaseTransitions"] == 3


def test_a_new_lease_starts_with_no_transition() -> None:
    created = claim(None, "a", 15, T0)
    assert created["holderIdentity"] == "a" and created["leaseTransitions"] == 0


def test_timings_keep_client_gos_proportions() -> None:
    renew_deadline, retry = timings(15)
    assert (round(renew_deadline, 6), round(retry, 6)) == (10.0, 2.0)
    # A leader that cannot renew stops before any standby may take over.
    assert retry < renew_deadline < 15


def test_an_identity_is_the_pod_name_plus_a_random_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTNAME", "resurge-scaler-7d9f-abcde")
    one, two = identity(), identity()
    assert one.startswith("resurge-scaler-7d9f-abcde_") and two.startswith(
        "resurge-scaler-7d9f-abcde_"
    )
    assert one != two
