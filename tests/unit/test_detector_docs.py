"""docs/detectors.md names every built-in detector: in the table of built-in detectors,
in the list of resurge's own names, and in the sample error that lists the registered
ones (a detector added to pyproject.toml and missing there fails this)."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import REPO_ROOT


def builtin() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return set(project["entry-points"]["resurge.detectors"])


def test_the_detectors_page_names_every_builtin_detector() -> None:
    page = (REPO_ROOT / "docs" / "detectors.md").read_text()
    table = set(re.findall(r"^\| `(\w+)` \|", page, flags=re.MULTILINE))
    assert builtin() <= table
    [registered] = re.findall(r"\(registered: ([\w, ]+)\)", page)
    names = registered.split(", ")
    assert names == sorted(names) and builtin() <= set(names)
    own = page.split("resurge's own are", 1)[1].split("(the table above)", 1)[0]
    assert builtin() == set(re.findall(r"`(\w+)`", own))
