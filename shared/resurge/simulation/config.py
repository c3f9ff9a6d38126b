"""The simulator's configuration: one YAML document, every field checked.

:func:`load_config` reads a file and :func:`parse_config` a mapping; both raise
:class:`ConfigError` naming the bad field by its path (``policies[0].recovery.levels``)
for anything unknown, missing or out of range. Every field but ``cluster.nodes`` has a
default (:mod:`.defaults`); docs/simulation.md lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from resurge.contract.vocabulary import RecoveryLevel
from resurge.jobspec.recovery import RecoverySpec
from resurge.simulation.costs import CostParts, Pricing
from resurge.simulation.defaults import DEFAULT_COSTS, DEFAULT_FAILURES, DEFAULT_POLICIES

__all__ = [
    "BadNodes",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "FailureKind",
    "PeerRecoveryConfig",
    "PolicyConfig",
    "QuarantineConfig",
    "SimulationConfig",
    "TraceJob",
    "load_config",
    "parse_config",
]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BadNodes(_Model):
    """A few bad nodes: ``fraction`` of the nodes fail ``rate_multiplier`` times as often
    as the others by every kind that counts against a node, the fleet's mean rate held
    at the config's (:mod:`.node_health`)."""

    fraction: float = Field(gt=0, lt=1, description="Share of the nodes that are bad.")
    rate_multiplier: float = Field(
        default=20.0, ge=1, description="A bad node's failure rate over a good node's."
    )


class ClusterConfig(_Model):
    """Nodes, GPUs on each, how many of the nodes are held empty as spares, and whether a
    few of them are bad."""

    nodes: int = Field(ge=1, description="Nodes in all, spares included.")
    gpus_per_node: int = Field(default=8, ge=1)
    spares: int = Field(default=0, ge=0, description="Nodes held empty for node recoveries.")
    bad_nodes: BadNodes | None = Field(
        default=None, description="None: every node fails at the same rates."
    )

    @model_validator(mode="after")
    def _room_for_a_job(self) -> ClusterConfig:
        if self.spares >= self.nodes:
            raise ValueError(f"spares ({self.spares}) must be fewer than nodes ({self.nodes})")
        return self


class FailureKind(_Model):
    """One kind of failure: how often, what it takes down, how soon it is seen, the
    cheapest rung that fixes it, and (for a node) how long the node is away."""

    per_1000_node_days: float = Field(ge=0)
    scope: Literal["process", "node"]
    detection_seconds: float = Field(default=0.0, ge=0)
    lowest_rung: RecoveryLevel = RecoveryLevel.PROCESS
    repair_hours: float = Field(default=24.0, ge=0)
    attributed: bool | None = Field(
        default=None,
        description="Whether a fault of this kind counts against its node (a bad node's "
        "multiplier, its score); unset: a node-scope kind does, a process-scope one does not.",
    )
    predictable_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of this kind's faults on a node that warning signs announce: a "
        "policy with proactive_moves moves its job off the node first.",
    )

    @property
    def counts_against_node(self) -> bool:
        """Whether a fault of this kind is attributed to its node."""
        return self.scope == "node" if self.attributed is None else self.attributed


class CheckpointConfig(_Model):
    """Checkpoint every ``interval_minutes`` of training; each write stops training
    ``write_seconds``."""

    interval_minutes: float = Field(default=30.0, gt=0)
    write_seconds: float = Field(default=30.0, ge=0)


