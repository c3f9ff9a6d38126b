"""Checkpointless recovery on CPU: what protected state costs per step and in memory, and
what it saves when a rank is SIGKILLed in the middle of a checkpoint interval.

The model: an MLP of 4 square Linear layers whose protected state (parameters and
Adam's two moments) is ``--sizes`` MB per rank (10 and 100 by default; 1000 runs with
``--sizes 10,100,1000`` but takes too long for the default run on 2 shared cores),
DDP over 2 gloo ranks, OMP_NUM_THREADS=1, each rank a node of its own with its own
snapshot folder in /dev/shm, as the launch agent gives a worker group. For each size,
in one run (bench/checkpointless_rank.py is a rank):

1. Per-step overhead: the same two ranks train in interleaved blocks of steps with
   ``state.snapshot(step)`` after every ``optimizer.step()`` and without; the median step
   time of each and their ratio (the goal of issue 29: at most 1.05 at 100 MB). The
   ratio depends on the step time of the bench's model, printed beside it
   (``--batch`` samples per rank per step set it).
2. Recovery: a disk checkpoint (torch.distributed.checkpoint, as examples/ddp/train.py)
   every ``--interval`` steps, rank 1 SIGKILLed right after step 1.5 x interval, rank 0
   stopped at once, and both started again:

   - ``disk``: today's recovery, a plain script that never imports resurge: both resume
     from the newest complete disk checkpoint (read back from the page cache here: a
     lower bound of a real file system's read);
   - ``peer``: the same script with protected state, and rank 1 on a new node (its
     snapshot folder wiped): rank 1 receives the newest live step from rank 0 over gloo;
   - ``memory``: both processes restarted on the same nodes (their folders kept), each
     loads its own node's snapshot.

   Each is timed from the kill to the first step finished by the new processes and to
   the first step not done before the kill, with the steps redone; the ratio is each
   against ``disk``, measured in the same run (``--repeats`` times each, interleaved;
   medians). Starting Python and torch takes most of it here and varies with the load,
   so the time from the moment rank 0 had built its model (the same work in every
   scenario) to the first new step is printed too, what the scenarios change (loading
   the state, redoing steps), and where the time went, per rank.
3. Memory: the bytes each node's snapshot folder holds (the newest 3 snapshots; a new
   one is written over the oldest, taken aside), and the peak RSS of a rank (VmHWM) at the
   kill (trained 1.5 intervals, one disk checkpoint) without snapshots (``disk``) and
   with (``peer``), and after the restart, which includes the restore; and the partial
   files that writes the kill cut short left in the folders, after the kill and once the
   restarted ranks (``memory``, folders kept) have finished.

A size that the machine's available memory cannot hold is skipped with a line saying so.

    .venv/bin/python bench/checkpointless.py [--sizes 10,100] [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from published import Figure, machine, record

RANK = Path(__file__).with_name("checkpointless_rank.py")
SCENARIOS = ("disk", "peer", "memory")
MB = 1e6
# What one size needs at most, in multiples of its state, on this one machine: per rank
# a peak RSS of 2.7 (measured at 1,000 MB: the state, gradients, DDP's buckets and a
# restore's copies); per node the snapshot folder: 2 kept, 1 being written, 1 that a kill
# cut short.
MEMORY_FACTOR = 2 * 2.7 + 2 * 4
WAIT_SECONDS = 600.0


@dataclass
class Recovery:
    """One kill and restart of ``scenario``."""

    scenario: str
    killed_after: int
    resumed_after: int
    sources: list[str]
    to_first_step: float
    to_first_new_step: float
    # per rank: seconds from the kill to each of PHASES
    phases: list[dict[str, float]]
    rss_at_kill: list[int]
    rss_after: list[int]
    held_bytes: int
    held_files: int
    # left in both folders by writes the kill cut short, and still there at the end
    partial_bytes: int
    partial_after: int
    imports_resurge: bool

    @property
    def redone(self) -> int:
        return self.killed_after - self.resumed_after

    @property
    def built_to_first_new_step(self) -> float:
        """From the moment rank 0 had built its model (processes started, torch imported,
        the group joined, DDP set up: the same in every scenario) to the first new step:
        the state's load and the steps redone, what the scenarios change."""
        return self.to_first_new_step - self.phases[0]["built"]


