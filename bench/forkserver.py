"""What a pre-warmed fork server saves on a process-level restart.

Each round starts 4 workers that ``import torch``, do one tiny tensor op and exit, and
times from the first spawn until all 4 are started (pids known), and until all 4 have
exited and their output is drained: once
with :class:`PlainSpawner` (a cold interpreter and a cold ``import torch`` each) and
once with :class:`ForkServerSpawner` preloading torch. The two alternate within each
round, so both see the same machine load. Prints the medians, their ratios, and the
one-off cost of starting the server, and records them (bench/results/forkserver.json).

    .venv/bin/python bench/forkserver.py [--rounds 5] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from published import Figure, record

from resurge_node_agent.launch.forkserver import ForkServerSpawner
from resurge_node_agent.launch.spawners import PlainSpawner, Spawner

WORKER = "import torch; raise SystemExit(0 if (torch.ones(2) + 1).sum().item() == 4 else 1)"


async def one_round(spawner: Spawner, workers: int) -> tuple[float, float]:
    """Seconds until every worker is started, and until every one has exited."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    procs = await asyncio.gather(
        *(spawner.spawn([sys.executable, "-c", WORKER], env, None) for _ in range(workers))
    )
    spawned = time.perf_counter() - started
    for proc in procs:
        _, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        code = await proc.wait()
        if code != 0:
            raise RuntimeError(f"worker exited with {code}: {err.decode()}")
    return spawned, time.perf_counter() - started


async def main(rounds: int, workers: int) -> None:
    plain = PlainSpawner()
    started = time.perf_counter()
    forked = await ForkServerSpawner.start(preload=("torch",))
    server_start = time.perf_counter() - started
    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    try:
        for _ in range(rounds):
            cold.append(await one_round(plain, workers))
            warm.append(await one_round(forked, workers))
    finally:
        await forked.close()
        await plain.close()
    print(f"{workers} workers x {rounds} rounds, on {os.cpu_count()} CPUs; median seconds")
    print(f"{'':40} {'all started':>12} {'all exited':>12}")
    rows = {"plain subprocesses (cold import torch)": cold, "fork server (torch preloaded)": warm}
    figures: dict[str, Figure] = {}
    for (name, times), key in zip(rows.items(), ("plain", "fork"), strict=True):
        spawned, exited = (statistics.median(t[i] for t in times) for i in (0, 1))
        print(f"{name:40} {spawned:12.3f} {exited:12.3f}")
        figures[f"{key}_started_s"] = (round(spawned, 3), "s")
        figures[f"{key}_exited_s"] = (round(exited, 3), "s")
    ratio = statistics.median(t[1] for t in cold) / statistics.median(t[1] for t in warm)
    print(f"all exited, plain / fork server: {ratio:.0f}x")
    print(f"fork server start, paid once: {server_start:.3f} s")
    figures["plain_x_fork_exited"] = (round(ratio, 1), "x")
    figures["server_start_s"] = (round(server_start, 3), "s")
    print(f"recorded in {record('forkserver', figures)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.workers))
