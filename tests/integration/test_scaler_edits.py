"""A job submitted again as an edit (the Kubernetes controller's submission of a new
``metadata.generation``) changes a running job and never starts a finished one, even
when the job finished after the controller looked (the scaler decides on its record);
``resurge submit`` of a finished job's name still runs it again. A real nats-server;
the cluster is tests/integration/fake_backend.py (nothing is placed here)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
from prometheus_client import CollectorRegistry

from resurge.control.state.records import JobRecord, JobStore
from resurge.events import JobPhase, JobSubmitted, Source
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_scaler.service import Scaler
from tests.integration.fake_backend import FakeBackend

JOB = "edited"
CONTROLLER = Source(service="scaler", instance="controller:1")


def spec(heartbeat: float | None = None, most: int = 4) -> object:
    monitoring = {} if heartbeat is None else {"heartbeatTimeoutSeconds": heartbeat}
    return parse_job(
        {
            "metadata": {"name": JOB},
            "spec": {
                "command": ["train"],
                "nprocPerNode": 1,
                "replicas": {"min": 1, "max": most},
                "monitoring": monitoring,
            },
        }
    )


@pytest.fixture
async def store(bus: Bus) -> JobStore:
    return JobStore(await bus.jobs_bucket())


def scaler(settings: Settings, bus: Bus, store: JobStore) -> Scaler:
    ctx = ServiceContext("scaler", settings, bus, CollectorRegistry(), AsyncExitStack())
    return Scaler(ctx, store, FakeBackend([]))


@pytest.mark.parametrize("phase", [JobPhase.SUCCEEDED, JobPhase.FAILED])
async def test_an_edit_of_a_finished_job_starts_nothing(
    settings: Settings, bus: Bus, store: JobStore, phase: JobPhase
) -> None:
    assert await store.create(JobRecord(name=JOB, uid="run-1", spec=spec(), phase=phase))
    edit = JobSubmitted(source=CONTROLLER, job=JOB, spec=spec(900), update=True)
    await scaler(settings, bus, store).on_submitted(edit)
    found = await store.get(JOB)
    assert found is not None
    assert (found[0].phase, found[0].uid) == (phase, "run-1"), "the finished job ran again"
    assert found[0].spec.spec.monitoring.heartbeat_timeout_seconds is None


async def test_an_edit_of_a_job_with_no_record_starts_nothing(
    settings: Settings, bus: Bus, store: JobStore
) -> None:
    edit = JobSubmitted(source=CONTROLLER, job=JOB, spec=spec(900), update=True)
    await scaler(settings, bus, store).on_submitted(edit)
    assert await store.get(JOB) is None


async def test_an_edit_of_a_running_job_takes_its_monitoring(
    settings: Settings, bus: Bus, store: JobStore
) -> None:
    record = JobRecord(name=JOB, uid="run-1", spec=spec(), phase=JobPhase.RUNNING, generation=1)
    assert await store.create(record)
    edit = JobSubmitted(source=CONTROLLER, job=JOB, spec=spec(900), update=True)
    await scaler(settings, bus, store).on_submitted(edit)
    found = await store.get(JOB)
    assert found is not None and found[0].uid == "run-1"
    assert found[0].spec.spec.monitoring.heartbeat_timeout_seconds == 900


async def test_an_edit_of_a_running_job_takes_its_replicas_max_and_keeps_the_rest(
    settings: Settings, bus: Bus, store: JobStore
) -> None:
    record = JobRecord(name=JOB, uid="run-1", spec=spec(), phase=JobPhase.RUNNING, generation=1)
    assert await store.create(record)
    edit = JobSubmitted(source=CONTROLLER, job=JOB, spec=spec(most=2), update=True)
    await scaler(settings, bus, store).on_submitted(edit)
    found = await store.get(JOB)
    assert found is not None and found[0].uid == "run-1"
    assert found[0].spec.spec.replicas.max == 2
    assert found[0].generation == 1, "an edit is no restart"
