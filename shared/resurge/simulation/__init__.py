"""The goodput simulator: what a recovery or elastic policy is worth at scale.

A discrete-event simulation on a simulated clock of a cluster whose nodes and processes
fail at published rates, deciding every recovery with the restarter's own policy
(:mod:`resurge.control.decisions.recovery_policy`) and every resize with the scaler's own decision
(:mod:`resurge.control.decisions.elastic_decision`): no copy of either. :func:`simulate` runs a
:class:`SimulationConfig` (:func:`load_config` reads one from YAML) and returns a
:class:`Summary`; :func:`write_plot` draws it. Every restart, under every policy, is
priced by one cost model (:mod:`.costs`, the parts in :class:`CostParts`);
:mod:`.reproduce` reproduces published fleets and :mod:`.sensitivity` varies each input;
:mod:`.node_health` gives a fleet a few bad nodes and a policy a node quarantine and
proactive moves.
docs/simulation.md has the model, the config fields and results.
"""

from resurge.simulation.analytic import ettr_approximation, young_daly_interval
from resurge.simulation.config import ConfigError, SimulationConfig, load_config, parse_config
from resurge.simulation.costs import CostParts
from resurge.simulation.plot import MissingPlotting, write_plot
from resurge.simulation.results import PolicyResult, Summary
from resurge.simulation.runner import analytic_ettr, simulate

__all__ = [
    "ConfigError",
    "CostParts",
    "MissingPlotting",
    "PolicyResult",
    "SimulationConfig",
    "Summary",
    "analytic_ettr",
    "ettr_approximation",
    "load_config",
    "parse_config",
    "simulate",
    "write_plot",
    "young_daly_interval",
]
