"""Service logs: readable text by default on a local cluster, JSON for a log shipper;
both carry the context keys that are set."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from resurge.runtime.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "resurge.test", logging.WARNING, __file__, 1, "restarting %s", ("j",), None
    )
    record.__dict__.update(extra)
    return record


def test_text_lines_read_as_words_with_the_context_after_them() -> None:
    line = TextFormatter("restarter").format(_record(job="j", generation=2, event_id="e1"))
    assert " restarter WARNING restarting j [event_id=e1 job=j generation=2]" in line
    assert not line.lstrip().startswith("{")


def test_text_without_context_is_just_the_message() -> None:
    assert TextFormatter("scaler").format(_record()).endswith(" scaler WARNING restarting j")


def test_json_lines_keep_every_context_key() -> None:
    entry = json.loads(JsonFormatter("detector").format(_record(job="j", rank=3)))
    assert entry["message"] == "restarting j" and entry["job"] == "j" and entry["rank"] == 3


def test_a_local_cluster_logs_text_unless_told_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resurge.local.supervisor import Supervisor

    monkeypatch.delenv("RESURGE_LOG_FORMAT", raising=False)
    supervisor = Supervisor(tmp_path)
    supervisor.nats_url = "nats://127.0.0.1:4222"
    assert supervisor.env()["RESURGE_LOG_FORMAT"] == "text"
    monkeypatch.setenv("RESURGE_LOG_FORMAT", "json")
    assert supervisor.env()["RESURGE_LOG_FORMAT"] == "json"
    assert os.environ["RESURGE_LOG_FORMAT"] == "json"
