"""The services' /metrics move with what happens: a worker crash injected into a small
job on a local cluster shows up in the detector's, restarter's and scaler's real
endpoints, scraped over HTTP before the job is submitted and after its recovery.

Every service of the cluster serves /metrics on a free port (RESURGE_METRICS_PORT=0)
and logs which; the test reads the ports from the services' logs.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from resurge.control.effects.client import inject_fault
from resurge.events import Progress, RecoveryFinished
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

WORKER = str(Path(__file__).parent / "workers" / "progress_worker.py")
JOB = "metered"
SERVING = re.compile(r"serving /metrics, /livez and /readyz on port (\d+)")
SERVICES = ("detector", "restarter", "scaler")

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def port_of(log_dir: Path, service: str) -> int:
    """The metrics port ``service`` logged (its newest start)."""
    ports = SERVING.findall((log_dir / f"{service}.log").read_text())
    assert ports, f"{service} logged no metrics port"
    return int(ports[-1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def has(samples: Samples, name: str, **labels: str) -> bool:
    want = set(labels.items())
    return any(n == name and want <= ls for n, ls in samples)


async def scrape_all(log_dir: Path) -> dict[str, Samples]:
    return {s: await asyncio.to_thread(scrape, port_of(log_dir, s)) for s in SERVICES}


def progressed(generation: int, steps: int) -> Callable[[list[Observed]], bool]:
    def test(seen: list[Observed]) -> bool:
        return any(
            isinstance(o.event, Progress) and o.event.generation == generation
            and o.event.rank == 1 and o.event.step >= steps
            for o in seen
        )  # fmt: skip

    return test


def recovered(seen: list[Observed]) -> bool:
    return any(isinstance(o.event, RecoveryFinished) for o in seen)


async def test_a_crash_moves_the_restart_detection_recovery_and_replica_metrics(
    nats_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESURGE_METRICS_PORT", "0")  # every service picks a free port
    spec = python_job(
        JOB,
        WORKER,
        *("--steps", "2000"),  # longer than the test: it ends once the metrics are read
        nproc=2,
        recovery={"jobMaxRetryCount": 2, "stopGraceSeconds": 2},
    )
    scrapes: dict[str, dict[str, Samples]] = {}
    log_dir = tmp_path / "logs"  # the supervisor's, in the state folder

    async def before_submit(bus: Bus) -> None:
        scrapes["before"] = await scrape_all(log_dir)

    async def during(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0, 5), 40)
        await inject_fault(bus, JOB, 1, "crash")
        await watch.wait_for(recovered, 40)
        scrapes["after"] = await scrape_all(log_dir)

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=1, gpus_per_node=2, wait_seconds=90,
                           before_submit=before_submit, during=during,
                           end_with_during=True)  # fmt: skip
    assert set(scrapes) == {"before", "after"}, "the job ended before its metrics were read"
    [finished] = result.recoveries
    level = finished.level.value
    before, after = scrapes["before"], scrapes["after"]

    # restarter: one restart at the level the recovery ran at, its duration, the goodput
    r0, r1 = before["restarter"], after["restarter"]
    assert total(r1, "resurge_restarts_total") - total(r0, "resurge_restarts_total") == 1
    assert total(r1, "resurge_restarts_total", level=level) == 1 + total(
        r0, "resurge_restarts_total", level=level
    )
    count = "resurge_recovery_duration_seconds_count"
    assert total(r1, count, level=level) - total(r0, count, level=level) == 1
    duration = "resurge_recovery_duration_seconds_sum"
    assert total(r1, duration, level=level) - total(r0, duration, level=level) == pytest.approx(
        finished.duration_seconds
    )
    lost = "resurge_job_lost_seconds_total"
    assert not has(r0, lost, job=JOB)
    assert total(r1, lost, job=JOB, cause="restart") == pytest.approx(finished.duration_seconds)
    assert total(r1, lost, job=JOB, cause="detection") > 0
    assert 0 < total(r1, "resurge_job_goodput_ratio", job=JOB) < 1

    # detector: the exit was read and led to a fault, whose latency was measured
    d0, d1 = before["detector"], after["detector"]
    exits = "resurge_detector_raw_events_total"
    assert total(d1, exits, kind="process_exited") > total(d0, exits, kind="process_exited")
    latency = "resurge_detection_latency_seconds_count"
    [fault] = [f for f in result.faults if f.rank == 1]
    assert total(d1, latency, reason=fault.reason) - total(d0, latency, reason=fault.reason) >= 1

    # scaler: the job's replica gauges appeared with its size
    s0, s1 = before["scaler"], after["scaler"]
    for gauge in ("resurge_job_replicas", "resurge_job_target_replicas"):
        assert not has(s0, gauge, job=JOB)
        assert total(s1, gauge, job=JOB) == 1
    assert total(s1, "resurge_gpus_in_use") + total(s1, "resurge_gpus_idle") == 2
