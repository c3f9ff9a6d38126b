"""Hypothesis settings for the property tests: deterministic and small.

Every run draws the same examples (``derandomize``), so CI never flakes on a new one;
example counts stay modest so the folder runs in seconds on two cores. Set
``HYPOTHESIS_PROFILE=deep`` to look further (random, many more examples) by hand.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
