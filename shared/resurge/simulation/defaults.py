"""Default failure kinds and restart costs: published failure figures, measured restarts.

Failure rates. Meta's research clusters (Kokolis et al., "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", 2024) failed at about 6.5 failures per
1,000 node-days (RSC-1). Llama 3's pre-training (Meta, "The Llama 3 Herd of Models",
2024, table 5) met 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (2,048
nodes of 8): about 3.8 per 1,000 node-days. The default total is Meta's 6.5, split into
kinds by the shares of Llama 3's 419 interruptions by cause:

- ``gpu``: faulty GPU, HBM3, SRAM, GPU system processor, thermal (148 + 72 + 19 + 17 + 6
  = 262 of 419): the node's GPU is gone; seen by the node monitor (an XID); node rung;
- ``host``: host maintenance, NIC, SSD, power supply, chassis, IO board, CPU, memory
  (32 + 7 + 3 + 3 + 2 + 2 + 2 + 2 = 53): the node is lost; seen when its heartbeat
  stops; node rung;
- ``network``: network switch or cable, NCCL watchdog timeouts (35 + 7 = 42): ranks
  hang in a collective; seen by a hang detector; process rung;
- ``software``: software bugs, dependencies, silent data corruption (54 + 2 + 6 = 62):
  an exception or a crash; seen at once; in-process rung (process for workers that
  cannot re-enter in-process).

Detection delays and repair times are not published figures: they are settings of the
detectors (a heartbeat timeout, a hang window) and of a site's repair process.

Restart costs: ``bench/recovery.py --kills 3 --only a,d,e,f`` on a 2-core machine (the
DDP example, 2 x 2 workers, gloo on CPU), fault to the first step of the next
generation, medians: (e) in-process restart 0.44 s; (a) fork-server process restart
1.24 s; (d) a cold relaunch of every worker from the checkpoint 26.3 s, the floor of a
restart that recreates a worker group (``pod``) or moves it to another node
(``node``). A full job restart (``job``) at thousands of GPUs is not measurable on one
machine: it is set to 10 minutes (rescheduling every pod, process groups over every
rank, the checkpoint read by every rank). These are small-job floors: at scale, set
``restart_seconds`` to what your cluster measures.
"""

from __future__ import annotations

from resurge.contract.vocabulary import RecoveryLevel
from resurge.control.decisions.ladder import RUNGS

__all__ = [
    "DEFAULT_FAILURES",
    "DEFAULT_POLICIES",
    "DEFAULT_RESTART_SECONDS",
    "LLAMA3_PER_1000_NODE_DAYS",
    "META_RSC_PER_1000_NODE_DAYS",
]

META_RSC_PER_1000_NODE_DAYS = 6.5
"""Meta's research cluster RSC-1: failures per 1,000 node-days."""

LLAMA3_PER_1000_NODE_DAYS = 419 / (2_048 * 54) * 1_000
"""Llama 3: 419 unexpected interruptions, 54 days, 2,048 nodes (about 3.79)."""

_LLAMA3_SHARES = {"gpu": 262, "host": 53, "network": 42, "software": 62}


def _rate(kind: str) -> float:
    return round(META_RSC_PER_1000_NODE_DAYS * _LLAMA3_SHARES[kind] / 419, 4)


DEFAULT_FAILURES: dict[str, dict[str, object]] = {
    "gpu": {
        "per_1000_node_days": _rate("gpu"),
        "scope": "node",
        "detection_seconds": 10.0,
        "lowest_rung": "node",
        "repair_hours": 24.0,
    },
    "host": {
        "per_1000_node_days": _rate("host"),
        "scope": "node",
        "detection_seconds": 30.0,
        "lowest_rung": "node",
        "repair_hours": 12.0,
    },
    "network": {
        "per_1000_node_days": _rate("network"),
        "scope": "process",
        "detection_seconds": 120.0,
        "lowest_rung": "process",
    },
    "software": {
        "per_1000_node_days": _rate("software"),
        "scope": "process",
        "detection_seconds": 1.0,
        "lowest_rung": "in_process",
    },
}
"""Failure kinds by name, as a config's ``failures`` block writes them."""

DEFAULT_RESTART_SECONDS: dict[RecoveryLevel, float] = {r.level: r.simulated_seconds for r in RUNGS}
"""Seconds from a restart's decision to the first step of the new generation, by rung."""

DEFAULT_POLICIES: list[dict[str, object]] = [
    {
        "name": "full-job restart",
        "recovery": {"levels": ["node", "job"]},
        "restart_seconds": {"node": 600.0, "job": 600.0},
    },
    {"name": "process restart", "recovery": {"levels": ["process", "pod", "node", "job"]}},
    {"name": "in-process restart", "recovery": {}},
]
"""Policies compared when a config lists none: every fault a 10-minute full restart
(bad nodes swapped for spares); the ladder from ``process``; the whole ladder."""
