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

Restart costs: :data:`DEFAULT_COSTS`, the parts of :mod:`.costs`, each measured by a
named bench here or taken from a publication (docs/simulation.md, "The cost model",
lists each with its source and conditions).
"""

from __future__ import annotations

from resurge.simulation.costs import CostParts

__all__ = [
    "DEFAULT_COSTS",
    "DEFAULT_FAILURES",
    "DEFAULT_POLICIES",
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

LLAMA3_GPUS = 16_384
"""GPUs of Llama 3 405B's pre-training (Meta, "The Llama 3 Herd of Models", 2024)."""

DEFAULT_COSTS = CostParts(
    # bench/forkserver.py --rounds 5 and bench/recovery.py --kills 3 --only a,d,e on this
    # project's 2-core CPU machine at load 10.5 to 14.7 (docs/simulation.md): 4 workers
    # forked 0.19 s, cold 6.54 s; (a) a process restart 0.64 s, less the fork; (e) an
    # in-process restart 0.44 s
    stop_seconds=0.45,
    in_process_stop_seconds=0.44,
    fork_start_seconds=0.19,
    cold_start_seconds=6.54,
    # Kubernetes SIG Scalability SLO: pod startup latency, 99th percentile <= 5 s
    # (schedulable stateless pods, images present)
    worker_group_seconds=5.0,
    # PyTorch, "Introduction to Libuv TCPStore Backend" (2024), figure 1: a TCPStore
    # of 98,304 (96K) ranks initialised in about 100 s: linear in the ranks
    group_base_seconds=0.0,
    group_seconds_per_rank=100.0 / 98_304,
    # Llama 3 (2024), section 3.3.1: each GPU's checkpoint state 1 MB to 4 GB (the
    # largest, the restart waits for it); Tectonic's 2 TB/s sustained read shared by
    # the 16,384 GPUs; 400 Gb/s of network per GPU
    state_gb_per_gpu=4.0,
    storage_gbps_per_gpu=2_000.0 / LLAMA3_GPUS,
    network_gbps_per_gpu=400.0,
    # assumed: one extra step of the default 10 s (no GPU here to measure)
    warmup_seconds=10.0,
)
"""The parts of every restart (:mod:`.costs`), from the sources above."""

DEFAULT_POLICIES: list[dict[str, object]] = [
    {"name": "full-job restart", "recovery": {"levels": ["job"]}},
    {
        "name": "torchrun restart",
        "recovery": {"levels": ["process", "job"]},
        "fork_server": False,
    },
    {"name": "process restart", "recovery": {"levels": ["process", "pod", "node", "job"]}},
    {"name": "in-process restart", "recovery": {}},
]
"""Policies compared when a config lists none: every fault a restart of the whole job
(every worker group recreated, a lost node's onto a spare); torchrun's (workers restarted
cold in place, a node's fault restarts the job); resurge's ladder from ``process``; the
whole ladder."""
