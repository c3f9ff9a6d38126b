"""``resurge.worker`` without an agent: environment, argument checks, queue, wire format."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from resurge import worker
from resurge.worker.environment import read_environment
from resurge.worker.outbox import Outbox
from resurge.worker.wire import (
    MAX_LINE_BYTES,
    CheckpointReport,
    CheckpointRequest,
    Hello,
    ProgressReport,
    ProtocolError,
    StopPending,
    checkpoint_line,
    checkpoint_now_line,
    hello_line,
    parse_agent_message,
    parse_worker_message,
    progress_line,
    stop_pending_line,
)

WORKER_VARIABLES = (
    "RESURGE_AGENT_SOCKET",
    "RESURGE_GENERATION",
    "RESURGE_RESUME_CHECKPOINT",
    "RESURGE_RESUME_STEP",
    "RANK",
    "LOCAL_RANK",
)


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Step:
    """An int-like that is not an int (as numpy's integers are)."""

    def __index__(self) -> int:
        return 7


# -- environment --


def test_environment_defaults_when_unset_or_empty() -> None:
    for environ in ({}, dict.fromkeys(WORKER_VARIABLES, "")):
        env = read_environment(environ)
        assert env.socket_path is None
        assert (env.generation, env.rank, env.local_rank) == (0, 0, 0)
        assert env.resume_checkpoint is None
        assert env.resume_step is None


def test_environment_values_are_read() -> None:
    env = read_environment(
        {
            "RESURGE_AGENT_SOCKET": "/tmp/a.sock",
            "RESURGE_GENERATION": "3",
            "RANK": "9",
            "LOCAL_RANK": " 1 ",
            "RESURGE_RESUME_CHECKPOINT": "/ckpt/step-40",
            "RESURGE_RESUME_STEP": "40",
        }
    )
    assert env.socket_path == "/tmp/a.sock"
    assert (env.generation, env.rank, env.local_rank) == (3, 9, 1)
    assert (env.resume_checkpoint, env.resume_step) == ("/ckpt/step-40", 40)


def test_resume_step_zero_is_not_none() -> None:
    assert read_environment({"RESURGE_RESUME_STEP": "0"}).resume_step == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RANK", "abc"),
        ("LOCAL_RANK", "-1"),
        ("RESURGE_GENERATION", "1.5"),
        ("RESURGE_RESUME_STEP", "ten"),
    ],
)
def test_bad_environment_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        read_environment({name: value})


# -- no agent: every call works and does nothing --


@pytest.mark.usefixtures("no_agent")
def test_connect_without_agent_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RESURGE_GENERATION", "2")
    monkeypatch.setenv("RESURGE_RESUME_STEP", "30")
    monkeypatch.setenv("RESURGE_RESUME_CHECKPOINT", "/ckpt/30")
    run = worker.connect()
    assert run.socket_path is None
    assert (run.rank, run.local_rank, run.generation) == (5, 1, 2)
    assert (run.resume_step, run.resume_checkpoint) == (30, "/ckpt/30")
    assert run.connected is False
    run.progress(31, loss=0.5)
    run.checkpoint_saved(31, "/ckpt/31")
    assert run.stop_pending is False
    assert run.stop_reason is None
    assert run.checkpoint_requested() is False
    assert run.dropped_progress == 0
    run.close()
    run.close()
    run.progress(32, loss=0.25)  # after close: still checked, then dropped
    assert run.connected is False


@pytest.mark.usefixtures("no_agent")
def test_connect_rejects_a_bad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        worker.connect()


# -- argument checks: the same with or without an agent, and after close --


