"""The ladder table: one row per rung, read by the decision and the simulator alike."""

from __future__ import annotations

from resurge.control.decisions.ladder import LADDER, RUNGS, SCOPE_FLOOR, one_above, rung
from resurge.events import FaultScope, RecoveryLevel
from resurge.simulation.defaults import DEFAULT_RESTART_SECONDS


def test_the_rungs_are_the_contract_levels_cheapest_first() -> None:
    assert list(RecoveryLevel) == LADDER
    costs = [r.simulated_seconds for r in RUNGS]
    assert costs == sorted(costs)


def test_the_simulator_costs_a_restart_from_the_table() -> None:
    assert {r.level: r.simulated_seconds for r in RUNGS} == DEFAULT_RESTART_SECONDS


def test_a_process_fault_climbs_past_the_node_rung_and_the_top_stays() -> None:
    assert one_above(RecoveryLevel.POD, node_rung=False) is RecoveryLevel.JOB
    assert one_above(RecoveryLevel.POD, node_rung=True) is RecoveryLevel.NODE
    assert one_above(RecoveryLevel.JOB, node_rung=True) is RecoveryLevel.JOB


def test_each_scope_has_a_floor_and_only_the_first_rung_is_in_process() -> None:
    assert set(SCOPE_FLOOR) == set(FaultScope)
    assert [r.level for r in RUNGS if r.in_process] == [RecoveryLevel.IN_PROCESS]
    assert rung(RecoveryLevel.NODE).node_faults_only
