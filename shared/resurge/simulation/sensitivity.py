"""Which inputs a comparison of policies depends on: each input varied on its own.

:func:`sensitivity` runs a config's policies once as given and once per input and
factor (by default x0.5 and x2): every part of the cost model (:mod:`.costs`), the
detection delay of every failure kind at once, the failure rate, the checkpoint interval
and write. Each :class:`Row` holds, per factor, every policy's ETTR, so a reader sees
how far the gap between two policies moves with each input. Every run meets the same
failure candidates (one seed), so a gap moves only with the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resurge.simulation.config import SimulationConfig
from resurge.simulation.costs import CostParts
from resurge.simulation.runner import simulate

__all__ = ["INPUTS", "Row", "sensitivity", "varied"]

INPUTS: tuple[str, ...] = (
    *CostParts.model_fields,
    "detection_seconds",
    "failure_rate",
    "checkpoint_interval",
    "checkpoint_write",
)
"""Every input :func:`varied` knows, cost parts first."""


@dataclass(frozen=True)
class Row:
    """One input: its value as given, and per factor every policy's ETTR, by name."""

    name: str
    value: float
    ettr: dict[float, dict[str, float]]

    def gap(self, factor: float, better: str, worse: str) -> float:
        """ETTR of ``better`` less that of ``worse`` with the input times ``factor``."""
        return self.ettr[factor][better] - self.ettr[factor][worse]


def _value(config: SimulationConfig, name: str) -> float:
    if name in CostParts.model_fields:
        return float(getattr(config.costs, name))
    if name == "detection_seconds":
        return max((k.detection_seconds for k in config.failures.values()), default=0.0)
    if name == "failure_rate":
        return config.failure_rate_scale
    if name == "checkpoint_interval":
        return config.checkpoint.interval_minutes
    return config.checkpoint.write_seconds


def varied(config: SimulationConfig, name: str, factor: float) -> SimulationConfig:
    """``config`` with input ``name`` (one of :data:`INPUTS`) times ``factor``."""
    update: dict[str, Any]
    if name in CostParts.model_fields:
        update = {"costs": config.costs.scaled({name: factor})}
    elif name == "detection_seconds":
        update = {
            "failures": {
                kind_name: kind.model_copy(update={"detection_seconds": kind.detection_seconds
                                                   * factor})
                for kind_name, kind in config.failures.items()
            }
        }  # fmt: skip
    elif name == "failure_rate":
        update = {"failure_rate_scale": config.failure_rate_scale * factor}
    elif name == "checkpoint_interval":
        interval = config.checkpoint.interval_minutes * factor
        update = {"checkpoint": config.checkpoint.model_copy(update={"interval_minutes": interval})}
    elif name == "checkpoint_write":
        write = config.checkpoint.write_seconds * factor
        update = {"checkpoint": config.checkpoint.model_copy(update={"write_seconds": write})}
    else:
        raise ValueError(f"not an input: {name}; one of {', '.join(INPUTS)}")
    return config.model_copy(update=update)


def _ettr(config: SimulationConfig) -> dict[str, float]:
    return {r.policy: r.ettr for r in simulate(config).results}


def sensitivity(
    config: SimulationConfig,
    inputs: Sequence[str] = INPUTS,
    factors: Sequence[float] = (0.5, 2.0),
) -> list[Row]:
    """One :class:`Row` per input of ``inputs`` whose value is not 0 (a factor would
    change nothing), each with ``config``'s policies' ETTR as given (factor 1) and at
    every factor."""
    given = _ettr(config)
    rows = []
    for name in inputs:
        value = _value(config, name)
        if value == 0:
            continue
        ettr = {1.0: given}
        for factor in factors:
            ettr[factor] = _ettr(varied(config, name, factor))
        rows.append(Row(name=name, value=value, ettr=ettr))
    return rows