class PeerRecoveryConfig(_Model):
    """Checkpointless recovery: the job snapshots its state to memory every step and a
    restart resumes from the newest step live in its nodes' memory, falling back to the
    disk checkpoint only when some state has no copy left (:mod:`.peer_copies`)."""

    state: Literal["replicated", "sharded"] = Field(
        default="replicated",
        description="replicated (DDP: every replica holds all of it; lost only with every "
        "replica's memory) or sharded (FSDP, ZeRO: each replica's shard is also held by a "
        "buddy, the next replica in a ring of nodes; lost with a replica and its buddy).",
    )
    snapshot_overhead: float = Field(
        default=0.02,
        ge=0,
        description="Per-step cost of the snapshots: a step takes (1 + this) times as long.",
    )
    state_mb: float | None = Field(
        default=None,
        ge=0,
        description="State per replica that a new one fetches from peers; unset: the cost "
        "model's state per GPU, each GPU fetching its own at the same time.",
    )
    bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Gigabits per second of one peer-to-peer transfer; unset: the cost "
        "model's network per GPU.",
    )
    recreated_groups_keep_memory: bool = Field(
        default=False,
        description="What if a worker group recreated on its node (the pod and job rungs) "
        "found its predecessor's snapshots: resurge's launch agent gives it a new folder "
        "and removes the old one, so by default a recreated group's memory is lost.",
    )

    def restore_seconds(self, costs: CostParts) -> float | None:
        """The peer transfer of one replica's state where ``state_mb`` or
        ``bandwidth_gbps`` is set (the other from ``costs``); None: the cost model's."""
        if self.state_mb is None and self.bandwidth_gbps is None:
            return None
        mb = self.state_mb if self.state_mb is not None else costs.state_gb_per_gpu * 1000.0
        gbps = self.bandwidth_gbps or costs.network_gbps_per_gpu
        return mb * 8.0 / (gbps * 1000.0)


class QuarantineConfig(_Model):
    """A node's score: each fault attributed to it adds 1, the sum halving every
    ``half_life_hours``; at ``threshold`` the node is quarantined: it leaves the pool (a
    job there moves off at the node rung) for ``hours`` from that fault, then comes back
    after a health check, truly fixed with ``fixed_probability``. ``dry_run``: scores are
    kept and quarantines counted, nothing is done."""

    threshold: float = Field(default=1.5, gt=0)
    half_life_hours: float = Field(default=168.0, gt=0)
    hours: float = Field(
        default=72.0, ge=0, description="Out of the pool (its repair included, if longer)."
    )
    fixed_probability: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A node back from quarantine fails as a good node does from then on; "
        "else as it did before.",
    )
    dry_run: bool = False


class PolicyConfig(_Model):
    """One policy to compare: a job's ``spec.recovery`` block as in its YAML (the
    restarter's ladder and limits), whether its workers come from a fork server, cost
    parts and whole-rung restart seconds that differ from the config's, checkpointless
    recovery from live copies (one-job runs), a node quarantine and proactive moves
    off nodes whose fault is predicted (one-job runs), and, for trace runs, whether jobs
    are elastic (else each is held at its ``min``)."""

    name: str = Field(min_length=1)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    fork_server: bool = True
    costs: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    restart_seconds: dict[RecoveryLevel, NonNegativeFloat] = Field(default_factory=dict)
    checkpoint: CheckpointConfig | None = None
    peer_recovery: PeerRecoveryConfig | None = None
    quarantine: QuarantineConfig | None = None
    proactive_moves: bool = Field(
        default=False,
        description="A predicted fault (failures.<kind>.predictable_fraction) costs a "
        "checkpoint and a node move before it, not a crash.",
    )
    elastic: bool = True

    @field_validator("costs")
    @classmethod
    def _known_parts(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(CostParts.model_fields))
        if unknown:
            raise ValueError(f"not a cost part: {', '.join(unknown)}")
        return value


class TraceJob(_Model):
    """A job of a trace: when it arrives and leaves (hours from the start), its replicas
    (``min_replicas`` to ``max_replicas``; equal for a fixed-size job), GPUs per replica
    (default: a whole node) and priority."""

    name: str = Field(min_length=1)
    start_hours: float = Field(default=0.0, ge=0)
    hours: float = Field(gt=0)
    min_replicas: int = Field(ge=1)
    max_replicas: int | None = Field(default=None, ge=1)
    nproc: int | None = Field(default=None, ge=1)
    priority: int = 0

    @model_validator(mode="after")
    def _max_not_below_min(self) -> TraceJob:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})"
            )
        return self

    @property
    def upper(self) -> int:
        """The most replicas it runs with."""
        return self.max_replicas or self.min_replicas


