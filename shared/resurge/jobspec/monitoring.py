"""``spec.monitoring``: heartbeats, log rules, stragglers and the GPU policy.

Log rules take HyperPod's ``logMonitoringConfiguration`` fields as they are, plus an
``action`` and the ``ranks`` a rule watches.

Hang detection is on by default. The constants below are its defaults (the hang
detector reads them from here, and docs/jobspec.md explains them):

- with ``heartbeatTimeoutSeconds`` unset, a rank that has reported progress is judged
  by a learned timeout, as NVIDIA's NVRx learns its heartbeat timeouts:
  :data:`LEARNED_TIMEOUT_FACTOR` times the longest gap between two progress reports
  of one rank seen in the job, and never less than :data:`LEARNED_HEARTBEAT_FLOOR_SECONDS`
  (real jobs have slow steps, evaluations and checkpoint saves that report nothing;
  the floor is PyTorch's default NCCL collective timeout, so resurge is never quicker
  to give up than torch itself);
- with ``startupTimeoutSeconds`` unset, the ranks that reported progress in an earlier
  generation must report again in a later one within :data:`LEARNED_TIMEOUT_FACTOR`
  times the longest start-up (process start to first progress) seen in the job, and
  never less than :data:`LEARNED_STARTUP_FLOOR_SECONDS`; the first generation (data
  downloads, compilation) has no start-up limit;
- a rank its agent reports stopped (SIGSTOP, a debugger: it runs no code) while its job
  makes no progress is a hang after :data:`STOPPED_RANK_SECONDS`, whatever the timeouts.

``0`` turns a timeout off; ``heartbeatTimeoutSeconds: 0`` turns hang detection of
progressing ranks off altogether, the stopped-rank check included.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    AliasChoices,
    Field,
    NonNegativeInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from resurge.jobspec._base import SpecModel

__all__ = [
    "LEARNED_HEARTBEAT_FLOOR_SECONDS",
    "LEARNED_STARTUP_FLOOR_SECONDS",
    "LEARNED_TIMEOUT_FACTOR",
    "STOPPED_RANK_SECONDS",
    "GpuPolicy",
    "LogRule",
    "MonitoringSpec",
    "StragglerSpec",
]

LEARNED_TIMEOUT_FACTOR = 5.0  # NVRx's default safety factor over the longest interval seen
LEARNED_HEARTBEAT_FLOOR_SECONDS = 600.0
LEARNED_STARTUP_FLOOR_SECONDS = 600.0
STOPPED_RANK_SECONDS = 2.0

Operator = Literal["gt", "lt", "eq", "gteq", "lteq"]
Action = Literal["restart", "alert"]
XidAction = Literal["restart_process", "reset_gpu", "replace_node", "ignore"]


class LogRule(SpecModel):
    """One log monitoring rule (HyperPod's logMonitoringConfiguration entry)."""

    name: str = Field(min_length=1, description="Rule name, unique within the job.")
    log_pattern: str = Field(
        min_length=1,
        description="Regular expression for the lines the rule looks at; for a metric rule "
        "its first capturing group is the value.",
        examples=[r".*loss: (\d+(\.\d+)?).*"],
    )
    expected_start_cut_off_in_seconds: float | None = Field(
        default=None,
        gt=0,
        description="The first match must come this soon after the workers start, or the "
        "rule sees a hang. Unset: no limit.",
    )
    expected_recurring_frequency_in_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Longest gap between two matches before the rule sees a hang. Unset: no limit.",
    )
    stop_pattern: str | None = Field(
        default=None,
        description="Regular expression for the line after which the rule is off. "
        "Unset: always on.",
    )
    metric_threshold: float | None = Field(
        default=None,
        description="Threshold the captured value is compared with (decimals allowed). "
        "Unset: no metric check. Needs `operator`.",
        examples=[2.5],
    )
    operator: Operator | None = Field(
        default=None,
        description="How the captured value is compared with metricThreshold; the rule "
        "fires when `value <operator> metricThreshold` holds.",
    )
    metric_evaluation_data_points: int = Field(
        default=1,
        ge=1,
        description="Consecutive values that must meet the comparison before the rule fires.",
    )
    fault_on_match: bool = Field(
        default=False, description="Fire as soon as logPattern matches, whatever else is set."
    )
    action: Action = Field(
        default="restart",
        description="What firing does: `restart` reports a fault (recovery follows), "
        "`alert` only reports it.",
    )
    ranks: list[NonNegativeInt] | None = Field(
        default=None,
        min_length=1,
        description="Global ranks whose output the rule watches. Unset: every rank.",
        examples=[[0]],
    )

    @field_validator("log_pattern", "stop_pattern")
    @classmethod
    def _compiles(cls, pattern: str | None, info: ValidationInfo) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            # A repeat count too large for the engine is an OverflowError, nesting too
            # deep a RecursionError: both a bad pattern, never a crash of the caller.
            except (re.error, OverflowError, RecursionError) as error:
                rule = info.data.get("name", "?")
                field = to_camel(info.field_name or "")
                raise ValueError(
                    f"rule {rule!r}: {field} {pattern!r} is not a valid regular expression "
                    f"({error})"
                ) from None
        return pattern

    @model_validator(mode="after")
    def _checks_something(self) -> LogRule:
        rule = f"rule {self.name!r}"
        if (self.metric_threshold is None) != (self.operator is None):
            raise ValueError(f"{rule}: metricThreshold and operator go together: set both")
        if self.metric_threshold is not None and re.compile(self.log_pattern).groups < 1:
            raise ValueError(
                f"{rule}: metricThreshold needs a capturing group in logPattern for the value"
            )
        if (
            self.expected_start_cut_off_in_seconds is None
            and self.expected_recurring_frequency_in_seconds is None
            and self.metric_threshold is None
            and not self.fault_on_match
        ):
            raise ValueError(
                f"{rule} checks nothing: set expectedStartCutOffInSeconds, "
                "expectedRecurringFrequencyInSeconds, metricThreshold or faultOnMatch"
            )
        return self


