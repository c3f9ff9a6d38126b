"""``resurge.worker.restartable``: the in-process restart wrapper, worker side.

The worker is a real Python process running the wrapper; the agent is a tiny fake: a
unix socket this test listens on and speaks the protocol through by hand (lines in,
lines out), so each test decides exactly what the agent says and when. The real agent
and real torch workers are in tests/integration/test_in_process_restart.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resurge import worker
from resurge.worker.interrupt import Interrupter
from resurge.worker.teardown import is_collective_failure
from resurge.worker.wire import (
    MAX_FAULT_MESSAGE,
    MAX_FAULT_TRACEBACK,
    MAX_LINE_BYTES,
    FaultReport,
    Hello,
    ProgressReport,
    ProtocolError,
    RaiseCommand,
    Rejoining,
    RestartCommand,
    fault_line,
    hello_line,
    parse_agent_message,
    parse_worker_message,
    raise_line,
    rejoining_line,
    restart_line,
)

WAIT = 20.0

# fn reports a step per generation, then waits (bounded) to be interrupted; in the
# generation named by FINAL it returns instead. What each call saw goes to stdout.
LOOPING = """
import json, os, sys, time
from resurge import worker

def train(run, final):
    print(json.dumps({"generation": run.generation, "rank": run.rank,
                      "resume_step": run.resume_step, "pid": os.getpid(),
                      "extra": os.environ.get("EXTRA"),
                      "same_run": worker.connect() is run}), flush=True)
    run.progress(run.generation * 10 + 1, loss=1.0)
    if run.generation == final:
        return "done"
    for _ in range(2000):
        time.sleep(0.01)
    sys.exit(7)

print(worker.restartable(train, restart_wait_seconds=float(sys.argv[1]),
                         peer_grace_seconds=float(sys.argv[2]))(final=int(sys.argv[3])),
      flush=True)
"""

# fn raises ERROR (a Python expression) in generation 0 and returns in later ones.
RAISING = """
import os, sys
from resurge import worker

def train(run):
    print("generation", run.generation, flush=True)
    if run.generation == 0:
        raise eval(sys.argv[3])
    return None

worker.restartable(train, restart_wait_seconds=float(sys.argv[1]),
                   peer_grace_seconds=float(sys.argv[2]))()
"""


class FakeAgent:
    """One worker's connection to a hand-driven agent socket."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.server.settimeout(WAIT)
        self.conn: socket.socket | None = None
        self._lines: Any = None

    def accept(self) -> Hello:
        self.conn, _ = self.server.accept()
        self.conn.settimeout(WAIT)
        self._lines = self.conn.makefile("rb")
        hello = self.next()
        assert isinstance(hello, Hello)
        return hello

    def next(self) -> Any:
        line = self._lines.readline()
        assert line, "the worker closed the connection"
        return parse_worker_message(line)

    def next_of(self, kind: type) -> Any:
        """The next message of ``kind``, skipping progress reports."""
        while True:
            message = self.next()
            if isinstance(message, kind):
                return message

    def send(self, line: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(line)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[FakeAgent]:
    fake = FakeAgent(str(tmp_path / "agent.sock"))
    yield fake
    fake.close()


def start_worker(
    agent: FakeAgent | None, code: str, *args: object, extra: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESURGE_")}
    env.update(RANK="3", LOCAL_RANK="1", RESURGE_GENERATION="0", EXTRA="old", **(extra or {}))
    if agent is not None:
        env["RESURGE_AGENT_SOCKET"] = agent.path
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def restart_to(generation: int, rank: int = 5, **more: str) -> bytes:
    environment = {"RANK": str(rank), "LOCAL_RANK": "1", "RESURGE_GENERATION": str(generation)}
    return restart_line(generation, {**environment, **more}, ["EXTRA"])


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT)
    return proc.returncode, out, err


# -- the protocol additions --


def test_hello_says_in_process_and_an_old_hello_means_not() -> None:
    line = hello_line(local_rank=1, rank=5, pid=42, generation=3, in_process=True)
    assert parse_worker_message(line) == Hello(1, 5, 42, 3, in_process=True)
    old = b'{"type":"hello","local_rank":1,"rank":5,"pid":42,"generation":3}'
    assert parse_worker_message(old) == Hello(1, 5, 42, 3, in_process=False)
    with pytest.raises(ProtocolError) as error:
        parse_worker_message(old[:-1] + b',"in_process":"yes"}')
    assert error.value.reason == "bad_field"


def test_restart_raise_fault_and_rejoining_lines_round_trip() -> None:
    restart = parse_agent_message(restart_line(4, {"RANK": "2"}, ["RESURGE_RESUME_STEP"]))
    assert restart == RestartCommand(4, {"RANK": "2"}, ("RESURGE_RESUME_STEP",))
    assert parse_agent_message(raise_line(3)) == RaiseCommand(3)
    fault = parse_worker_message(fault_line(3, "builtins.ValueError", "bad", "Traceback ..."))
    assert fault == FaultReport(3, "builtins.ValueError", "bad", "Traceback ...")
    assert parse_worker_message(rejoining_line(4, 2)) == Rejoining(4, 2)


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"restart","generation":1,"environment":{"RANK":2},"unset":[]}',
        b'{"type":"restart","generation":1,"environment":{},"unset":"X"}',
        b'{"type":"raise","generation":-1}',
    ],
)
def test_bad_agent_commands_are_rejected(line: bytes) -> None:
    with pytest.raises(ProtocolError) as error:
        parse_agent_message(line)
    assert error.value.reason == "bad_field"


