"""Hypothesis strategies shared by the property tests: events, JSON values, bad bodies."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from resurge.events import (
    EVENT_KINDS,
    Envelope,
    GpuReading,
    GpuSample,
    InjectGpuError,
    JobSubmitted,
    Source,
    encode_event,
)
from resurge.jobspec import load_job

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_JOB = load_job(REPO_ROOT / "examples" / "crash_once" / "job.yaml")

# Any JSON value, nested a little; floats finite (JSON has no NaN).
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

sources = st.builds(Source, service=st.text(max_size=20), instance=st.text(max_size=20))
_optional_count = st.none() | st.integers(0, 2**40)


def _gpu_samples() -> st.SearchStrategy[Envelope]:
    reading = st.builds(
        GpuReading,
        index=st.integers(0, 64),
        uuid=st.text(max_size=40),
        memory_used_bytes=_optional_count,
        memory_total_bytes=_optional_count,
        ecc_uncorrected=_optional_count,
        retired_pages=_optional_count,
        utilization_percent=st.none() | st.floats(0, 100),
        temperature_c=st.none() | st.floats(-50, 150),
        power_watts=st.none() | st.floats(0, 2000),
    )
    return st.builds(GpuSample, source=sources, gpus=st.lists(reading, max_size=4))


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def event_of(model: type[Envelope]) -> st.SearchStrategy[Envelope]:
    """Valid events of ``model``: every required field drawn, floats finite (JSON has no
    NaN: an event holding one encodes it as null)."""
    if model is GpuSample:
        return _gpu_samples()
    if model is JobSubmitted:  # a TrainingJob is too constrained to draw: a real one
        return st.builds(
            JobSubmitted,
            source=sources,
            job=st.text(min_size=1, max_size=30),
            spec=st.just(EXAMPLE_JOB),
        )
    if model is InjectGpuError:  # exactly one of xid and warning (its validator)
        return st.one_of(
            st.builds(InjectGpuError, source=sources, xid=st.integers(0, 2**31 - 1)),
            st.builds(
                InjectGpuError,
                source=sources,
                warning=st.sampled_from(["corrected-ecc", "retired-pages", "thermal"]),
            ),
        )
    return st.builds(model, source=sources).filter(lambda event: _finite(event.model_dump()))


events: st.SearchStrategy[Envelope] = st.sampled_from(sorted(EVENT_KINDS)).flatmap(
    lambda kind: event_of(EVENT_KINDS[kind])
)


def document_of(event: Envelope) -> dict[str, Any]:
    """The JSON object of ``event``, as it travels."""
    document: dict[str, Any] = json.loads(encode_event(event))
    return document


VALID_JOB_DOCUMENT: dict[str, Any] = json.loads(
    EXAMPLE_JOB.model_dump_json(by_alias=True, exclude_none=True)
)
