"""The Grafana dashboard: a valid dashboard model whose every PromQL expression names
only metrics the services really register, and which shows every metric family of
docs/metrics.md that a dashboard should show.

The metric names are collected by instantiating each service's metrics into a fresh
registry (no connection is made), then expanded as Prometheus exposes them (counters
``_total``, histograms ``_bucket``/``_count``/``_sum``).
"""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import pytest
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from resurge.events import Source
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_detector.runtime import DetectorRuntime, Partition
from resurge_detector.service import DetectorService
from resurge_detector.settings import DetectorSettings
from resurge_detector.state_store import StateStore
from resurge_restarter.metrics import RestarterMetrics
from resurge_scaler.metrics import ScalerMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "resurge-dashboard.json"
METRICS_DOC = REPO / "docs" / "metrics.md"

SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}
# The families the task of the dashboard is to show: each must appear in some panel.
SHOWN = {
    "resurge_detector_raw_events_total",
    "resurge_detector_events_total",
    "resurge_dead_letters_total",
    "resurge_messages_total",
    "resurge_detection_latency_seconds_bucket",
    "resurge_recovery_duration_seconds_bucket",
    "resurge_restarts_total",
    "resurge_resizes_total",
    "resurge_job_replicas",
    "resurge_job_target_replicas",
    "resurge_job_goodput_ratio",
    "resurge_job_lost_seconds_total",
    "resurge_gpus_in_use",
    "resurge_gpus_idle",
}
METRIC = re.compile(r"\bresurge_[a-z0-9_]+\b")


def names_in(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def service_registries() -> list[CollectorRegistry]:
    registries = [CollectorRegistry() for _ in range(4)]
    Bus(Client(), Settings(), "any", registries[0])  # messages, dead letters, batches
    RestarterMetrics(registries[1])
    ScalerMetrics(registries[2])
    # A real context (its supervisor registers the task metrics every service has).
    ctx = ServiceContext("detector", Settings(), cast(Bus, None), registries[3], AsyncExitStack())
    runtime = DetectorRuntime([], Source.here("detector"), Partition())
    DetectorService(ctx, DetectorSettings(), runtime, cast(StateStore, None))
    return registries


def service_metric_names() -> set[str]:
    names: set[str] = set()
    for registry in service_registries():
        names |= names_in(registry)
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    model = json.loads(DASHBOARD.read_text())
    assert isinstance(model, dict)
    return model


def panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in model["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def expressions(model: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(model) for t in p.get("targets", [])]


def test_the_collected_names_hold_what_the_services_register() -> None:
    names = service_metric_names()
    assert {"resurge_restarts_total", "resurge_job_lost_seconds_total"} <= names
    assert "resurge_detection_latency_seconds_bucket" in names
    assert "resurge_restarts" not in names  # a counter is exposed with _total only


def test_every_metric_an_expression_uses_is_one_a_service_registers(
    dashboard: dict[str, Any],
) -> None:
    known = service_metric_names()
    used = {name for expr in expressions(dashboard) for name in METRIC.findall(expr)}
    assert used, "no expression names a resurge metric"
    assert used - known == set()


def test_every_metric_family_is_on_some_panel(dashboard: dict[str, Any]) -> None:
    used = {name for expr in expressions(dashboard) for name in METRIC.findall(expr)}
    assert SHOWN - used == set()


def test_the_dashboard_is_a_valid_model_with_unique_ids_and_targets(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    every = panels(dashboard)
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for panel in every:
        assert panel["title"] and panel["type"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        targets = panel["targets"]
        assert targets, panel["title"]
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids))
        for target in targets:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert METRIC.search(target["expr"]), target["expr"]


def test_the_datasource_is_a_prometheus_template_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    job = variables["job"]
    assert job["datasource"]["uid"] == "${datasource}"
    assert set(METRIC.findall(job["definition"])) <= service_metric_names()


def test_docs_describe_every_metric_the_services_register() -> None:
    documented = set(re.findall(r"^\| `(resurge_[a-z0-9_]+)` \|", METRICS_DOC.read_text(), re.M))
    registered = set()
    for registry in service_registries():
        for family in registry.collect():
            registered.add(family.name + ("_total" if family.type == "counter" else ""))
    assert registered - documented == set()
