"""``resurge.worker``: what a training script may use from resurge (standard library only).

A script that never imports this still runs under resurge, as under torchrun. One that
does gets heartbeats, checkpoint discovery and, under :func:`restartable`, in-process
restarts::

    from resurge import worker

    run = worker.connect()            # no-op client when not under a resurge agent
    start = run.resume_step or 0      # the step of the latest checkpoint every rank has
    path = run.resume_checkpoint      # where it is (None: start fresh)
    for step in range(start + 1, steps + 1):
        ...
        run.progress(step, loss=float(loss))
        if run.checkpoint_due(step):   # spec.checkpoint's interval, or a request
            save(run.checkpoint_dir, step) # spec.checkpoint.dir, or a folder of the job's
            run.checkpoint_saved(step, path_of(step))
        if run.stop_pending:          # the agent announced a stop or resize
            ...
    run.close()

Where and how often: ``run.checkpoint_dir`` is the job's ``spec.checkpoint.dir``, else
a folder of the job's own (``checkpoints/<job>`` in the local cluster's state folder, or
in the working directory on Kubernetes), from ``RESURGE_CHECKPOINT_DIR``, which a plain
script reads too; ``run.checkpoint_due(step)`` is true when ``intervalSteps`` or
``intervalSeconds`` comes round, or a checkpoint was requested. Outside an agent the
folder is None unless that variable is set.

Checkpoint requests: before a resize the control plane asks the running generation's
workers to save a checkpoint now (``CheckpointNow``). ``run.checkpoint_requested()`` is
true once for each request (it clears on returning true, and ``checkpoint_saved`` clears
it too); poll it once per step and save at once when it is, then report with
``checkpoint_saved`` as usual. Ranks see a request at slightly different steps: where
saving is collective, agree first (an all-reduce of the flag). A request counts only for
the generation it names (an in-process restart drops one not yet answered), and without
an agent there is none. Scripts that already save on a signal (HyperPod's convention:
SIGUSR1 means "save a checkpoint") opt in with
``worker.connect(checkpoint_signal=signal.SIGUSR1)`` (or the same keyword on
:func:`restartable`): the library then also raises that signal in its own process for
each request (Python runs the handler in the main thread), so the script's handler runs
unchanged; while the signal has no handler (its default action, or ignored) it is not
raised, and a line on stderr says so.

Holding for a move: a request made before the generation is stopped (its node's jobs
moved off it) asks the worker to hold after saving. Its ``checkpoint_saved`` for the
first checkpoint after the request then blocks, with no collective in flight, until the
stop ends the process, an in-process restart comes (raised in the training function as
usual), or the request's ``hold_seconds`` pass (the move never came: it returns and
training goes on); a line on stderr says when it holds and when it trains on. So the job
resumes at the step after the one it saved and trains no step twice. See
:mod:`resurge.worker.hold`.

Reports never block training: they are queued for a background thread, and a missing
or dead agent only turns them into no-ops. Arguments are checked the same way with or
without an agent (ValueError), so a script that runs by hand runs under resurge.

In-process restart: run the training function under :func:`restartable` (see
:mod:`resurge.worker.restart` for the contract)::

    @worker.restartable
    def train(run: worker.WorkerRun) -> None:
        dist.init_process_group("gloo")   # this generation's RANK, WORLD_SIZE, MASTER_PORT
        ...                               # build the model, resume from run.resume_step
        dist.destroy_process_group()

    train()   # re-enters train(run) for every in-process restart; no process exits

Delivery: progress is best-effort (when too many wait, the oldest are dropped);
checkpoint reports are never dropped while the process lives, and ``close()``, also
run at interpreter exit, sends what is queued for up to a second. A process killed by
a signal without a handler skips that. The wire protocol is in
:mod:`resurge.worker.wire`.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from resurge.worker.environment import read_environment
from resurge.worker.hold import Hold
from resurge.worker.link import AgentLink
from resurge.worker.wire import (
    AgentMessage,
    CheckpointRequest,
    ProtocolError,
    RestartCommand,
    StopPending,
    checkpoint_line,
    hello_line,
    parse_agent_message,
    progress_line,
)

if TYPE_CHECKING:
    from resurge.worker.protect import ProtectedState, Stateful
    from resurge.worker.restart import Restartable

__all__ = ["WorkerRun", "connect", "restartable"]

P = ParamSpec("P")
R = TypeVar("R")

CLOSE_TIMEOUT_SECONDS = 1.0


class WorkerRun:
    """This worker's link to its agent; a no-op link when ``socket_path`` is None.

    Ranks, generation and resume point come from the environment (see
    :mod:`resurge.worker.environment`). Call :func:`connect` once per process; its
    methods may be called from any thread.
    """

    def __init__(
        self,
        socket_path: str | None,
        *,
        in_process: bool = False,
        on_message: Callable[[AgentMessage], None] | None = None,
        checkpoint_signal: int | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.in_process = in_process
        self.stop_reason: str | None = None
        self.checkpoint_signal = checkpoint_signal
        self.checkpoint_reason: str | None = None
        self._stop = threading.Event()
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_asked = False
        self._hold = Hold()
        self._on_message = on_message
        self._pid = os.getpid()
        self._closed = False
        self._link: AgentLink | None = None
        self._read_place()
        if socket_path:
            self._link = AgentLink(socket_path, self._hello(), self._on_agent_line)
            atexit.register(self.close)

    def _read_place(self) -> None:
        env = read_environment()
        self.generation = env.generation
        self.rank = env.rank
        self.local_rank = env.local_rank
        self.resume_checkpoint: str | None = env.resume_checkpoint
        self.resume_step: int | None = env.resume_step
        self.checkpoint_dir: str | None = env.checkpoint_dir
        self.checkpoint_interval_steps: int | None = env.checkpoint_interval_steps
        self.checkpoint_interval_seconds: float | None = env.checkpoint_interval_seconds
        self._saved_at = time.monotonic()

    def _hello(self) -> bytes:
        return hello_line(
            local_rank=self.local_rank,
            rank=self.rank,
            pid=self._pid,
            generation=self.generation,
            in_process=self.in_process,
        )

    def _renew(self) -> None:
        """Take the place the environment now names (after an in-process restart)."""
        self._read_place()
        self.stop_reason = None
        self._stop.clear()
        with self._checkpoint_lock:  # a request was for the generation just left
            self._checkpoint_asked = False
        self._hold.release()
        if self._link is not None:
            self._link.set_hello(self._hello())

    def _send(self, line: bytes) -> None:
        """Queue a line that must not be dropped (restart protocol messages)."""
        if self._active() and self._link is not None:
            self._link.send(line, droppable=False)

    @property
    def connected(self) -> bool:
        """True while a connection to the agent is open."""
        return self._link is not None and self._link.connected and not self._closed

    @property
    def stop_pending(self) -> bool:
        """True once the agent announced that this generation is about to be stopped."""
        return self._stop.is_set()

    @property
    def checkpoint_signal(self) -> signal.Signals | None:
        """The signal raised in this process for each checkpoint request (None: none)."""
        return self._checkpoint_signal

    @checkpoint_signal.setter
    def checkpoint_signal(self, value: int | None) -> None:
        self._checkpoint_signal = _signal_or_none(value)

    def checkpoint_requested(self) -> bool:
        """True when the agent asked for a checkpoint since the last call that returned
        true and since the last :meth:`checkpoint_saved`; returning true clears it.
        ``checkpoint_reason`` says why the latest request came."""
        with self._checkpoint_lock:
            asked, self._checkpoint_asked = self._checkpoint_asked, False
        return asked

    def checkpoint_due(self, step: int) -> bool:
        """Whether to save a checkpoint after ``step``: the job's
        ``spec.checkpoint.intervalSteps`` divides it, ``intervalSeconds`` passed since the
        last :meth:`checkpoint_saved` (or the start), or :meth:`checkpoint_requested`.
        With no interval in the spec and no request: False."""
        every, seconds = self.checkpoint_interval_steps, self.checkpoint_interval_seconds
        if self.checkpoint_requested():
            return True
        if every is not None and step % every == 0:
            return True
        return seconds is not None and time.monotonic() - self._saved_at >= seconds

    @property
    def dropped_progress(self) -> int:
        """Progress reports dropped because too many waited to be sent."""
        return 0 if self._link is None else self._link.dropped

    def progress(self, step: int, **metrics: float) -> None:
        """Report that ``step`` (an int >= 0) is done, with numeric metrics (NaN and
        infinities are left out)."""
        line = progress_line(step, dict(metrics))
        if self._active() and self._link is not None:
            self._link.send(line, droppable=True)

    @property
    def holding(self) -> bool:
        """True while :meth:`checkpoint_saved` holds for a move (see the module's doc)."""
        return self._hold.holding

    def checkpoint_saved(self, step: int, path: str | os.PathLike[str]) -> None:
        """Report that this rank's part of the checkpoint of ``step`` is at ``path``.

        Answering a request that asked for a hold, it then holds: it returns once the
        hold ends without a stop or a restart (see the module's doc)."""
        line = checkpoint_line(step, path)
        self._saved_at = time.monotonic()
        with self._checkpoint_lock:
            self._checkpoint_asked = False
        if self._active() and self._link is not None:
            self._link.send(line, droppable=False)
            self._hold_after(step)

    def _hold_after(self, step: int) -> None:
        def say(words: str) -> None:
            print(f"resurge.worker: rank {self.rank}: {words}", file=sys.stderr, flush=True)

        held = self._hold.wait(
            lambda seconds: say(
                f"holding after the checkpoint of step {step} ({self.checkpoint_reason}) "
                f"until this generation is stopped or restarted, at most {seconds:.1f} s"
            )
        )
        if held is not None and not held[1]:
            say(f"no stop or restart within {held[0]:.1f} s: training on after step {step}")

    def protect(
        self,
        *,
        sharded: bool = False,
        every: int | None = None,
        rng: bool = True,
        **objects: Stateful,
    ) -> ProtectedState:
        """Register what must survive a fault (``model=..., optimizer=...``: anything with
        ``state_dict()`` and ``load_state_dict()``), for snapshots to the node's memory
        and a resume from peers; see :mod:`resurge.worker.protect` (imported only here,
        so torch is not imported before a script asks for it)."""
        from resurge.worker.protect import ProtectedState

        return ProtectedState(self, objects, sharded=sharded, every=every, rng=rng)

    def close(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Send what is queued (waiting ``timeout`` seconds at most), then disconnect.

        Idempotent; reports after it are checked, then dropped.
        """
        if self._closed:
            return
        self._closed = True
        self._hold.release()
        atexit.unregister(self.close)
        if self._link is not None and os.getpid() == self._pid:
            self._link.close(timeout)

    def _active(self) -> bool:
        # A forked child (a data loader worker) has a copy of this object but no thread.
        return not self._closed and os.getpid() == self._pid

    def _on_agent_line(self, line: bytes) -> None:
        try:
            message = parse_agent_message(line)
        except ProtocolError:
            return  # from a newer agent, perhaps: ignore what we do not know
        if (
            isinstance(message, StopPending)
            and message.generation >= self.generation
            and not self._stop.is_set()
        ):
            self.stop_reason = message.reason
            self._stop.set()
        if isinstance(message, CheckpointRequest) and message.generation == self.generation:
            self._hold.ask(message.hold_seconds)  # before the flag the training thread reads
            self._checkpoint_requested(message.reason)
        if self._on_message is not None:
            self._on_message(message)
        if isinstance(message, RestartCommand) and message.generation > self.generation:
            # After the hook: under `restartable` the restart's exception is pending in
            # the training thread by now, and lands as the hold lets it go.
            self._hold.release()

    def _checkpoint_requested(self, reason: str) -> None:
        with self._checkpoint_lock:
            self._checkpoint_asked = True
            self.checkpoint_reason = reason
        number = self._checkpoint_signal
        if number is None or not self._active():
            return
        if signal.getsignal(number) in (signal.SIG_DFL, signal.SIG_IGN):
            # Raising it would end the process (or do nothing): say so instead.
            print(
                f"resurge.worker: a checkpoint was requested ({reason}), but {number.name} "
                "has no handler; not raising it",
                file=sys.stderr,
                flush=True,
            )
            return
        os.kill(self._pid, number)


def _signal_or_none(value: int | None) -> signal.Signals | None:
    """``value`` as a signal; ValueError when it names none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"checkpoint_signal must be a signal number, not {value!r}")
    try:
        return signal.Signals(value)
    except ValueError:
        raise ValueError(f"checkpoint_signal {value!r} is not a signal") from None


# The run of the training function running under `restartable`, which `connect` returns.
_restartable_run: WorkerRun | None = None


def connect(*, checkpoint_signal: int | None = None) -> WorkerRun:
    """Link to the agent named by ``RESURGE_AGENT_SOCKET`` (a no-op link without one).

    ``checkpoint_signal`` (e.g. ``signal.SIGUSR1``): also raise it in this process for
    each checkpoint request. Inside a function running under :func:`restartable` it
    returns that function's run (setting its ``checkpoint_signal`` when one is given).
    """
    if _restartable_run is not None:
        if checkpoint_signal is not None:
            _restartable_run.checkpoint_signal = checkpoint_signal
        return _restartable_run
    return WorkerRun(read_environment().socket_path, checkpoint_signal=checkpoint_signal)


def restartable(
    fn: Callable[Concatenate[WorkerRun, P], R],
    *,
    restart_wait_seconds: float | None = None,
    peer_grace_seconds: float | None = None,
    checkpoint_signal: int | None = None,
) -> Restartable[P, R]:
    """``fn`` made restartable in-process: calling the result calls ``fn(run, ...)``.

    Usable as a decorator. The arguments and their defaults are described in
    :mod:`resurge.worker.restart` (imported only here, so ``import resurge.worker``
    stays light); ``checkpoint_signal`` is :func:`connect`'s.
    """
    from resurge.worker.restart import Restartable

    return Restartable(
        fn,
        restart_wait_seconds=restart_wait_seconds,
        peer_grace_seconds=peer_grace_seconds,
        checkpoint_signal=checkpoint_signal,
    )
