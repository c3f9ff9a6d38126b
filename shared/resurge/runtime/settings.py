"""Settings every service reads once at start (pydantic-settings, prefix ``RESURGE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from resurge.contract.subjects import Subjects
from resurge.jobspec.accelerator import ACCELERATOR_PATTERN

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Common settings; a service subclasses this for its own."""

    model_config = SettingsConfigDict(env_prefix="RESURGE_", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated."
    )
    namespace: str = Field(
        default="resurge", description="First subject token; separates clusters on one server."
    )
    nats_credentials: Path | None = Field(
        default=None,
        description="A credentials file (mode 0600) to connect to NATS with: JSON with "
        "'user' and 'password' (`resurge up` writes one per role into the state folder), "
        "or a NATS user's decorated .creds file (user JWT and nkey seed).",
    )
    nats_creds: SecretStr | None = Field(
        default=None,
        description="A NATS user's decorated .creds text (user JWT and nkey seed) to "
        "connect with, e.g. a Kubernetes Secret's key; before nats_credentials.",
    )
    nats_user: str | None = Field(
        default=None, description="NATS user (instead of a credentials file)."
    )
    nats_password: SecretStr | None = Field(default=None, description="NATS password of nats_user.")
    nats_tls_ca: Path | None = Field(
        default=None,
        description="CA certificate to verify the NATS server with; set, the connection is TLS.",
    )
    nats_tls_cert: Path | None = Field(
        default=None,
        description="Certificate this party presents (a client certificate; the embedded "
        "server's own one under `resurge up`).",
    )
    nats_tls_key: Path | None = Field(default=None, description="Private key of nats_tls_cert.")
    connect_timeout_seconds: float = Field(
        default=30.0, gt=0, description="How long to retry the first connection to NATS."
    )
    nats_ping_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often the connection to NATS is pinged; 2 pings unanswered "
        "(at most 3 intervals) end it as dead, and it reconnects, so a half-open "
        "connection (a network partition, a dead NAT entry) is found in seconds, not "
        "minutes (nats.py pings every 2 minutes by default).",
    )
    metrics_host: str = Field(
        default="127.0.0.1", description="Address of /metrics, /livez and /readyz."
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of /metrics, /livez and /readyz; 0 picks a free one, unset turns it off.",
    )
    cluster: Literal["local", "kubernetes"] = Field(
        default="local",
        description=(
            "Cluster backend jobs run on: 'local' (virtual nodes as JetStream KV records) "
            "or 'kubernetes' (nodes, pods and TrainingJobs of the cluster this runs in, or "
            "of the current KUBECONFIG context)."
        ),
    )
    kube_namespace: str = Field(
        default="default",
        description="Kubernetes: the install's own namespace: its Leases are there, and a "
        "TrainingJob there keeps its name on the bus (one in any other namespace is "
        "'<namespace>/<name>' there, e.g. in `resurge status`).",
    )
    kube_namespaces: str = Field(
        default="",
        pattern=r"^\s*([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\s*(,\s*|$))*$",
        description="Kubernetes: the namespaces whose TrainingJobs resurge runs, "
        "comma-separated; empty: every namespace. A job's pods, Service, Events and "
        "status are in its own namespace.",
    )
    kube_image: str = Field(
        default="resurge:latest",
        description="Kubernetes: image of a job's pods when its spec names none (it must "
        "have resurge and the training script installed).",
    )
    kube_host_network: bool = Field(
        default=False,
        description="Kubernetes: run a job's pods on the host network, so ranks reach each "
        "other at the node's address (as NCCL jobs on RDMA nodes often do; Pod Security "
        "'baseline' refuses it). Off: the pod network, each pod a DNS name through the "
        "job's headless Service, MASTER_ADDR replica 0's. A job's pod template may set "
        "spec.hostNetwork itself, which wins. Read as a job is submitted: a running job "
        "keeps its network.",
    )
    kube_accelerator: str = Field(
        default="nvidia.com/gpu",
        pattern=ACCELERATOR_PATTERN,
        description="Kubernetes: the extended resource a node's slots count (its "
        "allocatable of it; a node that has none offers what its monitor reports). A "
        "job's pods request the accelerator its spec names (spec.accelerator or its "
        "template's resources; none for a CPU-only job); a job naming another than this "
        "gets no pods (PodsRefused), as its slots would be counted in another resource.",
    )
    kube_disruption_budgets: bool = Field(
        default=True,
        description="Kubernetes: give each TrainingJob a PodDisruptionBudget that allows no "
        "eviction of its worker pods, so kubectl drain, Karpenter and cluster upgrades "
        "(the Eviction API) wait while resurge checkpoints the job and moves it off the "
        "node (docs/nodes.md, Drains others start). Off: none is made; one made before "
        "goes with its TrainingJob.",
    )
    kube_agent_secret: str | None = Field(
        default=None,
        description="Kubernetes: the Secret (in kube_namespace) whose 'user' and 'password' "
        "keys are the agent role's NATS user; a job's pods get them as RESURGE_NATS_USER "
        "and RESURGE_NATS_PASSWORD. Unset: the pods connect without a user.",
    )
    kube_nats_account: str | None = Field(
        default=None,
        description="Kubernetes, NATS in operator mode: the public key (A...) of "
        "resurge's NATS account. With kube_nats_signer, the controller gives every pod it "
        "creates a NATS user of its own (docs/security.md, Credentials), and "
        "kube_agent_secret is not used.",
    )
    kube_nats_signer: SecretStr | None = Field(
        default=None,
        description="Kubernetes, NATS in operator mode: the seed (SA...) of a signing key of "
        "kube_nats_account, with which the controller signs each pod's user JWT: allowed "
        "only its job's events on its node and its job's commands.",
    )
    kube_nats_credentials_seconds: int = Field(
        default=3600,
        ge=10,
        description="Kubernetes, NATS in operator mode: how long a pod's user JWT is valid. "
        "Its agent asks the controller for a new one when half of it is left.",
    )
    kube_lease_name: str = Field(
        default="resurge-controller",
        description="Kubernetes: the coordination.k8s.io Lease (in kube_namespace) that "
        "elects the one scaler that runs the controller and writes the jobs' statuses; "
        "the other scalers stand by.",
    )
    kube_lease_seconds: int = Field(
        default=15,
        ge=2,
        description="Kubernetes: the Lease's duration. The leader renews it every "
        "2/15 of this and stops leading when it could not renew within 2/3 of it; a "
        "standby takes over once the Lease has gone unrenewed this long by its own clock "
        "(at most this plus 2/15 of it after the leader died).",
    )
    log_level: str = Field(default="INFO", description="Root log level.")
    log_format: str = Field(default="json", description="'json' or 'text'.")
    stream_max_age_seconds: float = Field(
        default=24 * 3600, gt=0, description="Retention of the durable streams."
    )
    raw_max_age_seconds: float = Field(
        default=3600, gt=0, description="Retention of the raw telemetry stream."
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Copies of every JetStream stream and KV bucket on a NATS cluster "
        "(3 on a three-server cluster: one server may die without losing a message).",
    )
    node_quarantine: Literal["enforce", "dry-run", "off"] = Field(
        default="enforce",
        description="What a node whose fault score reaches node_quarantine_score gets: "
        "`enforce` cordons it and moves the jobs on it off at their next checkpoint; "
        "`dry-run` only records and reports it; `off` scores nodes without quarantine.",
    )
    node_quarantine_score: float = Field(
        default=2.5,
        gt=0,
        description="The score that quarantines a node (the attribution table's weights: "
        "an XID that takes the GPU out adds 1, so three such within hours reach 2.5).",
    )
    node_score_half_life_hours: float = Field(
        default=24.0, gt=0, description="A node's score halves every this many hours."
    )
    node_proactive_moves: bool = Field(
        default=True,
        description="Move the jobs off a node, each at its next checkpoint, when one of its "
        "GPUs shows a warning sign that predicts a failure (rising corrected ECC, growing "
        "retired pages, an XID known to precede failures).",
    )

    node_health_check_after_seconds: float = Field(
        default=1800.0,
        ge=0,
        description="A quarantined node's monitor is asked to check its health this long "
        "after the quarantine began, once no job runs on it, and again this long after "
        "each check it failed; a node that passes is released. 0: no checks (only "
        "`resurge node uncordon` releases).",
    )
    node_health_check_command: str = Field(
        default="",
        description="What a node monitor runs as its health check, after resetting the "
        "GPUs that await a reset and checking that every GPU answers (`dcgmi diag -r 2`, "
        "say); exit 0 passes. Empty: the built-in checks only.",
    )
    node_health_check_timeout_seconds: float = Field(
        default=600.0, gt=0, description="How long the health check command may run."
    )
    gpu_reset: bool = Field(
        default=True,
        description="Answer an XID whose action is `reset_gpu` (48, 62, 64, 74, ...) by "
        "resetting the GPU and restarting the job's processes where they ran, before "
        "moving the job off the node: the move comes only if the reset fails, the fault "
        "comes back, or the node is quarantined. Off: every such XID moves the job.",
    )
    gpu_reset_command: str = Field(
        default="nvidia-smi --gpu-reset -i {index}",
        min_length=1,
        description="How a node monitor resets one GPU (NVML GPUs; `{index}` and `{uuid}` "
        "are filled in). It runs once no process uses the GPU; exit 0 means reset.",
    )
    gpu_reset_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long a reset may take: the monitor's wait for the GPU's processes "
        "to exit and its reset command, each; the restarter waits for the answer as long "
        "and then starts the job anyway (a GPU still broken faults it again).",
    )

    @property
    def subjects(self) -> Subjects:
        """The subject names of this namespace."""
        return Subjects(self.namespace)