def test_fault_line_keeps_the_start_of_the_message_and_the_end_of_the_traceback() -> None:
    message = "m" * (MAX_FAULT_MESSAGE + 10)
    trace = "t" * MAX_FAULT_TRACEBACK + "END"
    fault = parse_worker_message(fault_line(0, "x.Error", message, trace))
    assert isinstance(fault, FaultReport)
    assert fault.message == message[:MAX_FAULT_MESSAGE]
    assert fault.traceback.endswith("END") and len(fault.traceback) == MAX_FAULT_TRACEBACK
    # characters that escape to 12 bytes each still fit, cut shorter
    wide = fault_line(0, "x.Error", "\U0001f525" * MAX_FAULT_MESSAGE, "\U0001f525" * 9000)
    assert len(wide) <= MAX_LINE_BYTES


def test_an_environment_too_big_for_one_line_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        restart_line(1, {"BIG": "x" * MAX_LINE_BYTES}, [])


# -- the interrupter --


def test_interrupter_raises_only_inside_the_guarded_call() -> None:
    interrupter = Interrupter()
    inside = threading.Event()
    assert not interrupter.interrupt(KeyError)  # nothing guarded yet

    def spin() -> None:
        inside.set()
        for _ in range(10**9):  # bytecodes, so the exception lands
            pass

    def interrupt_once_inside() -> None:
        assert inside.wait(WAIT)
        assert interrupter.interrupt(KeyError)

    helper = threading.Thread(target=interrupt_once_inside)
    helper.start()
    with pytest.raises(KeyError):
        interrupter.call(spin)
    helper.join(WAIT)
    assert not interrupter.armed
    assert not interrupter.interrupt(KeyError)
    assert interrupter.call(lambda: 5) == 5  # nothing left pending


def test_interrupter_call_refuses_another_thread() -> None:
    interrupter = Interrupter()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            interrupter.call(lambda: None)
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(WAIT)
    assert len(errors) == 1


# -- collective failures --


def test_collective_failures_are_recognised_by_their_words_and_causes() -> None:
    closed = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]")
    assert is_collective_failure(closed)
    try:
        try:
            raise closed
        except RuntimeError as inner:
            raise ValueError("while reducing") from inner
    except ValueError as outer:
        assert is_collective_failure(outer)
    assert not is_collective_failure(RuntimeError("CUDA out of memory"))
    assert not is_collective_failure(KeyError("c10d"))


# -- the wrapper, in a real worker process --


def test_without_an_agent_fn_runs_once_and_its_value_is_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RESURGE_AGENT_SOCKET", raising=False)
    calls: list[int] = []

    def train(run: worker.WorkerRun, value: int) -> int:
        calls.append(run.generation)
        return value * 2

    assert worker.restartable(train)(value=21) == 42
    assert calls == [0]


def test_restart_re_enters_fn_with_the_new_generation_in_the_same_process(
    agent: FakeAgent,
) -> None:
    proc = start_worker(agent, LOOPING, 30, 10, 1)
    try:
        hello = agent.accept()
        assert hello.in_process and hello.generation == 0 and hello.rank == 3
        first = agent.next()
        assert isinstance(first, ProgressReport) and first.step == 1
        agent.send(restart_to(1, rank=5, RESURGE_RESUME_STEP="7"))
        rejoin = agent.next_of(Rejoining)
        assert rejoin == Rejoining(generation=1, rank=5)
        code, out, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err
    first, second, result = out.splitlines()
    before, after = json.loads(first), json.loads(second)
    assert before["pid"] == after["pid"] == proc.pid
    assert (before["generation"], before["rank"], before["extra"]) == (0, 3, "old")
    assert (after["generation"], after["rank"], after["resume_step"]) == (1, 5, 7)
    assert after["extra"] is None  # removed, as the restart said
    assert after["same_run"] and result == "done"


def test_repeated_or_older_restarts_are_ignored(agent: FakeAgent) -> None:
    proc = start_worker(agent, LOOPING, 30, 10, 2)
    try:
        agent.accept()
        agent.send(restart_to(1))
        assert agent.next_of(Rejoining).generation == 1
        # generation 1 runs (a restart that came before it printed would rightly skip it)
        assert agent.next_of(ProgressReport).step == 11
        agent.send(restart_to(1))  # redelivered
        agent.send(restart_to(2))
        assert agent.next_of(Rejoining).generation == 2
        code, out, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err
    assert [json.loads(line)["generation"] for line in out.splitlines()[:-1]] == [0, 1, 2]