@dataclass
class SizeResult:
    """Everything measured for one size."""

    megabytes: float
    overhead: dict[str, Any]
    recoveries: dict[str, list[Recovery]] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class Ranks:
    """Two rank processes; rank ``watch``'s stdout is a pipe, the other's a file."""

    def __init__(self, arguments: list[str], memory: Path | None, logs: Path, watch: int) -> None:
        port = free_port()
        self.logs = logs
        self.processes: list[subprocess.Popen[str]] = []
        self.started: list[float] = []
        self.watch = watch
        base = {key: value for key, value in os.environ.items() if not key.startswith("RESURGE_")}
        for rank in (0, 1):
            env = {
                **base,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            if memory is not None:
                env["RESURGE_SNAPSHOT_DIR"] = str(memory / f"node-{rank}")
            out: int | IO[str] = subprocess.PIPE
            if rank != watch:
                out = (logs / f"rank{rank}.out").open("w")
            self.started.append(time.monotonic())
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, str(RANK), *arguments],
                    env=env,
                    stdout=out,
                    stderr=(logs / f"rank{rank}.err").open("w"),
                    text=True,
                )
            )

    def watched(self) -> subprocess.Popen[str]:
        return self.processes[self.watch]

    def lines(self) -> Any:
        """The watched rank's stdout lines as they come."""
        stream = self.watched().stdout
        assert stream is not None
        yield from stream

    def finish(self) -> list[str]:
        """Wait for both; each one's stdout; raise with their stderr if one failed."""
        outputs = []
        for rank, process in enumerate(self.processes):
            rest, _ = process.communicate(timeout=WAIT_SECONDS)
            if rank == self.watch:
                outputs.append(rest or "")
            else:
                outputs.append((self.logs / f"rank{rank}.out").read_text())
        if any(process.returncode for process in self.processes):
            self.fail("a rank failed")
        return outputs

    def kill(self) -> float:
        """SIGKILL rank 1, then rank 0; the moment of the first kill."""
        os.kill(self.processes[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        self.processes[0].kill()
        for process in self.processes:
            process.wait()
        return killed

    def fail(self, why: str) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        errors = "\n".join(
            f"rank {rank} (exit {process.returncode}):\n"
            + (self.logs / f"rank{rank}.err").read_text()[-3000:]
            for rank, process in enumerate(self.processes)
        )
        raise RuntimeError(f"{why}\n{errors}")


def measure_overhead(
    megabytes: float, args: argparse.Namespace, memory: Path, logs: Path
) -> dict[str, Any]:
    arguments = ["overhead", "--megabytes", str(megabytes), "--batch", str(args.batch)]
    arguments += ["--rounds", str(args.rounds), "--block", str(args.block)]
    ranks = Ranks(arguments, memory, logs, watch=0)
    [output, _] = ranks.finish()
    [line] = [text for text in output.splitlines() if text.startswith("result ")]
    result: dict[str, Any] = json.loads(line.removeprefix("result "))
    return result


PHASES = ("started", "imported", "joined", "built", "resumed")


@dataclass
class Parsed:
    """What a rank of ``train`` printed."""

    resumed: int = 0
    source: str = ""
    steps: dict[int, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    rss: int = 0
    imports: bool = False


def parse(output: str) -> Parsed:
    """The lines a rank of ``train`` printed (see bench/checkpointless_rank.py)."""
    parsed = Parsed()
    for line in output.splitlines():
        words = line.split()
        if words[:1] == ["phases"]:
            parsed.phases.update(zip(PHASES[1:3], map(float, words[1:3]), strict=True))
        elif words[:1] == ["built"]:
            parsed.phases["built"] = float(words[1])
        elif words[:1] == ["resumed"]:
            parsed.resumed, parsed.source = int(words[1]), words[2]
            parsed.phases["resumed"] = float(words[3])
        elif words[:1] == ["step"]:
            parsed.steps[int(words[1])] = float(words[2])
        elif words[:1] == ["rss"]:
            parsed.rss = int(words[1])
        elif words[:1] == ["imports-resurge"]:
            parsed.imports = words[1] == "True"
    return parsed


def folder_bytes(folder: Path, pattern: str = "step-*.snap") -> tuple[int, int]:
    """(bytes, files) of the complete snapshots of the state under ``folder`` (not each
    rank's small random-generator files, ``rng-*``), or what ``pattern`` names:
    ``.*.part``, writes the kill cut short."""
    files = [f for f in folder.rglob(pattern) if not f.parent.name.startswith("rng-")]
    return sum(file.stat().st_size for file in files), len(files)


def recover(
    megabytes: float, scenario: str, args: argparse.Namespace, memory: Path, work: Path
) -> Recovery:
    """Train to the middle of the second interval, SIGKILL rank 1, start both again."""
    kill_after = args.interval + args.interval // 2
    checkpoints = work / "checkpoints"
    logs = work / "logs"
    logs.mkdir(parents=True)
    common = ["train", "--megabytes", str(megabytes), "--batch", str(args.batch)]
    common += ["--checkpoint-every", str(args.interval), "--checkpoint-dir", str(checkpoints)]
    if scenario != "disk":
        common.append("--protect")
    first = Ranks([*common, "--steps", str(kill_after + 1000)], memory, logs, watch=1)
    for line in first.lines():
        if line.startswith(f"step {kill_after} "):
            break
    else:
        first.fail(f"{scenario}: rank 1 ended before step {kill_after}")
    rss_at_kill = [peak_rss(process.pid) for process in first.processes]
    killed = first.kill()
    held_bytes, held_files = folder_bytes(memory / "node-0")
    partial = sum(folder_bytes(memory / f"node-{rank}", ".*.part")[0] for rank in (0, 1))
    if scenario == "peer":  # rank 1 comes back on a new node: nothing in its memory
        shutil.rmtree(memory / "node-1", ignore_errors=True)
    second = Ranks([*common, "--steps", str(kill_after + 1)], memory, logs, watch=0)
    outputs = second.finish()
    partial_after = sum(folder_bytes(memory / f"node-{rank}", ".*.part")[0] for rank in (0, 1))
    parsed = [parse(output) for output in outputs]
    steps = parsed[0].steps
    return Recovery(
        scenario=scenario,
        killed_after=kill_after,
        resumed_after=parsed[0].resumed,
        sources=[p.source for p in parsed],
        to_first_step=steps[min(steps)] - killed,
        to_first_new_step=steps[kill_after + 1] - killed,
        phases=[
            {name: at - killed for name, at in {"started": started, **p.phases}.items()}
            for started, p in zip(second.started, parsed, strict=True)
        ],
        rss_at_kill=rss_at_kill,
        rss_after=[p.rss for p in parsed],
        held_bytes=held_bytes,
        held_files=held_files,
        partial_bytes=partial,
        partial_after=partial_after,
        imports_resurge=parsed[0].imports,
    )


def megabytes_text(value: float) -> str:
    return f"{value / MB:,.0f} MB" if value >= 10 * MB else f"{value / MB:,.1f} MB"


def report_size(result: SizeResult, args: argparse.Namespace) -> None:
    o = result.overhead
    off, on = statistics.median(o["times"]["off"]), statistics.median(o["times"]["on"])
    state = o["parameters"] * 12
    print(
        f"\n== {result.megabytes:g} MB: protected state {megabytes_text(state)} per rank "
        f"(4 x Linear({o['width']}, {o['width']}) + Adam, {o['parameters']:,} parameters); "
        f"snapshot file {megabytes_text(o['snapshot_bytes'])}"
    )
    count = len(o["times"]["on"])
    print(
        f"step time, median of {count} steps each (batch {args.batch} per rank): "
        f"without snapshots {off * 1000:.1f} ms, with {on * 1000:.1f} ms: ratio {on / off:.3f}"
    )
    print(
        f"  snapshot() returns in {statistics.median(o['snapshot_calls']) * 1000:.1f} ms; "
        f"optimizer.step() takes {statistics.median(o['optimizer_steps']['off']) * 1000:.1f} ms "
        f"without, {statistics.median(o['optimizer_steps']['on']) * 1000:.1f} ms with (it "
        "waits for the previous snapshot's write); a snapshot written alone (snapshot() then "
        f"wait(), no training beside it) takes {statistics.median(o['alone']) * 1000:.1f} ms"
    )
    cores = os.cpu_count() or 1
    if cores < 4:
        print(
            f"  ({cores} cores for 2 ranks: each rank's snapshot writer has no core of its own "
            "and competes with the training threads, where on a GPU node it has idle cores)"
        )
    kill_after = args.interval + args.interval // 2
    print(
        f"recovery: disk checkpoint every {args.interval} steps, rank 1 SIGKILLed after "
        f"step {kill_after}, both started again (median of {args.repeats}):"
    )
    print(
        f"  {'scenario':<8} {'resumed from':<22} {'redone':>6} {'kill -> first step s':>21} "
        f"{'kill -> first new step s':>25} {'x disk':>7} {'built -> first new step s':>26} "
        f"{'x disk':>7}"
    )
    base = statistics.median(r.to_first_new_step for r in result.recoveries["disk"])
    base_built = statistics.median(r.built_to_first_new_step for r in result.recoveries["disk"])
    for scenario in SCENARIOS:
        runs = result.recoveries[scenario]
        last = runs[-1]
        redone = "/".join(str(r.redone) for r in runs)
        new = statistics.median(r.to_first_new_step for r in runs)
        built = statistics.median(r.built_to_first_new_step for r in runs)
        resumed = f"step {last.resumed_after} {'+'.join(last.sources)}"
        print(
            f"  {scenario:<8} {resumed:<22} {redone:>6} "
            f"{statistics.median(r.to_first_step for r in runs):>21.2f} {new:>25.2f} "
            f"{new / base:>7.3f} {built:>26.2f} {built / base_built:>7.3f}"
        )
    print("  seconds after the kill, rank 0 / rank 1 (the last repeat):")
    print("  " + " " * 9 + "".join(f"{name:>14}" for name in PHASES))
    for scenario in SCENARIOS:
        phases = result.recoveries[scenario][-1].phases
        print(
            f"  {scenario:<9}"
            + "".join(f"{phases[0][name]:>6.2f} /{phases[1][name]:>6.2f}" for name in PHASES)
        )
    disk, peer = result.recoveries["disk"][-1], result.recoveries["peer"][-1]
    print(
        f"memory per node: snapshot folder {megabytes_text(peer.held_bytes)} "
        f"({peer.held_files} snapshots); peak RSS of rank 0 / rank 1 at the kill: "
        f"without snapshots {megabytes_text(disk.rss_at_kill[0])} / "
        f"{megabytes_text(disk.rss_at_kill[1])}, with {megabytes_text(peer.rss_at_kill[0])} / "
        f"{megabytes_text(peer.rss_at_kill[1])}; after the restart: disk "
        f"{megabytes_text(disk.rss_after[0])} / {megabytes_text(disk.rss_after[1])}, peer "
        f"{megabytes_text(peer.rss_after[0])} / {megabytes_text(peer.rss_after[1])}"
    )
    partial = max(r.partial_bytes for s in ("peer", "memory") for r in result.recoveries[s])
    kept = max(r.partial_after for r in result.recoveries["memory"])
    print(
        f"writes cut short by the kill left at most {megabytes_text(partial)} of partial "
        f"files in the two folders; in the memory scenario at most {megabytes_text(kept)} "
        "of them were still there when the restarted ranks had finished"
    )
    print(f"the disk scenario's script imported resurge: {disk.imports_resurge}")


def summary(results: list[SizeResult]) -> None:
    print(
        f"\n{'state':>8} {'step ms':>8} {'snapshots x':>12} {'redone disk/peer/memory':>24} "
        f"{'disk s':>7} {'peer s':>7} {'x disk':>7} {'memory s':>9} {'x disk':>7} "
        f"{'folder':>9}   (s: kill -> first new step)"
    )
    for result in results:
        o = result.overhead
        off, on = statistics.median(o["times"]["off"]), statistics.median(o["times"]["on"])
        seconds = {
            s: statistics.median(r.to_first_new_step for r in result.recoveries[s])
            for s in SCENARIOS
        }
        redone = "/".join(str(result.recoveries[s][-1].redone) for s in SCENARIOS)
        print(
            f"{result.megabytes:>6g}MB {off * 1000:>8.1f} {on / off:>12.3f} {redone:>24} "
            f"{seconds['disk']:>7.2f} {seconds['peer']:>7.2f} "
            f"{seconds['peer'] / seconds['disk']:>7.3f} {seconds['memory']:>9.2f} "
            f"{seconds['memory'] / seconds['disk']:>7.3f} "
            f"{megabytes_text(result.recoveries['peer'][-1].held_bytes):>9}"
        )


def figures(results: list[SizeResult]) -> dict[str, Figure]:
    """What the docs quote of each size: the step and its ratio with snapshots, and
    kill -> first new step from the disk and as a ratio to it from a peer and memory."""
    made: dict[str, Figure] = {}
    for result in results:
        size = f"{result.megabytes:g}mb"
        o = result.overhead
        off, on = statistics.median(o["times"]["off"]), statistics.median(o["times"]["on"])
        made[f"{size}_step_ms"] = (round(off * 1000, 1), "ms")
        made[f"{size}_with_snapshots_x"] = (round(on / off, 3), "x")
        call = statistics.median(o["snapshot_calls"])
        alone = statistics.median(o["alone"])
        made[f"{size}_snapshot_alone_ms"] = (round(alone * 1000, 1), "ms")
        made[f"{size}_snapshot_call_ms"] = (round(call * 1000, 2), "ms")
        made[f"{size}_snapshot_call_pct_of_step"] = (round(100 * call / off, 1), "%")
        made[f"{size}_snapshot_alone_pct_of_step"] = (round(100 * alone / off, 1), "%")
        seconds = {
            s: statistics.median(r.to_first_new_step for r in result.recoveries[s])
            for s in SCENARIOS
        }
        built = {
            s: statistics.median(r.built_to_first_new_step for r in result.recoveries[s])
            for s in SCENARIOS
        }
        made[f"{size}_kill_to_new_step_disk_s"] = (round(seconds["disk"], 2), "s")
        made[f"{size}_built_to_new_step_disk_s"] = (round(built["disk"], 2), "s")
        for scenario in ("peer", "memory"):
            ratio = seconds[scenario] / seconds["disk"]
            made[f"{size}_kill_to_new_step_{scenario}_x_disk"] = (round(ratio, 3), "x")
            ratio = built[scenario] / built["disk"]
            made[f"{size}_built_to_new_step_{scenario}_x_disk"] = (round(ratio, 3), "x")
        for scenario in SCENARIOS:
            redone = max(r.redone for r in result.recoveries[scenario])
            made[f"{size}_redone_{scenario}_max"] = (redone, "")
        runs = [r for s in SCENARIOS for r in result.recoveries[s]]
        imported = statistics.median(r.phases[0]["imported"] for r in runs)
        made[f"{size}_kill_to_torch_imported_s"] = (round(imported, 2), "s")
        peer, disk = result.recoveries["peer"], result.recoveries["disk"]
        made[f"{size}_folder_mb"] = (round(peer[-1].held_bytes / MB), "MB")
        growth = max(
            statistics.median(r.rss_at_kill[rank] for r in peer)
            - statistics.median(r.rss_at_kill[rank] for r in disk)
            for rank in (0, 1)
        )
        made[f"{size}_peak_rss_growth_mb"] = (round(growth / MB), "MB")
    return made


def run_size(megabytes: float, args: argparse.Namespace, shm: Path, tmp: Path) -> SizeResult:
    name = f"{megabytes:g}mb"
    logs = tmp / name / "overhead"
    logs.mkdir(parents=True)
    result = SizeResult(megabytes, measure_overhead(megabytes, args, shm / name / "overhead", logs))
    shutil.rmtree(shm / name / "overhead")  # the node's memory back before the recoveries
    result.recoveries = {scenario: [] for scenario in SCENARIOS}
    for repeat in range(args.repeats):
        order = SCENARIOS[repeat % 3 :] + SCENARIOS[: repeat % 3]  # interleaved, rotated
        for scenario in order:
            where = f"{name}/{scenario}{repeat}"
            result.recoveries[scenario].append(
                recover(megabytes, scenario, args, shm / where, tmp / where)
            )
            shutil.rmtree(shm / where, ignore_errors=True)
            shutil.rmtree(tmp / where / "checkpoints", ignore_errors=True)
    shutil.rmtree(shm / name, ignore_errors=True)
    return result


def main(args: argparse.Namespace) -> int:
    sizes = [10.0] if args.quick else [float(size) for size in args.sizes.split(",")]
    memory_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="resurge-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="resurge-bench-", dir=memory_root) as shm,
    ):
        for megabytes in sizes:
            needed = MEMORY_FACTOR * megabytes * MB
            if needed > available_bytes():
                print(
                    f"\n== {megabytes:g} MB: skipped, it needs about {needed / 1e9:.1f} GB and "
                    f"{available_bytes() / 1e9:.1f} GB are available"
                )
                continue
            results.append(run_size(megabytes, args, Path(shm), Path(tmp)))
            report_size(results[-1], args)
    if results:
        summary(results)
    if results and not args.quick:  # a smoke test's figures are not for quoting
        conditions = f"{machine()} after the run, {load_before:.1f} before it"
        path = record("checkpointless", figures(results), conditions=conditions)
        print(f"recorded in {path}")
    print(
        f"\nwhole run: {time.monotonic() - began:.0f} s on {os.cpu_count()} cores; load average "
        f"{load_before:.1f} before it, {os.getloadavg()[0]:.1f} after (other processes than "
        "its ranks make every time here longer and noisier)"
    )
    if 1000.0 not in sizes:
        print(
            "1,000 MB is not in the default run: --sizes 1000 --interval 4 --rounds 2 "
            "--repeats 1 took 6 to 16 minutes on 2 cores that other runs shared"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        default="10,100",
        help="MB of protected state (parameters + Adam state) per rank, comma-separated "
        "(default 10,100; 1000 takes too long on 2 shared cores for the default run)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="10 MB only: a smoke test (records nothing)"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=64,
        help="samples per rank per step: sets the step time (default 64)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="blocks of steps with snapshots and as many without, interleaved (default 4)",
    )
    parser.add_argument("--block", type=int, default=3, help="timed steps per block (default 3)")
    parser.add_argument(
        "--interval", type=int, default=10, help="disk checkpoint every N steps (default 10)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="kills of each recovery scenario (default 3)"
    )
    sys.exit(main(parser.parse_args()))
