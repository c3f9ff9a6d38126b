"""In-process restart: re-enter the training function with a new generation, same process.

Like nvidia-resiliency-ext's in-process ``Wrapper``, for resurge's agent::

    from resurge import worker

    @worker.restartable
    def train(run: worker.WorkerRun, steps: int) -> None:
        dist.init_process_group("gloo")    # RANK, WORLD_SIZE, MASTER_PORT of this generation
        model = DistributedDataParallel(...)
        start = (run.resume_step or 0) + 1 # load run.resume_checkpoint if set
        ...
        gc.collect()
        dist.destroy_process_group()

    if __name__ == "__main__":
        train(steps=1000)                  # calls train(run, steps=1000), again per restart

The contract:

- Without an agent (``RESURGE_AGENT_SOCKET`` unset) calling it calls ``fn(run, ...)``
  once, and that is all.
- Under an agent the worker's ``hello`` says it is restartable, so the agent may
  restart it in-process (``Assign.level == "in_process"``).
- ``fn`` returning ends it: the result is returned and the link closed.
- The agent's ``restart`` while ``fn`` runs raises :class:`RestartRequested` inside
  ``fn`` (a BaseException, so ``except Exception`` does not swallow it) at its next
  Python bytecode; a thread blocked in a collective gets it, or the collective's own
  failure, when a peer tears down its process group. The wrapper then tears down every
  process group (:mod:`resurge.worker.teardown`), applies the new generation's
  environment to ``os.environ``, tells the agent it is ``rejoining``, and calls ``fn``
  again with the same ``run``, whose generation, ranks and resume point are now the new
  generation's. Ranks other than 0 first wait (up to :data:`STORE_WAIT_SECONDS`) until
  ``MASTER_ADDR:MASTER_PORT`` accepts a connection, so torch's store client does not
  back off for half a second because the new store was not up yet (rank 0's agent hosts
  it, up before it restarts its own workers; or rank 0's script, where no agent does).
- ``fn`` raising anything else is a fault: the wrapper reports it to the agent (which
  publishes ``WorkerFault``), tears down the process groups at once (so peers blocked
  on this rank fail fast), and waits up to ``restart_wait_seconds`` (default
  :data:`RESTART_WAIT_SECONDS`) for a restart; none, or a stop notice from the agent
  (a process restart coming), and it re-raises, so the process exits as it would have
  without the wrapper. An exception that looks like a collective failing because a peer
  left is reported only if no restart comes within ``peer_grace_seconds`` (default
  :data:`PEER_GRACE_SECONDS`): it is the consequence of another rank's fault.
  ``KeyboardInterrupt`` and ``SystemExit`` are re-raised at once.
- ``checkpoint_signal``: as :func:`resurge.worker.connect`'s, for the run ``fn`` gets
  (a checkpoint request of the generation running raises it in this process).
- ``resurge inject exception`` raises :class:`InjectedFault` (a RuntimeError) inside
  ``fn``, as if the training code had failed.

What ``fn`` must do: build everything that belongs to a generation (process group,
model, DDP, optimizer, data loaders) inside itself and keep no reference to it outside
(a DDP kept in a global keeps the old process group's connections open); resume from
``run.resume_checkpoint`` / ``run.resume_step``; not close ``run`` (the wrapper does).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Concatenate, Generic, ParamSpec, TypeVar

import resurge.worker as _package
import resurge.worker.interrupt as interrupter_module
from resurge.worker import WorkerRun, _signal_or_none
from resurge.worker.environment import read_environment
from resurge.worker.interrupt import Interrupter
from resurge.worker.teardown import is_collective_failure, teardown_process_groups
from resurge.worker.wire import (
    AgentMessage,
    RaiseCommand,
    RestartCommand,
    StopPending,
    fault_line,
    rejoining_line,
)

__all__ = [
    "PEER_GRACE_SECONDS",
    "RESTART_WAIT_SECONDS",
    "InjectedFault",
    "RestartRequested",
    "Restartable",
]

P = ParamSpec("P")
R = TypeVar("R")

# How long a worker whose training function failed waits for the agent's restart
# before it gives up and exits (detection and the restarter's decision fit well inside).
RESTART_WAIT_SECONDS = 60.0
# How long a worker whose collective failed waits for a restart before it reports the
# failure as its own fault (a peer's fault normally brings the restart well before).
PEER_GRACE_SECONDS = 10.0
# How long a rank other than 0 waits for rank 0's new store before it re-enters anyway.
STORE_WAIT_SECONDS = 5.0


class RestartRequested(BaseException):
    """Raised inside the training function: the agent restarts this worker in-process."""


class InjectedFault(RuntimeError):
    """Raised inside the training function by ``resurge inject exception``."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or ("fault injected by `resurge inject exception`",)))


class Restartable(Generic[P, R]):
    """``fn`` under in-process restarts; call it with ``fn``'s arguments after ``run``."""

    def __init__(
        self,
        fn: Callable[Concatenate[WorkerRun, P], R],
        *,
        restart_wait_seconds: float | None = None,
        peer_grace_seconds: float | None = None,
        checkpoint_signal: int | None = None,
    ) -> None:
        self.fn = fn
        self.checkpoint_signal = _signal_or_none(checkpoint_signal)
        self.restart_wait_seconds = (
            RESTART_WAIT_SECONDS if restart_wait_seconds is None else restart_wait_seconds
        )
        self.peer_grace_seconds = (
            PEER_GRACE_SECONDS if peer_grace_seconds is None else peer_grace_seconds
        )
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", type(self).__name__)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the training function, again in each new generation under an agent; once without."""
        socket_path = read_environment().socket_path
        if socket_path is None:
            run = WorkerRun(None, checkpoint_signal=self.checkpoint_signal)
            try:
                return self.fn(run, *args, **kwargs)
            finally:
                run.close()
        return _Session(self, socket_path).run(*args, **kwargs)


