"""Commands to one node agent, on ``cmd.<job>.<replica>``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from resurge.contract.vocabulary import RecoveryLevel
from resurge.events.envelope import Envelope

__all__ = [
    "Assign",
    "CheckpointNow",
    "InjectFault",
    "InjectGpuError",
    "RepairNode",
    "ReplicaSlot",
    "RunCommand",
    "Stop",
    "StopFirst",
]


class ReplicaSlot(BaseModel):
    """Where one replica of a generation runs and which global ranks it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replica: int = Field(ge=0, description="Replica index (torchrun's GROUP_RANK).")
    node: str = Field(description="Node the replica runs on.")
    first_rank: int = Field(ge=0, description="Global rank of its local rank 0.")
    nproc: int = Field(ge=1, description="Worker processes in the replica.")


class RunCommand(Envelope):
    """A command to the agent of one run of a job: a job deleted and submitted again
    under its name is a new run, whose agents ignore the commands of the old one."""

    uid: str | None = Field(
        default=None,
        description="The run it is for: the job record's uid (`resurge status JOB --json` "
        "shows it). An agent ignores a command of another run; none: any run's agent "
        "takes it.",
        examples=["5f0c2a9e8b7d4c6f9a1e3b2d4c6f8a0b"],
    )


class StopFirst(BaseModel):
    """What an Assign stops before its generation starts, as a Stop would: where nothing
    happens between the two (no cordon, move, recreated worker group or backoff), a
    restart is one command per replica."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0, description="Workers of this generation or older stop.")
    graceful: bool = Field(default=True, description="SIGTERM first, SIGKILL after the timeout.")
    timeout_seconds: float = Field(default=10.0, gt=0, description="Grace before SIGKILL.")
    hung_ranks: list[int] = Field(
        default_factory=list,
        description="Global ranks judged hung: SIGKILLed at once, without the grace period.",
    )
    reason: str = Field(default="", description="Why, in words.")


class Assign(RunCommand):
    """Start (or restart) this replica's workers as generation ``generation``."""

    kind: Literal["assign"] = "assign"
    generation: int = Field(ge=0, description="The generation the workers must join.")
    world_size: int = Field(ge=1, description="Total worker processes in the job.")
    rank_table: list[ReplicaSlot] = Field(
        description="Every replica of this generation, for a job of up to "
        "64 replicas; above that, this replica's own slot only (the whole table in every "
        "Assign would make one fan-out replicas squared slots: 60 MB at 1,024 replicas). "
        "`replicas` says how many there are."
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        description="Replicas in this generation (GROUP_WORLD_SIZE); none: as many as "
        "the rank table lists.",
    )
    master_addr: str = Field(description="Rendezvous host (MASTER_ADDR).", examples=["127.0.0.1"])
    master_port: int = Field(ge=1, le=65535, description="Rendezvous port, fresh each generation.")
    restart_count: int = Field(
        default=0, ge=0, description="Restarts so far (TORCHELASTIC_RESTART_COUNT)."
    )
    resume_checkpoint: str | None = Field(
        default=None, description="Latest checkpoint every rank completed, if any."
    )
    resume_step: int | None = Field(
        default=None, ge=0, description="Training step that checkpoint holds."
    )
    level: RecoveryLevel | None = Field(
        default=None,
        description="The recovery this generation is part of, if any. `in_process`: workers "
        "running under `resurge.worker.restartable` re-enter their training function "
        "with this generation and keep their processes; where they cannot (a worker "
        "without the wrapper, or one that does not come back within "
        "`rejoin_timeout_seconds`), the agent starts new processes instead. Any other "
        "value, or none: new worker processes.",
    )
    rejoin_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="For an `in_process` restart: how long every local worker has to "
        "confirm it left the old generation before the agent restarts the processes.",
    )
    stop: StopFirst | None = Field(
        default=None,
        description="Stop the replica's workers of an older generation first, as a Stop "
        "command would (sent instead of one where nothing happens between the two).",
    )

    @property
    def group_world_size(self) -> int:
        """How many replicas this generation has."""
        return self.replicas if self.replicas is not None else len(self.rank_table)

    @property
    def whole_table(self) -> bool:
        """Whether the rank table lists every replica (not only this one's slot)."""
        return len(self.rank_table) == self.group_world_size

    def slot(self, replica: int | None) -> ReplicaSlot | None:
        """The slot of ``replica`` in the rank table, if it lists it."""
        return next((s for s in self.rank_table if s.replica == replica), None)