class SimulationConfig(_Model):
    """A whole simulation: the cluster, its failures, checkpoints, restart costs, the
    policies to compare and, for elastic runs, a job trace (without one, a single
    fixed-size job runs on every node but the spares)."""

    seed: int = 0
    days: float = Field(default=30.0, gt=0)
    cluster: ClusterConfig
    failures: dict[str, FailureKind] = Field(
        default_factory=lambda: {
            name: FailureKind.model_validate(kind) for name, kind in DEFAULT_FAILURES.items()
        }
    )
    failure_rate_scale: float = Field(default=1.0, ge=0)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    step_seconds: float = Field(default=10.0, gt=0)
    costs: CostParts = DEFAULT_COSTS
    restart_seconds: dict[RecoveryLevel, NonNegativeFloat] = Field(default_factory=dict)
    policies: list[PolicyConfig] = Field(
        default_factory=lambda: [PolicyConfig.model_validate(p) for p in DEFAULT_POLICIES],
        min_length=1,
    )
    trace: list[TraceJob] | None = None
    decision_seconds: float = Field(default=60.0, gt=0)

    @field_validator("costs", mode="before")
    @classmethod
    def _over_default_costs(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {**DEFAULT_COSTS.model_dump(), **value}
        return value

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, value: list[PolicyConfig]) -> list[PolicyConfig]:
        names = [p.name for p in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"policy names must be unique: {', '.join(twice)} repeated")
        return value

    @model_validator(mode="after")
    def _spares_fit(self) -> SimulationConfig:
        for i, policy in enumerate(self.policies):
            if policy.recovery.spares > self.cluster.spares:
                raise ValueError(
                    f"policies[{i}].recovery.spares ({policy.recovery.spares}) is more than "
                    f"cluster.spares ({self.cluster.spares}), the nodes the job leaves free"
                )
            if self.trace is None:
                continue
            one_job = ("peer_recovery", "quarantine", "proactive_moves")
            for name in one_job:
                if getattr(policy, name):
                    raise ValueError(
                        f"policies[{i}].{name} is modelled in one-job runs only, not with a trace"
                    )
        if self.trace is not None and self.cluster.bad_nodes is not None:
            raise ValueError("cluster.bad_nodes is modelled in one-job runs only, not with a trace")
        return self

    def restart_cost(self, policy: PolicyConfig, ranks: int | None = None) -> Pricing:
        """How ``policy`` prices a restart of ``ranks`` ranks (default: the one-job run's
        job): the cost model over the config's parts with the policy's, except rungs
        whose whole ``restart_seconds`` the config or the policy sets."""
        if ranks is None:
            ranks = (self.cluster.nodes - self.cluster.spares) * self.cluster.gpus_per_node
        return Pricing(
            parts=self.costs.model_copy(update=policy.costs),
            ranks=ranks,
            fork_server=policy.fork_server,
            fixed={**self.restart_seconds, **policy.restart_seconds},
        )

    def checkpoint_of(self, policy: PolicyConfig) -> CheckpointConfig:
        """The checkpoint settings ``policy`` runs with."""
        return policy.checkpoint or self.checkpoint


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_config(data: Any, source: str = "config") -> SimulationConfig:
    """The :class:`SimulationConfig` of ``data`` (a parsed YAML document)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return SimulationConfig.model_validate(data)
    except ValidationError as error:
        problems = [
            f"{_where(tuple(e['loc']))}: {e['msg']}"
            for e in error.errors(include_url=False, include_context=False)
        ]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def load_config(path: Path) -> SimulationConfig:
    """Read and check the YAML config at ``path``."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"{path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not YAML: {error}") from None
    return parse_config(data, str(path))
