"""Closed forms the simulator is checked against.

:func:`ettr_approximation` is the first-order effective training time ratio of one job
with exponential failures, synchronous checkpoints and no elasticity:

    ETTR ~ (1 - N * r_f * (u0 + dt_cp / 2)) / (1 + w_cp / dt_cp)

(N nodes, r_f failures per node per second, u0 seconds lost per failure to detection
and restart, dt_cp seconds of training between checkpoints, w_cp seconds per checkpoint
write). It counts each failure's loss once, as if failures never met each other; it
holds while N * r_f * (u0 + dt_cp) is small (a few percent); beyond that failures during
restarts and lost work overlap and it is too pessimistic, and it turns negative where a
job makes no progress at all. :func:`young_daly_interval` is the checkpoint interval
that maximises it, to first order: sqrt(2 * w_cp * MTBF).
"""

from __future__ import annotations

import math

__all__ = ["ettr_approximation", "young_daly_interval"]


def ettr_approximation(
    nodes: int, rate_per_node_second: float, overhead: float, interval: float, write: float
) -> float:
    """The first-order ETTR (see the module); seconds throughout."""
    lost = nodes * rate_per_node_second * (overhead + interval / 2)
    return (1.0 - lost) / (1.0 + write / interval)


def young_daly_interval(write: float, mtbf: float) -> float:
    """Young/Daly's checkpoint interval sqrt(2 * write * MTBF), in the unit given."""
    return math.sqrt(2.0 * write * mtbf)
