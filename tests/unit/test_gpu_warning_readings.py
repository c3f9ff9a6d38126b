"""Warning signs in a GPU's readings: a simulated GPU shows an injected sign every sample
(until the node is repaired), and the command that injects one names exactly one thing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from resurge.cli.main import main
from resurge.events import InjectGpuError, Source
from resurge_node_agent.monitor.gpus import SimulatedGpus

SOURCE = Source(service="test", instance="t")


def test_a_healthy_simulated_gpu_shows_no_sign() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    for _ in range(3):
        for reading in gpus.readings():
            assert reading.ecc_corrected == 0 and reading.retired_pages == 0
            assert reading.throttle_reasons == []


def test_injected_corrected_ecc_rises_every_sample_on_that_gpu_only() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    gpus.inject_warning(1, "corrected-ecc")
    counts = [[r.ecc_corrected for r in gpus.readings()] for _ in range(3)]
    assert [c[0] for c in counts] == [0, 0, 0]
    rising = [c[1] or 0 for c in counts]
    assert 0 < rising[0] < rising[1] < rising[2]


def test_injected_retired_pages_grow_and_thermal_throttles() -> None:
    gpus = SimulatedGpus(1, seed="n1")
    gpus.inject_warning(0, "retired-pages")
    gpus.inject_warning(0, "thermal")
    first, second = gpus.readings()[0], gpus.readings()[0]
    assert (first.retired_pages, second.retired_pages) == (1, 2)
    assert first.throttle_reasons == ["sw_thermal", "hw_thermal"]
    assert first.temperature_c is not None and first.temperature_c > 85
    assert first.ecc_corrected == 0


def test_a_repair_ends_the_signs_and_keeps_the_counters() -> None:
    gpus = SimulatedGpus(1, seed="n1")
    gpus.inject_warning(0, "retired-pages")
    gpus.inject_warning(0, "thermal")
    gpus.readings()
    gpus.repair()
    after = [gpus.readings()[0] for _ in range(2)]
    assert [r.retired_pages for r in after] == [1, 1]
    assert [r.throttle_reasons for r in after] == [[], []]


def test_a_warning_on_a_gpu_the_node_lacks_is_refused() -> None:
    with pytest.raises(IndexError, match="no GPU 2"):
        SimulatedGpus(2).inject_warning(2, "thermal")


def test_the_command_names_an_xid_or_a_warning_not_both_nor_neither() -> None:
    assert InjectGpuError(source=SOURCE, node="n1", gpu=0, xid=79).warning is None
    warned = InjectGpuError(source=SOURCE, node="n1", gpu=0, warning="corrected-ecc")
    assert warned.xid is None
    with pytest.raises(ValidationError, match="exactly one"):
        InjectGpuError(source=SOURCE, node="n1", gpu=0, xid=79, warning="thermal")
    with pytest.raises(ValidationError, match="exactly one"):
        InjectGpuError(source=SOURCE, node="n1", gpu=0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--node", "n1", "--gpu", "0"], "missing --sign"),
        (["--node", "n1", "--gpu", "0", "--sign", "thermal", "--code", "48"], "--code"),
        (["--node", "n1", "--gpu", "0", "--sign", "melting"], "invalid choice"),
    ],
)
def test_inject_gpu_warning_checks_its_options(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["inject", "gpu-warning", *argv])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
