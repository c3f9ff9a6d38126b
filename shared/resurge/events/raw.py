"""Raw telemetry published by node agents on ``raw.<job>.<kind>.<node>``."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from resurge.events.envelope import Envelope

__all__ = [
    "AgentState",
    "AgentStateChanged",
    "LogLine",
    "ProcessExited",
    "ProcessStarted",
    "ProcessStateChanged",
    "RendezvousPassed",
]


class ProcessStarted(Envelope):
    """A worker process of a replica started (or re-entered its training function)."""

    kind: Literal["process_started"] = "process_started"
    pid: int = Field(description="Operating-system process id of the worker.", examples=[4242])
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    local_world_size: int = Field(ge=1, description="Workers in the replica.")
    in_process: bool = Field(
        default=False,
        description="The same process re-entered its training function for this generation "
        "(an in-process restart): the pid is the one it had before.",
    )


class ProcessExited(Envelope):
    """A worker process ended: its exit code or signal, and whether the agent ended it."""

    kind: Literal["process_exited"] = "process_exited"
    pid: int = Field(description="Operating-system process id of the worker.")
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    local_world_size: int = Field(ge=1, description="Workers in the replica.")
    exit_code: int | None = Field(
        description="Exit status, or null when a signal ended the process.", examples=[1]
    )
    signal: str | None = Field(
        default=None, description="Name of the signal that ended it, if any.", examples=["SIGKILL"]
    )
    expected: bool = Field(
        default=False,
        description="True when the agent itself stopped the worker (a Stop command or shutdown).",
    )

    last_output: list[str] = Field(
        default_factory=list,
        description="The worker's last lines of output (stdout and stderr, oldest first, at "
        "most 20), so a failure explains itself: the traceback or error it printed.",
        examples=[["python: can't open file '/app/nosuch_train.py': [Errno 2] No such file"]],
    )

    @property
    def succeeded(self) -> bool:
        """Whether the worker exited 0."""
        return self.exit_code == 0


class ProcessStateChanged(Envelope):
    """A worker stopped running without exiting (SIGSTOP, a debugger: state T), or ran again.

    The agent samples its workers' states; a stopped worker cannot act on SIGTERM and
    makes no progress, so detectors may blame it for a hang its peers wait on.
    """

    kind: Literal["process_state"] = "process_state"
    pid: int = Field(description="Operating-system process id of the worker.")
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    stopped: bool = Field(
        description="True: the process is stopped (state T or t) and runs no code; "
        "false: it runs again."
    )
    since: datetime = Field(description="When the agent first saw it in this state (UTC).")


class LogLine(Envelope):
    """One line a worker wrote to its stdout or stderr."""

    kind: Literal["log_line"] = "log_line"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    stream: Literal["stdout", "stderr"] = Field(description="Which output stream.")
    line: str = Field(description="One line of output, without its newline; long lines are cut.")


class AgentState(StrEnum):
    """What a replica's agent is doing."""

    WAITING = "waiting"
    RUNNING = "running"
    STOPPING = "stopping"
    IDLE = "idle"
    EXITING = "exiting"
    LOST = "lost"  # published by the node's monitor: the agent died without being told to


class AgentStateChanged(Envelope):
    """A replica's agent changed state (``lost``: its node's monitor saw it die)."""

    kind: Literal["agent_state"] = "agent_state"
    state: AgentState = Field(description="What the agent is doing now.")
    detail: str = Field(default="", description="Why, in words.")


class RendezvousPassed(Envelope):
    """Every rank of a generation passed its rendezvous (``init_process_group``).

    Published by the agent that hosts the generation's rendezvous store (the replica
    holding rank 0; workers get ``TORCHELASTIC_USE_AGENT_STORE=True``, as under torchrun's
    agent), once ``world_size`` ranks have joined it. A sign of life that needs nothing
    from the training script: the generation started, so a fault after this is a new
    incident, not the restart failing.
    """

    kind: Literal["rendezvous_passed"] = "rendezvous_passed"
    world_size: int = Field(ge=1, description="Ranks that joined: the generation's world size.")
