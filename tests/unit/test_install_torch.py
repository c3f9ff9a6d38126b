"""What `make install` puts in for torch (scripts/install-torch), in dry-run mode.

pip runs for real (resolving, not installing) with the machine's pip configuration
switched off (PIP_CONFIG_FILE=/dev/null) and a temporary find-links folder holding a
stand-in torch wheel, so the answer is the same on any machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-torch"


def plan(tmp_path: Path, **env: str) -> str:
    result = subprocess.run(
        ["sh", str(SCRIPT), sys.executable], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull, "TORCH_INSTALL_DRY_RUN": "1",
             "TORCH_SPEC": "torch>=2.99", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def stand_in_wheel(folder: Path) -> None:
    folder.mkdir()
    with zipfile.ZipFile(folder / "torch-2.99.0-py3-none-any.whl", "w") as wheel:
        info = "torch-2.99.0.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.99.0\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")


def test_the_train_extra_is_a_range_not_a_pin() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    [torch] = [r for r in project["optional-dependencies"]["train"] if r.startswith("torch")]
    assert "==" not in torch and ">=" in torch


def test_a_local_wheel_is_taken_without_asking_any_index(tmp_path: Path) -> None:
    stand_in_wheel(tmp_path / "wheels")
    out = plan(tmp_path, PIP_FIND_LINKS=str(tmp_path / "wheels"), TORCH_GPU="0")
    assert "from a local wheel folder (no index asked)" in out
    assert "pip install --quiet --no-index --no-deps torch>=2.99" in out


def test_without_a_local_wheel_a_gpu_less_machine_gets_the_cpu_build(tmp_path: Path) -> None:
    """From PyTorch's CPU index alone (no other index can hand over a CUDA build), and
    with short network timeouts, so an unreachable index fails fast."""
    out = plan(tmp_path, TORCH_GPU="0")
    cpu = (
        "pip install --quiet --no-index --no-deps --timeout 20 --retries 2 "
        "--find-links https://download.pytorch.org/whl/cpu/torch/ torch>=2.99"
    )
    assert cpu in out.splitlines()[1]
    assert out.splitlines()[2].endswith("pip install --quiet torch>=2.99")  # its dependencies
    own = plan(tmp_path, TORCH_GPU="0", TORCH_INDEX_URL="https://mirror.example/cpu/")
    assert "--find-links https://mirror.example/cpu/torch/ " in own


def test_make_installs_torch_first_with_the_train_extras_range() -> None:
    """One range everywhere: the extra, what `make` asks the script for, its default."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    [torch] = [r for r in project["optional-dependencies"]["train"] if r.startswith("torch")]
    makefile = (REPO / "Makefile").read_text()
    assert f"TORCH_SPEC ?= {torch}\n" in makefile
    assert f"spec=${{TORCH_SPEC:-{torch}}}\n" in SCRIPT.read_text()
    recipe = makefile.split("$(INSTALLED):", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("scripts/install-torch $(BIN)/python") < recipe.index('-e ".[')


def test_a_machine_with_a_gpu_gets_the_default_build(tmp_path: Path) -> None:
    out = plan(tmp_path, TORCH_GPU="1")
    assert "default index (CUDA build)" in out and "--index-url" not in out