@pytest.mark.parametrize("step", [-1, 1.0, True, "3", None])
@pytest.mark.usefixtures("no_agent")
def test_progress_rejects_a_bad_step(step: object) -> None:
    run = worker.connect()
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        run.progress(step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        run.checkpoint_saved(step, "/ckpt")  # type: ignore[arg-type]
    run.close()
    with pytest.raises(ValueError, match="step"):
        run.progress(step)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0.5", True, None, [1.0]])
@pytest.mark.usefixtures("no_agent")
def test_progress_rejects_a_metric_that_is_no_number(value: object) -> None:
    run = worker.connect()
    with pytest.raises(ValueError, match="metric 'loss' must be a number"):
        run.progress(1, loss=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_metrics_are_left_out_not_raised(value: float) -> None:
    line = json.loads(progress_line(3, {"loss": value, "lr": 0.1}))
    assert line == {"type": "progress", "step": 3, "metrics": {"lr": 0.1}}


@pytest.mark.parametrize("path", ["", 3, b"/ckpt", None])
@pytest.mark.usefixtures("no_agent")
def test_checkpoint_rejects_a_bad_path(path: object) -> None:
    run = worker.connect()
    with pytest.raises(ValueError, match="path"):
        run.checkpoint_saved(1, path)  # type: ignore[arg-type]


def test_lines_accept_int_likes_and_paths() -> None:
    progress = json.loads(progress_line(Step(), {"loss": 1, "lr": 0.5}))
    assert progress == {"type": "progress", "step": 7, "metrics": {"loss": 1.0, "lr": 0.5}}
    assert isinstance(progress["metrics"]["loss"], float)
    checkpoint = json.loads(checkpoint_line(Step(), Path("/ckpt/7")))
    assert checkpoint == {"type": "checkpoint", "step": 7, "path": "/ckpt/7"}


def test_a_line_over_the_limit_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match=f"the limit is {MAX_LINE_BYTES}"):
        progress_line(1, {f"metric_{i}": 1.0 for i in range(MAX_LINE_BYTES // 10)})
    with pytest.raises(ValueError, match="checkpoint message"):
        checkpoint_line(1, "/" + "x" * MAX_LINE_BYTES)


# -- the library imports only the standard library --


def test_library_imports_nothing_outside_the_standard_library() -> None:
    code = (
        "import sys, json; before = set(sys.modules); import resurge.worker; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(json.loads(result.stdout))
    assert "resurge.worker.link" in loaded  # the check sees the package's own modules
    outside = {name for name in loaded if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {
        "resurge",
        "resurge.worker",
        "resurge.worker.environment",
        "resurge.worker.hold",
        "resurge.worker.link",
        "resurge.worker.outbox",
        "resurge.worker.wire",
    }


# -- the queue --


def test_outbox_drops_oldest_progress_but_never_checkpoints() -> None:
    outbox = Outbox(max_droppable=3)
    outbox.put(b"p1", droppable=True)
    outbox.put(b"c1", droppable=False)
    for line in (b"p2", b"p3", b"p4", b"p5"):
        outbox.put(line, droppable=True)
    outbox.put(b"c2", droppable=False)
    assert outbox.dropped == 2
    assert [line for _, line in outbox.take(1 << 20)] == [b"c1", b"p3", b"p4", b"p5", b"c2"]
    assert len(outbox) == 0


def test_outbox_take_is_bounded_and_put_back_goes_first() -> None:
    outbox = Outbox()
    for line in (b"aaaa", b"bbbb", b"cccc"):
        outbox.put(line, droppable=False)
    first = outbox.take(5)
    assert first == [(False, b"aaaa")]
    assert outbox.take(0) == [(False, b"bbbb")]  # always at least one
    outbox.put(b"dddd", droppable=True)
    outbox.put_back(first)
    assert [line for _, line in outbox.take(100)] == [b"aaaa", b"cccc", b"dddd"]


def test_outbox_put_back_keeps_the_bound() -> None:
    outbox = Outbox(max_droppable=2)
    outbox.put(b"p2", droppable=True)
    outbox.put(b"p3", droppable=True)
    outbox.put_back([(True, b"p1"), (False, b"c1")])
    assert [line for _, line in outbox.take(100)] == [b"c1", b"p2", b"p3"]
    assert outbox.dropped == 1


# -- the wire format --


def test_lines_round_trip() -> None:
    hello = hello_line(local_rank=1, rank=5, pid=42, generation=3)
    assert parse_worker_message(hello) == Hello(local_rank=1, rank=5, pid=42, generation=3)
    progress = progress_line(8, {"loss": 0.5})
    assert parse_worker_message(progress) == ProgressReport(step=8, metrics={"loss": 0.5})
    checkpoint = checkpoint_line(8, "/ckpt/8")
    assert parse_worker_message(checkpoint) == CheckpointReport(step=8, path="/ckpt/8")
    stop = stop_pending_line(3, "resize")
    assert parse_agent_message(stop) == StopPending(generation=3, reason="resize")
    request = checkpoint_now_line(3, "resize 2 -> 4")
    assert parse_agent_message(request) == CheckpointRequest(generation=3, reason="resize 2 -> 4")
    assert json.loads(request) == {
        "type": "checkpoint_now",
        "generation": 3,
        "reason": "resize 2 -> 4",
    }
    for line in (hello, progress, checkpoint, stop, request):
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1


def test_unknown_fields_are_ignored() -> None:
    line = b'{"type": "progress", "step": 1, "metrics": {}, "added_later": [1]}'
    assert parse_worker_message(line) == ProgressReport(step=1, metrics={})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not_json"),
        (b'{"type": "progress"', "not_json"),
        (b"\xff\xfe", "not_json"),
        (b"[" * 100_000, "not_json"),
        (b"[1, 2]", "not_object"),
        (b'"hello"', "not_object"),
        (b"{}", "unknown_type"),
        (b'{"type": "stop_pending", "generation": 1, "reason": ""}', "unknown_type"),
        (b'{"type": "progress", "step": -1, "metrics": {}}', "bad_field"),
        (b'{"type": "progress", "step": "1", "metrics": {}}', "bad_field"),
        (b'{"type": "progress", "step": true, "metrics": {}}', "bad_field"),
        (b'{"type": "progress", "step": 1.0, "metrics": {}}', "bad_field"),
        (b'{"type": "progress", "step": 1, "metrics": []}', "bad_field"),
        (b'{"type": "progress", "step": 1, "metrics": {"loss": "x"}}', "bad_field"),
        (b'{"type": "progress", "step": 1, "metrics": {"loss": NaN}}', "bad_field"),
        (b'{"type": "checkpoint", "step": 1, "path": ""}', "bad_field"),
        (b'{"type": "checkpoint", "step": 1}', "bad_field"),
        (b'{"type": "hello", "local_rank": 0, "rank": 0, "pid": 0, "generation": 0}', "bad_field"),
        (b'{"type": "hello", "local_rank": -1, "rank": 0, "pid": 1, "generation": 0}', "bad_field"),
    ],
)
def test_bad_worker_lines_have_a_reason(line: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_worker_message(line)
    assert caught.value.reason == reason


def test_checkpoint_now_line_checks_and_cuts() -> None:
    with pytest.raises(ValueError, match="generation must be a non-negative int"):
        checkpoint_now_line(-1, "x")
    long = checkpoint_now_line(7, "\U0001f600" * 5000)  # escapes to 12 bytes each
    assert parse_agent_message(long) == CheckpointRequest(generation=7, reason="\U0001f600" * 1000)
    # a reason is optional on the wire
    assert parse_agent_message(b'{"type": "checkpoint_now", "generation": 2}') == (
        CheckpointRequest(generation=2, reason="")
    )


@pytest.mark.parametrize(
    "line",
    [
        b'{"type": "checkpoint_now"}',
        b'{"type": "checkpoint_now", "generation": -1}',
        b'{"type": "checkpoint_now", "generation": 1, "reason": 5}',
    ],
)
def test_bad_checkpoint_now_lines_are_bad_fields(line: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_agent_message(line)
    assert caught.value.reason == "bad_field"


def test_checkpoint_now_is_not_a_worker_message() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_worker_message(checkpoint_now_line(1, ""))
    assert caught.value.reason == "unknown_type"


@pytest.mark.parametrize("value", [0, 999, -3, 1.5, "SIGUSR1", True])
@pytest.mark.usefixtures("no_agent")
def test_connect_rejects_a_checkpoint_signal_that_is_no_signal(value: object) -> None:
    with pytest.raises(ValueError, match="checkpoint_signal"):
        worker.connect(checkpoint_signal=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoint_signal"):
        worker.restartable(lambda run: None, checkpoint_signal=value)  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_agent")
def test_without_an_agent_no_checkpoint_is_ever_requested() -> None:
    run = worker.connect(checkpoint_signal=signal.SIGUSR1)
    assert run.checkpoint_signal is signal.SIGUSR1
    assert [run.checkpoint_requested() for _ in range(3)] == [False] * 3
    run.checkpoint_saved(1, "/ckpt/1")
    assert run.checkpoint_requested() is False
    assert run.checkpoint_reason is None
    run.close()


def test_bad_agent_lines_have_a_reason() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_agent_message(b'{"type": "progress", "step": 1}')
    assert caught.value.reason == "unknown_type"
    with pytest.raises(ProtocolError) as caught:
        parse_agent_message(b'{"type": "stop_pending", "generation": "1", "reason": ""}')
    assert caught.value.reason == "bad_field"


def test_a_restored_line_round_trips_and_a_source_without_its_step_is_refused() -> None:
    from resurge.worker.wire import ProtocolError, RestoreReport, restored_line

    line = restored_line(3, 119, "peer", "step 119 from rank 0's memory")
    assert parse_worker_message(line) == RestoreReport(
        generation=3, step=119, source="peer", detail="step 119 from rank 0's memory"
    )
    assert parse_worker_message(restored_line(0, None, "start", "")) == RestoreReport(
        generation=0, step=None, source="start", detail=""
    )
    with pytest.raises(ValueError, match="source must be one of"):
        restored_line(1, 5, "tape", "")
    with pytest.raises(ProtocolError, match="bad_field"):
        parse_worker_message(b'{"type":"restored","generation":1,"step":null,"source":"peer"}')
