"""The ladder table: one row per rung, read by the decision and the simulator alike."""

from __future__ import annotations

from resurge.control.decisions.ladder import LADDER, RUNGS, SCOPE_FLOOR, one_above, rung
from resurge.events import FaultScope, RecoveryLevel
from resurge.simulation.costs import price
from resurge.simulation.defaults import DEFAULT_COSTS


def test_the_rungs_are_the_contract_levels_cheapest_first() -> None:
    assert list(RecoveryLevel) == LADDER
    costs = [r.simulated_seconds for r in RUNGS]
    assert costs == sorted(costs)


def test_the_cost_model_orders_the_rungs_as_the_small_job_measured_them() -> None:
    """The table's seconds are bench/recovery.py's medians on its small job (2 x 2 ranks
    on CPU: no pods, no warm-up, a small checkpoint from the page cache); the simulator's
    cost model priced for that job puts the rungs in the same order, ties included."""
    local = DEFAULT_COSTS.model_copy(
        update={"worker_group_seconds": 0.0, "warmup_seconds": 0.0, "state_gb_per_gpu": 0.0}
    )
    priced = [price(local, row.level, 4) for row in RUNGS]
    measured = [row.simulated_seconds for row in RUNGS]
    for i in range(len(RUNGS) - 1):
        assert (priced[i] < priced[i + 1]) == (measured[i] < measured[i + 1]), RUNGS[i]
        assert (priced[i] == priced[i + 1]) == (measured[i] == measured[i + 1]), RUNGS[i]


def test_a_process_fault_climbs_past_the_node_rung_and_the_top_stays() -> None:
    assert one_above(RecoveryLevel.POD, node_rung=False) is RecoveryLevel.JOB
    assert one_above(RecoveryLevel.POD, node_rung=True) is RecoveryLevel.NODE
    assert one_above(RecoveryLevel.JOB, node_rung=True) is RecoveryLevel.JOB


def test_each_scope_has_a_floor_and_only_the_first_rung_is_in_process() -> None:
    assert set(SCOPE_FLOOR) == set(FaultScope)
    assert [r.level for r in RUNGS if r.in_process] == [RecoveryLevel.IN_PROCESS]
    assert rung(RecoveryLevel.NODE).node_faults_only