class _Session(Generic[P, R]):
    """One call of a :class:`Restartable` under an agent: every generation it runs."""

    def __init__(self, owner: Restartable[P, R], socket_path: str) -> None:
        self.owner = owner
        self.interrupter = Interrupter()
        self._changed = threading.Condition()
        self._restart: RestartCommand | None = None  # accepted, not yet entered
        # An injected fault that came while no training function ran (before the first
        # one, or between generations): raised as the function is entered.
        self._raise_pending: int | None = None
        # The link thread may hand over a message before WorkerRun below has returned.
        self._constructed = threading.Event()
        self.worker = WorkerRun(
            socket_path,
            in_process=True,
            on_message=self._on_message,
            checkpoint_signal=owner.checkpoint_signal,
        )
        self._newest = self.worker.generation  # newest generation accepted
        self._constructed.set()

    def run(self, *args: P.args, **kwargs: P.kwargs) -> R:
        _package._restartable_run = self.worker
        try:
            while True:
                try:
                    return self.interrupter.call(self._generation, *args, **kwargs)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as error:
                    restart = self._recover(error)
                    if restart is None:
                        raise
                self._enter(restart)
        finally:
            _package._restartable_run = None
            self.worker.close()

    def _generation(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # Interrupts are armed here: a restart accepted from now on interrupts fn, and
        # one accepted before (while the last generation was being left) is seen here.
        with self._changed:
            if self._restart is not None:
                raise RestartRequested
            pending, self._raise_pending = self._raise_pending, None
        if pending is not None and pending == self.worker.generation:
            raise InjectedFault("resurge inject exception: raised as the training function began")
        return self.owner.fn(self.worker, *args, **kwargs)

    # -- the link thread --

    def _on_message(self, message: AgentMessage) -> None:
        self._constructed.wait()
        if isinstance(message, RestartCommand):
            with self._changed:
                if message.generation <= self._newest:
                    return  # a repeat, or one overtaken by a newer restart
                self._newest = message.generation
                self._restart = message
                self._changed.notify_all()
            self.interrupter.interrupt(RestartRequested)
        elif isinstance(message, RaiseCommand):
            with self._changed:
                current = self._restart is None and message.generation == self.worker.generation
                if current and not self.interrupter.armed:
                    self._raise_pending = message.generation
                    return
            if current and not self.interrupter.interrupt(InjectedFault):
                with self._changed:
                    self._raise_pending = message.generation
        elif isinstance(message, StopPending):
            with self._changed:
                self._changed.notify_all()

    # -- the training thread --

    def _recover(self, error: BaseException) -> RestartCommand | None:
        """After ``fn`` raised: the restart to enter, or None to re-raise ``error``."""
        with self._changed:
            restart, self._restart = self._restart, None
        if restart is not None or isinstance(error, RestartRequested):
            _release(error)
            teardown_process_groups()
            return restart or self._await_restart(self.owner.restart_wait_seconds)
        report = _fault_report(self.worker.generation, error)
        consequence = is_collective_failure(error)
        if not consequence:
            self.worker._send(report)
        _release(error)
        teardown_process_groups()
        deadline = time.monotonic() + self.owner.restart_wait_seconds
        if consequence:
            restart = self._await_restart(
                min(self.owner.peer_grace_seconds, self.owner.restart_wait_seconds)
            )
            if restart is not None:
                return restart
            self.worker._send(report)
        return self._await_restart(deadline - time.monotonic())

    def _await_restart(self, seconds: float) -> RestartCommand | None:
        """A restart within ``seconds``; None at the deadline or on a stop notice."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._restart is not None or self.worker.stop_pending, max(seconds, 0.0)
            )
            restart, self._restart = self._restart, None
        return restart

    def _enter(self, restart: RestartCommand) -> None:
        for name in restart.unset:
            os.environ.pop(name, None)
        os.environ.update(restart.environment)
        self.worker._renew()
        self.worker._send(rejoining_line(self.worker.generation, self.worker.rank))
        if self.worker.rank != 0:
            _await_store(os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))


def _await_store(host: str | None, port: str | None) -> None:
    """Until rank 0's store for the new generation accepts connections (at most
    :data:`STORE_WAIT_SECONDS`): torch's store client that finds no server backs off
    for about half a second, which would double an in-process restart."""
    if not host or not port or not port.isdigit():
        return
    deadline = time.monotonic() + STORE_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=0.2):
                return
        except OSError:
            time.sleep(0.005)


def _fault_report(generation: int, error: BaseException) -> bytes:
    kind = type(error)
    name = f"{kind.__module__}.{kind.__qualname__}"
    tb = error.__traceback__
    ours = {__file__, interrupter_module.__file__}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:  # the wrapper's frames
        tb = tb.tb_next
    text = "".join(traceback.format_exception(kind, error, tb))
    return fault_line(generation, name, str(error), text)


def _release(error: BaseException) -> None:
    """Drop the locals of the finished frames ``error``'s tracebacks hold (the model, the
    DDP wrapper), so the process group can be freed; the tracebacks keep their lines."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
