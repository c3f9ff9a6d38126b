"""The custom-detector example, installed: found through its entry point, and on a local
cluster its fault restarts a job.

The example (``examples/custom-detector``, distribution ``resurge-loss-spike``) is
installed in editable mode by ``make install``, as its README says; the tests never
install anything themselves, they fail naming ``make install`` when it is missing.
What the install registered is checked in fresh processes too: a ``python -c`` here,
the detector service on the cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from resurge.contract.subjects import Subjects
from resurge.detection import ENTRY_POINT_GROUP
from resurge.events import (
    JobPhase,
    RecoveryFinished,
    RecoveryLevel,
    RecoveryStarted,
)
from resurge.local.job_factory import python_job
from resurge.local.story import run_job

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom-detector"

pytestmark = pytest.mark.e2e

_LOAD = """
import json
from resurge.detection import UnknownDetectorError, load_detectors

[detector] = load_detectors(["loss_spike"])
try:
    load_detectors(["nope"])
    unknown = None
except UnknownDetectorError as error:
    unknown = str(error)
kind = type(detector)
print(json.dumps({"class": f"{kind.__module__}.{kind.__qualname__}", "name": detector.name,
                  "kinds": sorted(detector.kinds), "unknown": unknown}))
"""

# Rank 0 of generation 0 reports a loss 1000x its mean after five steps, then keeps
# training far past the test's wait: only the detector can end that generation.
_WORKER = """
import sys
import time

from resurge import worker

run = worker.connect()
for step in range(1, 6):
    run.progress(step, loss=1.0)
    time.sleep(0.1)
if run.generation == 0:
    if run.rank == 0:
        run.progress(6, loss=1000.0)
    for step in range(7, 400):
        time.sleep(0.5)
        run.progress(step, loss=1.0)
    sys.exit("generation 0 was never stopped")
run.close()
"""


@pytest.fixture(scope="module")
def installed_example() -> None:
    """The example's entry point is registered in this environment (``make install``)."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    entry = found.get("loss_spike")
    assert entry is not None and entry.value == "resurge_loss_spike:LossSpikeDetector", (
        f"the custom-detector example is not installed in {sys.prefix}: run `make install`, "
        f"which installs it (pip install -e {EXAMPLE.relative_to(REPO)}); the group "
        f"{ENTRY_POINT_GROUP!r} has {sorted(found)}"
    )


def test_installed_example_is_found_by_its_entry_point(
    installed_example: None, tmp_path: Path
) -> None:
    # Run outside the example's folder, so the import goes through the installed package.
    done = subprocess.run(
        [sys.executable, "-c", _LOAD], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout)
    assert found["class"] == "resurge_loss_spike.detector.LossSpikeDetector"
    assert found["name"] == "loss_spike" and found["kinds"] == ["progress"]
    unknown = found["unknown"]
    assert unknown is not None, "load_detectors(['nope']) did not fail"
    assert "'nope'" in unknown and repr(ENTRY_POINT_GROUP) in unknown
    assert "loss_spike" in unknown  # the registered names are listed


@pytest.mark.timeout(180)  # a cluster's start and stop around a wait of up to 90 s
async def test_loss_spike_on_local_cluster_restarts_the_job_once(
    installed_example: None,
    nats_url: str,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The services inherit this environment: leave every setting at its default, so the
    # detector service runs every registered detector, the installed plugin among them.
    for name in (
        "RESURGE_DETECTORS",
        "LOSS_SPIKE_FACTOR",
        "LOSS_SPIKE_WARMUP",
        "LOSS_SPIKE_WINDOW",
        "LOSS_SPIKE_METRIC",
        "LOSS_SPIKE_ALERT_ONLY",
    ):
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "spiky_worker.py"
    script.write_text(textwrap.dedent(_WORKER))
    job = python_job(
        "loss-spike",
        script,
        nproc=2,
        replicas={"min": 1, "max": 1},
        recovery={"jobMaxRetryCount": 2, "stopGraceSeconds": 2},
    )
    result = await run_job(
        job,
        state_dir=tmp_path / "cluster",
        nats_url=nats_url,
        namespace=namespace,
        nodes=1,
        gpus_per_node=2,
        wait_seconds=90,
    )

    faults = result.faults
    assert [fault.reason for fault in faults] == ["loss_spike"], faults
    [fault] = faults
    [subject] = [o.subject for o in result.observed if o.event is fault]
    assert subject == Subjects(namespace).fault("loss-spike", "process")
    assert fault.fault_id == "loss_spike:loss-spike:g0:r0:s6"
    assert (fault.rank, fault.generation, fault.alert_only) == (0, 0, False)
    assert fault.suggested_level is RecoveryLevel.PROCESS
    assert fault.evidence["loss"] == 1000.0 and fault.evidence["mean"] == 1.0
    assert fault.evidence["factor"] == 10.0

    [started] = result.events(RecoveryStarted)
    assert isinstance(started, RecoveryStarted)
    assert (started.from_generation, started.to_generation) == (0, 1)
    assert len(result.events(RecoveryFinished)) == 1
    assert result.phase is JobPhase.SUCCEEDED
