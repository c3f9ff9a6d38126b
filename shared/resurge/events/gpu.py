"""Node-level telemetry from monitor agents, on ``raw._.<kind>.<node>``, and the one
commands about a node's GPUs the control plane sends its monitor (ResetGpu, CheckNode,
on ``cmd._.<node>``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from resurge.events.envelope import Envelope

__all__ = [
    "CheckNode",
    "GpuError",
    "GpuReading",
    "GpuReset",
    "GpuSample",
    "NodeChecked",
    "NodeReport",
    "ResetGpu",
]


class GpuReading(BaseModel):
    """One GPU's readings at one moment; a field NVML cannot read is null."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="GPU index on the node.")
    uuid: str = Field(description="GPU UUID (GPU-... from NVML; sim-... when simulated).")
    utilization_percent: float | None = Field(default=None, description="Compute utilisation.")
    memory_used_bytes: int | None = Field(default=None, ge=0, description="Memory in use.")
    memory_total_bytes: int | None = Field(default=None, ge=0, description="Memory in all.")
    temperature_c: float | None = Field(default=None, description="Temperature in °C.")
    power_watts: float | None = Field(default=None, description="Power draw in W.")
    ecc_uncorrected: int | None = Field(
        default=None, ge=0, description="Volatile uncorrected ECC errors."
    )
    retired_pages: int | None = Field(
        default=None, ge=0, description="Retired (or pending remapped) memory pages/rows."
    )
    ecc_corrected: int | None = Field(
        default=None, ge=0, description="Volatile corrected (single-bit) ECC errors."
    )
    throttle_reasons: list[str] | None = Field(
        default=None,
        description="Why the clocks are held down now (NVML's throttle reasons: hw_thermal, "
        "sw_thermal, hw_power_brake, sw_power_cap, hw_slowdown, ...); empty: not throttled.",
        examples=[["sw_thermal"]],
    )
    healthy: bool = Field(default=True, description="False once the GPU needs a reset or more.")


class GpuSample(Envelope):
    """A periodic reading of every GPU on a node (may go over core NATS: high rate)."""

    kind: Literal["gpu_sample"] = "gpu_sample"
    gpus: list[GpuReading] = Field(description="One reading per GPU.")
    simulated: bool = Field(default=False, description="True for a local virtual node.")


class GpuError(Envelope):
    """Something went wrong on one GPU: an XID event, the GPU fell off the bus, its
    uncorrected ECC count rose, or a reset of it failed."""

    kind: Literal["gpu_error"] = "gpu_error"
    gpu: int = Field(ge=0, description="GPU index on the node.")
    uuid: str = Field(default="", description="GPU UUID.")
    error: Literal["xid", "fell_off_bus", "ecc", "reset_failed"] = Field(
        description="What kind of error: an XID, a GPU that fell off the bus, a rise in "
        "uncorrected ECC errors, or a reset the restarter asked for that did not bring the "
        "GPU back (the node must be rebooted or replaced)."
    )
    xid: int | None = Field(default=None, ge=0, description="The XID code, for `xid`.")
    message: str = Field(default="", description="Details, in words.")


class NodeReport(Envelope):
    """A node monitor's periodic report of itself (also its heartbeat)."""

    kind: Literal["node_report"] = "node_report"
    slots_total: int = Field(ge=0, description="GPUs (or simulated GPUs) on the node.")
    slots_free: int = Field(ge=0, description="Of those, how many no worker group uses.")
    healthy: bool = Field(description="False when the node should get no work.")
    unhealthy_gpus: list[int] = Field(default_factory=list, description="GPUs that failed.")
    resettable_gpus: list[int] = Field(
        default_factory=list,
        description="Of those, the ones a GPU reset may bring back (their XID asks for "
        "`reset_gpu`), where the cluster resets GPUs (`RESURGE_GPU_RESET`): the jobs on "
        "them restart in place after the reset instead of leaving the node.",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels.")


class ResetGpu(Envelope):
    """Reset GPUs of a node (``nvidia-smi --gpu-reset``) once no process uses them, on
    ``cmd._.<node>``: the restarter's answer to an XID whose action is ``reset_gpu``,
    between stopping the job's workers and starting them again. The monitor answers
    each GPU with a GpuReset whose ``request`` is this command's id. ``job`` and
    ``generation`` name the recovery that asks (the generation it starts)."""

    kind: Literal["reset_gpu"] = "reset_gpu"
    gpus: list[int] = Field(min_length=1, description="Which GPUs (indices on the node).")
    reason: str = Field(default="", description="Why, in words.", examples=["XID 48"])


class GpuReset(Envelope):
    """How a reset asked by ResetGpu went, one per GPU, on ``raw._.gpu_reset.<node>``.
    A failed one is also reported as a GpuError ``reset_failed``."""

    kind: Literal["gpu_reset"] = "gpu_reset"
    request: str = Field(description="The id of the ResetGpu that asked for it.")
    gpu: int = Field(ge=0, description="GPU index on the node.")
    uuid: str = Field(default="", description="GPU UUID.")
    ok: bool = Field(description="Whether the GPU is healthy and in use again.")
    reset: bool = Field(
        default=True, description="False where the GPU needed none (already reset)."
    )
    seconds: float = Field(ge=0, description="From the command to the answer.")
    message: str = Field(default="", description="What was done, in words.")


class CheckNode(Envelope):
    """Check a quarantined node's health, on ``cmd._.<node>``: its monitor resets each GPU
    that awaits a reset, checks that every GPU answers and none is out of use, and runs
    ``RESURGE_NODE_HEALTH_CHECK_COMMAND`` where one is set (``dcgmi diag -r 2``, say).
    The answer is a NodeChecked whose ``request`` is this command's id."""

    kind: Literal["check_node"] = "check_node"
    reason: str = Field(default="", description="Why, in words.")


class NodeChecked(Envelope):
    """How a node's health check (CheckNode) went, on ``raw._.node_checked.<node>``: a
    quarantined node that passes one is released (``resurge node describe`` says so)."""

    kind: Literal["node_checked"] = "node_checked"
    request: str = Field(description="The id of the CheckNode that asked for it.")
    passed: bool = Field(description="Whether the node is fit for work again.")
    reset_gpus: list[int] = Field(
        default_factory=list, description="The GPUs reset by the check, healthy again."
    )
    seconds: float = Field(ge=0, description="From the command to the answer.")
    message: str = Field(default="", description="What was checked and found, in words.")
