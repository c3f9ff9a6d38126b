"""Control-plane chaos: ``bench/chaos.py --control-plane``, the services under their own faults.

A local cluster of 4 nodes x 2 slots runs two restarters and two scalers (as the
production overlay does) beside the detector, every service and every node monitor
reaching NATS through a TCP proxy of its own (:mod:`tcp_proxy`; a node added during
the run reaches it directly). Jobs of the bench's torch-free worker
(:mod:`chaos_worker`) run on it for the whole run: ``trainer``, 2 replicas of the
highest priority (the worker-side faults' target: never resized nor queued, so each
fault made in it is its own incident), and ``elastic``, 1 to 4 replicas, growing into
free slots and shrinking for the rest; and a 2-replica ``batch-N`` of 20 to 40 s every
30 s or so, of a priority between the two, so jobs finish, queue for slots and take
the slots a shrink frees.
Every ``--every`` seconds (jittered; default 8) one disturbance is dealt from a deck of
every kind, shuffled with the printed seed (each kind once before any twice):

- ``kill_rank`` / ``stop_rank`` (a hang) / ``log`` (a CUDA error line) / ``kill_agent`` /
  ``xid`` (a fatal XID 79; the node is replaced once the trainer moved): one of the
  trainer's workers, as ``bench/chaos.py`` does; ``kill_service``: SIGKILL a service;
  ``remove_node``: a node leaves and a fresh one joins. (No injected ``exception``: the
  worker does not run under ``resurge.worker.restartable``.)
- ``partition``: one proxy blackholes its links for 3 to 15 s (nothing passes either
  way, connections stay open: a partition, not a clean close);
- ``delay``: one proxy delays every byte by 50 to 800 ms for 5 to 20 s; ``reset``: one
  proxy aborts its connections (RST);
- ``publish_fail``: one stream of the control plane (fault, cmd, job, action) refuses
  new messages for 3 to 10 s: its limit is set to the messages it holds, discarding new
  ones, as a full stream does (JetStream answers "maximum messages exceeded"; a
  service that calls ensure_streams meanwhile lifts the limit, as an operator would);
- ``hang_kill_detector``: SIGSTOP one of the trainer's workers, and SIGKILL the detector
  a second later (it must still catch the hang once it is back);
- ``clock_step``: the services' wall clock steps by -30 s, or +60 s, for good. The
  services run with libfaketime (the ``libfaketime`` package's library, LD_PRELOAD,
  monotonic clocks left real) reading its offset from a file the bench rewrites; the
  nodes and workers keep the real clock. Without the package the kind is left out, and
  the report says so.

A fault that breaks the trainer waits for its recovery (at most
``RECOVERY_LIMIT_SECONDS``) before the next one (and no node is removed meanwhile),
and is made only while the trainer has run one generation for ``STEADY_SECONDS``, and
not in the last 30 s; the other kinds overlap. Then nothing is disturbed: the links
heal, the last fault is recovered (or judged not), the batches end (up to 15 s), the
long jobs are deleted and judged ``FINISHED_GRACE_SECONDS`` more. Twice a second
the judge (:mod:`chaos_invariants`) checks that no node holds more workers than slots,
each injected fault is recovered exactly once, no job stays Recovering past its limits,
and no worker of a finished job runs; each broken one is printed when seen and again
at the end, after the seed. It is a bench: it exits 0 whatever broke
(tests/e2e/test_chaos_control_plane.py asserts that nothing did).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from chaos_invariants import (
    FINISHED_GRACE_SECONDS,
    LONGEST_PARTITION_SECONDS,
    RECOVERY_LIMIT_SECONDS,
    Judge,
    Worker,
    census,
)
from nats.js.api import DiscardPolicy
from nats.js.errors import ServiceUnavailableError
from tcp_proxy import Proxy

from resurge.control.effects.client import delete_job, inject_fault, inject_xid, submit_job
from resurge.control.state.records import JobRecord, JobStore
from resurge.events import Event, JobPhase, RecoveryStarted
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import python_job
from resurge.local.membership import add_node, remove_node
from resurge.local.nats_server import free_port
from resurge.local.supervisor import Supervisor
from resurge.runtime.bus import Bus
from resurge.worker.environment import GENERATION

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("chaos_worker.py")
NODES, SLOTS = 4, 2
SERVICES = ("detector", "restarter", "restarter-2", "scaler", "scaler-2")
STEP_SECONDS = 0.2
SETTLE_SECONDS = 30.0
STEADY_SECONDS = 3.0  # a breaking fault waits for the trainer to run this long
BREAKING = ("kill_rank", "stop_rank", "log", "kill_agent", "xid", "hang_kill_detector")
ALONE = (*BREAKING, "remove_node")  # not while a breaking fault waits for its recovery
ELASTIC = "elastic"
# Longer than the longest publish_fail (10 s): how long a batch submission is retried.
SUBMIT_RETRY_SECONDS = 15.0
OVERLAPPING = ("kill_service", "remove_node", "partition", "delay", "reset", "publish_fail")
STREAMS = ("fault", "cmd", "job", "action")
CUDA_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered"


def _job(
    name: str, steps: int, replicas: int | dict[str, int], folder: Path, priority: int = 0
) -> TrainingJob:
    args = ["--job", name, "--steps", str(steps), "--step-seconds", str(STEP_SECONDS)]
    return python_job(
        name, WORKER, *args, replicas=replicas, forkServer=False, priority=priority,
        elastic={"cooldownSeconds": 3, "scaleUpSnoozeSeconds": 3},
        recovery={"jobMaxRetryCount": 1000, "evalPeriodSeconds": 5,
                  "backoff": {"initialSeconds": 1, "maxSeconds": 5}},
        monitoring={"heartbeatTimeoutSeconds": 5, "startupTimeoutSeconds": 30, "logRules": [
            {"name": "cuda", "logPattern": "CUDA error", "faultOnMatch": True},
        ]},
        checkpoint={"intervalSteps": 25, "dir": str(folder / "ckpt" / name)},
        env={"OMP_NUM_THREADS": "1"}, workingDir=str(REPO),
    )  # fmt: skip


class ServiceClock:
    """The services' wall clock, stepped through libfaketime's offset file."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / "faketime"
        self.offset = 0
        spec = importlib.util.find_spec("libfaketime")
        found = None
        if spec is not None and spec.origin is not None:
            found = Path(spec.origin).parent / "vendor/libfaketime/src/libfaketime.so.1"
        self.library = found if found is not None and found.exists() else None
        self.file.write_text("+0\n")

    def env(self) -> dict[str, str]:
        """What a service starts with to read its clock from the file (none: no library)."""
        if self.library is None:
            return {}
        return {
            "LD_PRELOAD": str(self.library),
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step(self, seconds: int) -> None:
        self.offset += seconds
        fresh = self.file.with_suffix(".new")
        fresh.write_text(f"{self.offset:+d}\n")
        fresh.replace(self.file)


class Bench:
    """One run: the cluster, its proxies, the disturbances and the judge."""

    def __init__(self, folder: Path, minutes: float, every: float, seed: int) -> None:
        self.folder, self.minutes, self.every = folder, minutes, every
        self.rng = random.Random(seed)
        self.started = time.monotonic()
        self.judge = Judge()
        self.clock = ServiceClock(folder)
        self.nats_port = free_port()
        self.proxies: dict[str, Proxy] = {}
        self.made: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.batches = 0
        self.background: set[asyncio.Task[None]] = set()
        self.progress_at = 0.0
        self.trainer = "trainer"
        self.supervisor: Supervisor | None = None
        self.workers: list[Worker] = []
        self.records: list[JobRecord] = []
        self.settled: list[JobRecord] = []  # the records once the disturbances ended
        self.phases: Counter[str] = Counter()  # the trainer's phase at each sample
        self._steady: tuple[int, float] | None = None  # the trainer's generation, Running since

    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        print(f"  t={self.now():7.1f}s {line}", flush=True)

    async def run(self) -> None:
        names = [*SERVICES, *(f"node-{i}" for i in range(NODES))]
        for name in names:
            self.proxies[name] = await Proxy(("127.0.0.1", self.nats_port), name).start()
        child_env = {name: {"RESURGE_NATS_URL": p.url} for name, p in self.proxies.items()}
        for name in SERVICES:
            child_env[name].update(self.clock.env())
        supervisor = self.supervisor = Supervisor(
            self.folder, NODES, SLOTS, namespace="chaoscp", nats_port=self.nats_port,
            extra_env={"RESURGE_LOG_LEVEL": "INFO"}, cwd=REPO, restarters=2, scalers=2,
            child_env=child_env,
        )  # fmt: skip
        try:
            await asyncio.to_thread(supervisor.start, 120)
        except BaseException:
            await asyncio.to_thread(supervisor.stop, 5)
            raise
        self.say(f"cluster ready: {NODES} nodes x {SLOTS} slots, services {', '.join(SERVICES)}")
        bus = await Bus.connect(supervisor.settings("admin"), "chaos")
        keeper = asyncio.create_task(self._keep_alive())
        judging = asyncio.create_task(self._judge(bus))
        try:
            await bus.subscribe(bus.subjects.all("action"), self._on_action)
            await bus.subscribe(bus.subjects.raw(self.trainer, "progress", None), self._on_progress)
            await bus.nc.flush()
            steps = int((self.minutes * 60 + 120) / STEP_SECONDS)
            await submit_job(bus, _job(self.trainer, steps, 2, self.folder, priority=2))
            await submit_job(bus, _job(ELASTIC, steps, {"min": 1, "max": 4}, self.folder))
            await self._disturb(bus, self.minutes * 60 - SETTLE_SECONDS)
            await self._settle(bus)
        finally:
            for task in [*self.background, judging, keeper]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await bus.close()
            await asyncio.to_thread(supervisor.stop)

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.close()

    async def run_and_close(self) -> None:
        try:
            await self.run()
        finally:
            await self.close()

    async def _keep_alive(self) -> None:
        assert self.supervisor is not None
        while True:
            await asyncio.to_thread(self.supervisor.check)
            await asyncio.sleep(0.2)

    async def _on_action(self, event: Event, subject: str) -> None:
        if isinstance(event, RecoveryStarted):
            self.judge.recovery(self.now(), event)

    async def _on_progress(self, event: Event, subject: str) -> None:
        self.progress_at = self.now()

    async def _judge(self, bus: Bus) -> None:
        assert self.supervisor is not None
        store = JobStore(await bus.jobs_bucket())
        while True:
            try:
                records = await store.all()
                children = list(self.supervisor.children.items())
                monitors = {c.process.pid: name for name, c in children if c.node and c.process}
                self.records = records
                self._watch_trainer(records)
                self.workers = await asyncio.to_thread(census, WORKER.name, monitors)
                slots = {n.name: n.gpus for n in self.supervisor.node_set.nodes}  # type: ignore[union-attr]
                self.judge.sample(self.now(), records, self.workers, slots)
            except Exception as error:  # a sample that could not be taken is no verdict
                self.say(f"sample skipped: {error!r}")
            await asyncio.sleep(0.5)

    async def _disturb(self, bus: Bus, seconds: float) -> None:
        next_batch = self.now() + 10
        end = self.now() + seconds
        kinds = [*BREAKING, *OVERLAPPING] + (["clock_step"] if self.clock.library else [])
        deck: list[str] = []  # every kind once, shuffled, then again (dealt from the front)
        pending: float | None = None  # when the breaking fault in flight was made
        while self.now() < end:
            await asyncio.sleep(self.every * self.rng.uniform(0.6, 1.4))
            if self.now() >= next_batch:
                await self._submit_batch(bus)
                next_batch = self.now() + self.rng.uniform(20, 40)
            if pending is not None and self._recovered(pending):
                pending = None
            alone = pending is None and self.now() < end - SETTLE_SECONDS
            playable = [k for k in deck if alone or k not in ALONE]
            if not playable:  # a fresh deck on top: what waits for a recovery stays
                deck += self.rng.sample(kinds, len(kinds))
                playable = [k for k in deck if alone or k not in ALONE]
            kind = playable[0]
            deck.remove(kind)
            try:
                detail = await self._make(kind, bus)
            except Exception as error:  # a disturbance that could not be made is no result
                detail = None
                self.say(f"{kind}: could not: {error!r}")
            if detail is None:  # dealt again after the rest of the deck
                self.skipped[kind] += 1
                deck.append(kind)
                continue
            self.made[kind] += 1
            self.say(f"{kind}: {detail}")
            if kind in BREAKING:
                pending = self.now()
                self.judge.inject(kind, self.trainer, pending)

    def _recovered(self, since: float) -> bool:
        """The breaking fault made at ``since`` was recovered and the trainer trains
        again, or the judge's limit for it passed."""
        done = [i for i in self.judge.injected if i.at == since and i.recovered]
        late = self.now() - since > RECOVERY_LIMIT_SECONDS
        return late or (bool(done) and self.progress_at > since + 1)

    async def _submit_batch(self, bus: Bus) -> None:
        self.batches += 1
        name = f"batch-{self.batches}"
        steps = int(self.rng.uniform(20, 40) / STEP_SECONDS)
        job, waited = _job(name, steps, 2, self.folder, priority=1), 0.0
        # The bench's own submission meets its own publish_fail on the job stream now and
        # then: submitted again, as a user would, once the stream takes messages.
        while True:
            try:
                await submit_job(bus, job)
                break
            except ServiceUnavailableError:
                if waited >= SUBMIT_RETRY_SECONDS:
                    raise
                await asyncio.sleep(0.5)
                waited += 0.5
        again = f" (the job stream refused it for {waited:.1f} s)" if waited else ""
        self.say(f"submitted {name}: 2 replicas, {steps * STEP_SECONDS:.0f} s of steps{again}")

    def _watch_trainer(self, records: list[JobRecord]) -> None:
        """Count the trainer's phase, and note since when it runs its generation."""
        record = next((r for r in records if r.name == self.trainer), None)
        if record is None:
            return
        self.phases[f"{record.phase}"] += 1
        if record.phase is not JobPhase.RUNNING:
            self._steady = None
        elif self._steady is None or self._steady[0] != record.generation:
            self._steady = (record.generation, self.now())

    def _trainer_workers(self) -> list[Worker]:
        """The trainer's running workers, once it has trained in one generation for a
        few seconds: a fault made then is this fault's alone (none while it recovers
        or resizes, which would take it in without a recovery of its own)."""
        record = next((r for r in self.records if r.name == self.trainer), None)
        if record is None or self._steady is None or self._steady[0] != record.generation:
            return []
        if self.now() - self._steady[1] < STEADY_SECONDS:
            return []
        return [
            w
            for w in self.workers
            if w.job == self.trainer
            and w.state not in ("T", "t")
            and _environ(w.pid, GENERATION) == str(record.generation)
        ]

    async def _make(self, kind: str, bus: Bus) -> str | None:
        """Make one disturbance of ``kind``; what it did, or None if nothing could be."""
        victims = self._trainer_workers() if kind in BREAKING else []
        victim = self.rng.choice(victims) if victims else None
        if kind in BREAKING and victim is None:
            return None
        if kind == "kill_rank" and victim:
            os.kill(victim.pid, signal.SIGKILL)
        elif kind == "stop_rank" and victim:
            os.kill(victim.pid, signal.SIGSTOP)
        elif kind == "log" and victim:
            rank = _environ(victim.pid, "RANK")
            if rank is None:
                return None
            await inject_fault(bus, self.trainer, int(rank), "log", CUDA_LINE)
        elif kind == "kill_agent" and victim:
            if "resurge_node_agent" not in _cmdline(victim.parent):
                return None
            os.kill(victim.parent, signal.SIGKILL)
            return f"agent {victim.parent} of worker {victim.pid} on {victim.node}"
        elif kind == "xid" and victim and victim.node:
            await inject_xid(bus, victim.node, 0, 79)
            self._later(self._replace(bus, victim.node, wait=RECOVERY_LIMIT_SECONDS / 2))
        elif kind == "hang_kill_detector" and victim:
            os.kill(victim.pid, signal.SIGSTOP)
            self._later(self._kill_service("detector", after=1.0))
        elif kind in BREAKING:
            return None
        else:
            return await self._make_overlapping(kind, bus)
        return f"worker {victim.pid} on {victim.node}" if victim else ""

    async def _make_overlapping(self, kind: str, bus: Bus) -> str | None:
        proxy = self.rng.choice(list(self.proxies.values()))
        if kind == "kill_service":
            name = self.rng.choice(SERVICES)
            return f"SIGKILL {name}" if await self._kill_service(name) else None
        if kind == "remove_node":
            assert self.supervisor is not None
            nodes = self.supervisor.node_names
            if len(nodes) < NODES:
                return None
            self._later(self._replace(bus, self.rng.choice(nodes), wait=0))
            return "a node leaves, a fresh one joins"
        if kind == "partition":
            seconds = self.rng.uniform(3, LONGEST_PARTITION_SECONDS)
            self._later(self._window(proxy, "blackhole", 0, seconds))
            return f"{proxy.name} blackholed for {seconds:.1f} s"
        if kind == "delay":
            seconds, delay = self.rng.uniform(5, 20), self.rng.uniform(50, 800)
            self._later(self._window(proxy, "delay", delay, seconds))
            return f"{proxy.name} delayed {delay:.0f} ms for {seconds:.1f} s"
        if kind == "reset":
            return f"{proxy.name}: {proxy.reset()} connection(s) reset"
        if kind == "publish_fail":
            family, seconds = self.rng.choice(STREAMS), self.rng.uniform(3, 10)
            self._later(_refuse_publishes(bus, family, seconds))
            return f"stream {family} refuses new messages for {seconds:.1f} s"
        if kind == "clock_step":
            step = -30 if self.clock.offset >= 0 else 60
            self.clock.step(step)
            return f"services' wall clock {step:+d} s (now {self.clock.offset:+d} s)"
        return None

    def _later(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        task.add_done_callback(self._report_failure)

    def _report_failure(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.say(f"a disturbance's later part failed: {task.exception()!r}")

    async def _kill_service(self, name: str, after: float = 0.0) -> bool:
        await asyncio.sleep(after)
        assert self.supervisor is not None
        child = self.supervisor.children[name]
        if child.process is None or child.process.poll() is not None:
            return False
        os.kill(child.process.pid, signal.SIGKILL)
        if after:
            self.say(f"SIGKILL {name} during the hang")
        return True

    async def _window(self, proxy: Proxy, mode: str, delay: float, seconds: float) -> None:
        proxy.set(mode, delay)
        try:
            await asyncio.sleep(seconds)
        finally:
            proxy.set("pass")

    async def _replace(self, bus: Bus, node: str, wait: float) -> None:
        """Take ``node`` out (after ``wait``, once its jobs moved) and add a fresh one."""
        await asyncio.sleep(wait)
        try:
            await remove_node(bus, self.folder, node, 60)
        except Exception as error:  # still in use: it stays, and a node is added anyway
            self.say(f"could not remove {node}: {error}")
        await add_node(bus, self.folder, SLOTS, {}, 60)

    async def _settle(self, bus: Bus) -> None:
        """Heal everything, let the batches end, delete the trainer, judge a while."""
        for proxy in self.proxies.values():
            proxy.set("pass")
        for task in list(self.background):
            task.cancel()
        self.say("settling: links healed, no more disturbances")
        verdict = max(  # the last fault's recovery, or the judge's verdict on it
            (i.at + RECOVERY_LIMIT_SECONDS + 1 for i in self.judge.injected if not i.recovered),
            default=0.0,
        )
        while self.now() < verdict:
            if all(i.recovered for i in self.judge.injected):
                break
            await asyncio.sleep(0.5)
        deadline = self.now() + SETTLE_SECONDS / 2
        store = JobStore(await bus.jobs_bucket())
        batches = {f"batch-{n}" for n in range(1, self.batches + 1)}
        while self.now() < deadline:
            self.settled = await store.all()
            finished = {r.name for r in self.settled if r.phase.finished}
            if batches <= finished:
                break
            await asyncio.sleep(1)
        for name in (self.trainer, ELASTIC):
            with contextlib.suppress(LookupError):
                await delete_job(bus, name)
                self.say(f"deleted {name}")
        await asyncio.sleep(FINISHED_GRACE_SECONDS + 3)  # its workers judged once

    def report(self, seed: int) -> None:
        judge = self.judge
        print("\n=== control-plane chaos ===")
        print(f"seed: {seed}")
        print(f"ran {self.now():.0f} s; judged {judge.samples} samples")
        print(f"disturbances: {dict(self.made)}")
        print(f"not possible at the moment drawn (skipped): {dict(self.skipped)}")
        if self.clock.library is None:
            print("clock_step left out: the libfaketime package is not installed")
        print(f"the trainer's phase at each sample: {dict(self.phases)}")
        recovered = sum(1 for i in judge.injected if i.recovered)
        print(f"faults injected into the trainer: {len(judge.injected)}; recovered: {recovered}")
        for i in judge.injected:
            print(f"  t={i.at:7.1f}s {i.kind}: " + (f"recovered, {i.by}" if i.recovered else "-"))
        print(f"recoveries started (all jobs): {len(judge.recoveries)}")
        print(f"batch jobs submitted: {self.batches}")
        phases = Counter(f"{r.phase}" for r in self.settled)
        print(f"jobs when the disturbances ended: {dict(phases)}")
        print(f"invariants broken: {len(judge.broken)}")
        for broken in judge.broken:
            print(f"  - {broken}")


async def _refuse_publishes(bus: Bus, family: str, seconds: float) -> None:
    """Stream ``family`` refuses new messages for ``seconds``: full, discarding new."""
    name = bus.subjects.stream(family)
    info = await bus.js.stream_info(name)
    config = info.config
    full = dataclasses.replace(
        config, max_msgs=max(info.state.messages, 1), discard=DiscardPolicy.NEW
    )
    await bus.js.update_stream(full)
    try:
        await asyncio.sleep(seconds)
    finally:
        await bus.js.update_stream(config)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _environ(pid: int, name: str) -> str | None:
    """Variable ``name`` of process ``pid`` as it started (workers are not forked here:
    their environment is their own)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{name}=".encode()
    for entry in environ:
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode()
    return None


def main(minutes: float, every: float | None, seed: int | None) -> int:
    """Run the bench and print its report; 0 whatever broke (it is a bench)."""
    seed = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    print(f"control-plane chaos: seed {seed}, {minutes:g} minutes", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="resurge-chaos-cp-"))
    bench = Bench(folder, minutes, every or 8.0, seed)
    try:
        asyncio.run(bench.run_and_close())
    finally:
        bench.report(seed)
        if bench.judge.broken or sys.exc_info()[0] is not None:
            print(f"the services' logs are kept in {folder / 'logs'}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0
