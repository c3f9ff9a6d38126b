"""Contract: write_job_status and read_job_status."""

from __future__ import annotations

from resurge.cluster import ClusterBackend


async def test_job_status_round_trips_and_is_replaced(backend: ClusterBackend) -> None:
    assert await backend.read_job_status("team.a/train") is None
    running: dict[str, object] = {
        "name": "team.a/train",
        "phase": "Running",
        "generation": 2,
        "restarts": {"process": 1},
        "lastRecovery": None,
    }
    await backend.write_job_status("team.a/train", running)
    await backend.write_job_status("other", {"phase": "Pending"})
    assert await backend.read_job_status("team.a/train") == running
    done: dict[str, object] = {"name": "team.a/train", "phase": "Succeeded", "generation": 3}
    await backend.write_job_status("team.a/train", done)
    assert await backend.read_job_status("team.a/train") == done
    assert await backend.read_job_status("other") == {"phase": "Pending"}
    assert await backend.read_job_status("unknown") is None