class StragglerSpec(SpecModel):
    """A rank is a straggler when its mean step time over the last ``windowSteps`` steps
    exceeds ``slowFactor`` times the median over all ranks."""

    enabled: bool = Field(default=False, description="Look for stragglers at all.")
    window_steps: int = Field(
        default=20, ge=1, description="Recent steps whose mean step time is compared."
    )
    slow_factor: float = Field(
        default=1.5,
        gt=1,
        description="A rank is slow when its step time exceeds this times the median of all ranks.",
        examples=[1.5],
    )
    min_steps: int = Field(
        default=10,
        ge=1,
        description="Steps of a generation to skip (warm-up) before any rank is judged.",
    )
    consecutive_windows: int = Field(
        default=2,
        ge=1,
        description="Windows in a row a rank must be slow before it is reported.",
    )
    action: Action = Field(
        default="alert",
        description="`alert` reports the straggler; `restart` also moves its replica away "
        "from the node.",
    )


class GpuPolicy(SpecModel):
    """What the job does about GPU errors: its own actions for chosen XID codes."""

    xid_overrides: dict[NonNegativeInt, XidAction] = Field(
        default_factory=dict,
        description="NVIDIA XID code to action, overriding resurge's built-in XID table.",
        examples=[{"13": "restart_process", "79": "replace_node"}],
    )


class MonitoringSpec(SpecModel):
    """How faults and hangs are detected: timeouts, log rules, stragglers, GPUs."""

    startup_timeout_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Longest wait for a generation's first progress report before it counts "
        "as hung. Unset: no limit in the first generation; in later ones, ranks that "
        f"reported progress before get {LEARNED_TIMEOUT_FACTOR:g} times the longest "
        f"start-up seen, at least {LEARNED_STARTUP_FLOOR_SECONDS:g} s. 0: no limit. A "
        "script that never reports progress is never judged by it.",
        examples=[900.0],
    )
    heartbeat_timeout_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Longest gap between two progress reports of a rank once it has reported "
        f"one. Unset: learned, {LEARNED_TIMEOUT_FACTOR:g} times the longest gap seen in the "
        f"job, at least {LEARNED_HEARTBEAT_FLOOR_SECONDS:g} s. 0: hang detection off "
        "(neither timeouts of progressing ranks nor stopped ranks are reported).",
        examples=[300.0],
    )
    log_rules: list[LogRule] = Field(
        default_factory=list,
        alias="logRules",
        validation_alias=AliasChoices("logRules", "logMonitoringConfiguration"),
        description="Log monitoring rules (HyperPod: logMonitoringConfiguration, accepted "
        "as an alias).",
    )
    straggler: StragglerSpec = Field(
        default_factory=StragglerSpec, description="Straggler detection."
    )
    gpu: GpuPolicy = Field(default_factory=GpuPolicy, description="GPU fault handling.")

    @field_validator("log_rules")
    @classmethod
    def _unique_names(cls, rules: list[LogRule]) -> list[LogRule]:
        names = [rule.name for rule in rules]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"log rule names must be unique: {', '.join(repeated)} repeated")
        return rules
