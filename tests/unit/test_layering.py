"""Services never import each other, and the shared library imports no service.

Reads every module's imports from its syntax tree (import-linter holds the same
contracts in `make lint`; this test keeps them in the test suite too).
"""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICES = {
    "resurge_detector": REPO / "services" / "detector" / "resurge_detector",
    "resurge_node_agent": REPO / "services" / "node-agent" / "resurge_node_agent",
    "resurge_restarter": REPO / "services" / "restarter" / "resurge_restarter",
    "resurge_scaler": REPO / "services" / "scaler" / "resurge_scaler",
}


def imported_top_levels(folder: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(REPO))] = names
    return found


def imported_modules(path: Path) -> list[str]:
    """Every absolute module ``path`` imports, and each name imported from one as
    ``module.name`` (it may be a submodule)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return found


def test_every_service_package_exists() -> None:
    for package, folder in SERVICES.items():
        assert (folder / "__init__.py").is_file(), package


def test_no_service_imports_another() -> None:
    offences = [
        f"{path} imports {name}"
        for package, folder in SERVICES.items()
        for path, names in imported_top_levels(folder).items()
        for name in names & (set(SERVICES) - {package})
    ]
    assert offences == []


def test_shared_library_imports_no_service() -> None:
    offences = [
        f"{path} imports {name}"
        for path, names in imported_top_levels(REPO / "shared" / "resurge").items()
        for name in names & set(SERVICES)
    ]
    assert offences == []


# Runs in the training process, on state the script registered: torch is there, and it
# is imported inside the functions a script calls (`import resurge.worker.protect` and the
# snapshot format it writes do not).
# A framework integration imports its framework, and torch, as a script does.
WORKER_SIDE_TORCH = {
    "shared/resurge/worker/protect.py",
    "shared/resurge/worker/snapshot_format.py",
    "shared/resurge/integrations/lightning.py",
}
INTEGRATIONS = REPO / "shared" / "resurge" / "integrations"


def test_control_plane_does_not_import_torch() -> None:
    folders = [REPO / "shared" / "resurge", *SERVICES.values()]
    offences = [
        path
        for folder in folders
        for path, names in imported_top_levels(folder).items()
        if "torch" in names and path not in WORKER_SIDE_TORCH
    ]
    assert offences == []


def test_the_worker_library_imports_torch_only_once_a_script_protects_state() -> None:
    code = (
        "import sys, resurge.worker, resurge.worker.protect; "
        "assert 'torch' not in sys.modules, 'imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nothing_but_a_training_script_imports_an_integration() -> None:
    """Only scripts import resurge.integrations (and so a framework such as lightning)."""
    folders = [REPO / "shared" / "resurge", *SERVICES.values()]
    offences: list[str] = []
    for folder in folders:
        for path in folder.rglob("*.py"):
            if path.is_relative_to(INTEGRATIONS):
                continue
            offences.extend(
                f"{path.relative_to(REPO)} imports {module}"
                for module in imported_modules(path)
                if module.split(".")[0] == "lightning"
                or module == "resurge.integrations"
                or module.startswith("resurge.integrations.")
            )
    assert offences == []


def test_the_integrations_package_imports_no_framework() -> None:
    code = (
        "import sys, resurge.integrations; "
        "assert not {'torch', 'lightning'} & set(sys.modules), 'imported a framework'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_service_names_the_local_backend() -> None:
    """Services get their backend from resurge.cluster.open_backend, never by class."""
    offences = []
    for folder in SERVICES.values():
        for path in folder.rglob("*.py"):
            text = path.read_text()
            where = str(path.relative_to(REPO))
            if "LocalBackend" in text:
                offences.append(f"{where} names LocalBackend")
            offences.extend(
                f"{where} imports {module}"
                for module in imported_modules(path)
                if module == "resurge.cluster.local" or module.startswith("resurge.cluster.local.")
            )
    assert offences == []
