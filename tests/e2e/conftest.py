"""End-to-end tests get a longer budget than pytest's 120 s default: each starts a whole
local cluster (NATS, services, node monitors, agents, torch workers), some twice, and
on a loaded 2-core machine a test that passes takes up to about two minutes."""

from __future__ import annotations

import pytest

E2E_TIMEOUT_SECONDS = 360


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An e2e test without a timeout of its own gets :data:`E2E_TIMEOUT_SECONDS`."""
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_SECONDS))
