"""Two teams' jobs of one name are two jobs: the scaler names a job's record by the
name it was submitted under (on Kubernetes the TrainingJob's bus name, ``team-b/llama``
outside the install's namespace), not by ``metadata.name``. A real nats-server; the
cluster is tests/integration/fake_backend.py (nothing is placed here)."""

from __future__ import annotations

from contextlib import AsyncExitStack

from prometheus_client import CollectorRegistry

from resurge.control.state.records import JobStore
from resurge.events import JobSubmitted, Source
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_scaler.service import Scaler
from tests.integration.fake_backend import FakeBackend

CONTROLLER = Source(service="scaler", instance="controller:1")


def llama(namespace: str) -> object:
    return parse_job(
        {
            "metadata": {"name": "llama", "namespace": namespace},
            "spec": {"command": ["train"], "nprocPerNode": 1, "replicas": {"min": 1, "max": 1}},
        }
    )


async def test_two_namespaces_jobs_of_one_name_get_two_records(
    settings: Settings, bus: Bus
) -> None:
    """Before: team-b's submission was taken as an edit of default's ``llama``."""
    store = JobStore(await bus.jobs_bucket())
    ctx = ServiceContext("scaler", settings, bus, CollectorRegistry(), AsyncExitStack())
    scaler = Scaler(ctx, store, FakeBackend([]))
    await scaler.on_submitted(JobSubmitted(source=CONTROLLER, job="llama", spec=llama("default")))
    await scaler.on_submitted(
        JobSubmitted(source=CONTROLLER, job="team-b/llama", spec=llama("team-b"))
    )
    home, team_b = await store.get("llama"), await store.get("team-b/llama")
    assert home is not None and team_b is not None, "one job took the other's place"
    assert home[0].spec.metadata.namespace == "default"
    assert team_b[0].spec.metadata.namespace == "team-b"
    assert home[0].uid != team_b[0].uid