class Stop(RunCommand):
    """Stop this replica's workers of generation ``generation`` (or older)."""

    kind: Literal["stop"] = "stop"
    generation: int = Field(ge=0, description="Workers of this generation or older stop.")
    graceful: bool = Field(default=True, description="SIGTERM first, SIGKILL after the timeout.")
    timeout_seconds: float = Field(default=10.0, gt=0, description="Grace before SIGKILL.")
    final: bool = Field(
        default=False, description="The job is over: the agent exits once its workers stopped."
    )
    hung_ranks: list[int] = Field(
        default_factory=list,
        description="Global ranks judged hung: they cannot act on SIGTERM, so they are "
        "SIGKILLed at once, without the grace period.",
    )
    reason: str = Field(default="", description="Why, in words.")


class CheckpointNow(RunCommand):
    """Ask this replica's workers of generation ``generation`` to save a checkpoint now.

    The agent passes it on to every worker connected through ``resurge.worker``
    (``WorkerRun.checkpoint_requested()``); each reports the checkpoint it saves as
    CheckpointSaved, then holds for ``hold_seconds`` when that is set. Plain scripts are
    left alone. An agent ignores a request for a generation other than the one it runs."""

    kind: Literal["checkpoint_now"] = "checkpoint_now"
    generation: int = Field(ge=0, description="The generation whose workers should save.")
    reason: str = Field(default="", description="Why, in words.", examples=["resize 2 -> 4"])
    hold_seconds: float = Field(
        default=0.0,
        ge=0,
        le=86400,
        description="After a worker reported the checkpoint that answers this request, it "
        "holds (trains no further step) until it is stopped, restarted in-process, or "
        "this many seconds after the request reached it (then it trains on). 0: no hold, "
        "it trains on at once. Asked before a move that stops the generation, so no step "
        "is trained after the checkpoint the job resumes from.",
        examples=[45.0],
    )


class InjectFault(RunCommand):
    """Break a worker on purpose (``resurge inject``), for demos and tests."""

    kind: Literal["inject_fault"] = "inject_fault"
    fault: Literal["crash", "hang", "log", "exception"] = Field(
        description="crash: SIGKILL the worker; hang: SIGSTOP it; log: emit `line` as its "
        "output; exception: raise an exception in its training function (workers under "
        "`resurge.worker.restartable`; others are left alone)."
    )
    local_rank: int = Field(ge=0, description="Which worker of the replica.")
    line: str = Field(default="", description="The log line to emit, for `log`.")


class InjectGpuError(Envelope):
    """Make a simulated GPU report an error (``resurge inject xid``), or show a warning
    sign in its readings from now on (``resurge inject gpu-warning``), on ``cmd._.<node>``.
    Exactly one of ``xid`` and ``warning``."""

    kind: Literal["inject_gpu_error"] = "inject_gpu_error"
    gpu: int = Field(ge=0, description="GPU index on the node.")
    xid: int | None = Field(default=None, ge=0, description="The XID code to raise.", examples=[79])
    warning: Literal["corrected-ecc", "retired-pages", "thermal"] | None = Field(
        default=None,
        description="The warning sign its readings show from now on: the corrected ECC "
        "count rising every sample, retired pages growing every sample, or thermal "
        "throttling on.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> InjectGpuError:
        if (self.xid is None) == (self.warning is None):
            raise ValueError("give exactly one of xid and warning")
        return self


class RepairNode(Envelope):
    """The operator's word that a node was repaired (``resurge node uncordon``), on
    ``cmd._.<node>``: its monitor makes its simulated GPUs healthy again; real (NVML)
    GPUs are left as they are (the monitor's restart reads them afresh)."""

    kind: Literal["repair_node"] = "repair_node"