def test_an_exception_is_reported_then_a_restart_re_enters(agent: FakeAgent) -> None:
    proc = start_worker(agent, RAISING, 30, 10, "ValueError('bad batch')")
    try:
        agent.accept()
        fault = agent.next_of(FaultReport)
        assert (fault.generation, fault.exception) == (0, "builtins.ValueError")
        assert fault.message == "bad batch"
        # the training function's frames, not the wrapper's
        assert fault.traceback.startswith('Traceback (most recent call last):\n  File "<string>"')
        assert "line 8, in train" in fault.traceback
        agent.send(restart_to(1))
        assert agent.next_of(Rejoining).generation == 1
        code, out, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err
    assert out.split() == ["generation", "0", "generation", "1"]


def test_without_a_restart_in_time_the_exception_ends_the_process(agent: FakeAgent) -> None:
    proc = start_worker(agent, RAISING, 0.3, 10, "ValueError('bad batch')")
    try:
        agent.accept()
        assert agent.next_of(FaultReport).message == "bad batch"
        code, _, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1
    assert "ValueError: bad batch" in err


def test_a_stop_notice_ends_the_wait_for_a_restart(agent: FakeAgent) -> None:
    proc = start_worker(agent, RAISING, 600, 10, "ValueError('bad batch')")
    try:
        agent.accept()
        agent.next_of(FaultReport)
        agent.send(b'{"type":"stop_pending","generation":0,"reason":"process restart"}\n')
        code, _, err = finish(proc)  # well before the 600 s wait
    finally:
        proc.kill()
    assert code == 1 and "ValueError: bad batch" in err


def test_an_injected_exception_is_raised_inside_fn_and_reported(agent: FakeAgent) -> None:
    proc = start_worker(agent, LOOPING, 30, 10, 1)
    try:
        agent.accept()
        agent.next_of(ProgressReport)  # train runs: the raise lands inside it
        agent.send(raise_line(0))
        fault = agent.next_of(FaultReport)
        assert fault.exception == "resurge.worker.restart.InjectedFault"
        assert "resurge inject exception" in fault.message
        assert "in train" in fault.traceback
        agent.send(restart_to(1))
        assert agent.next_of(Rejoining).generation == 1
        code, _, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err


def test_an_injection_before_the_function_runs_is_raised_as_it_begins(agent: FakeAgent) -> None:
    proc = start_worker(agent, LOOPING, 30, 10, 1)
    try:
        hello = agent.accept()
        agent.send(raise_line(hello.generation))  # may well come before train is entered
        fault = agent.next_of(FaultReport)
        assert fault.exception == "resurge.worker.restart.InjectedFault"
        agent.send(restart_to(1))
        assert agent.next_of(Rejoining).generation == 1
        code, _, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err


def test_an_injection_for_another_generation_is_ignored(agent: FakeAgent) -> None:
    proc = start_worker(agent, LOOPING, 30, 10, 1)
    try:
        agent.accept()
        agent.next_of(ProgressReport)
        agent.send(raise_line(5))
        agent.send(restart_to(1))
        assert agent.next_of(Rejoining).generation == 1  # no fault came before it
        code, _, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err


def test_a_failed_collective_is_not_reported_when_the_restart_comes_in_grace(
    agent: FakeAgent,
) -> None:
    closed = "RuntimeError('gloo/transport/tcp/pair.cc: Connection closed by peer')"
    proc = start_worker(agent, RAISING, 30, 30, closed)
    try:
        agent.accept()
        agent.send(restart_to(1))
        # rejoining is the first thing after hello: no fault report
        assert isinstance(agent.next(), Rejoining)
        code, _, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err


def test_a_failed_collective_is_reported_after_the_grace(agent: FakeAgent) -> None:
    closed = "RuntimeError('gloo/transport/tcp/pair.cc: Connection closed by peer')"
    proc = start_worker(agent, RAISING, 30, 0.2, closed)
    try:
        agent.accept()
        fault = agent.next()
        assert isinstance(fault, FaultReport) and "Connection closed" in fault.message
        agent.send(restart_to(1))
        assert agent.next_of(Rejoining).generation == 1
        code, _, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err


def test_a_checkpoint_that_failed_on_other_ranks_only_is_a_peers_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    monkeypatch.setenv("RANK", "1")
    peer = RuntimeError("rank 0 left mid-save")
    on_peer = CheckpointException("save", {0: (peer, None)})  # type: ignore[dict-item]
    assert is_collective_failure(on_peer), "rank 0 failed: this rank's save is a consequence"
    on_me = CheckpointException("save", {0: (peer, None), 1: (peer, None)})  # type: ignore[dict-item]
    assert not is_collective_failure(on_me), "this rank failed too: its own fault"
    monkeypatch.delenv("RANK")
    assert not is_collective_failure(on_peer), "without a rank, nothing to tell"
