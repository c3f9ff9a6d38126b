"""A SageMaker HyperPod ``HyperPodPyTorchJob`` manifest, converted into a TrainingJob.

:func:`convert_hyperpod` renames and moves HyperPod's fields into a TrainingJob document
and lets the TrainingJob models validate it: HyperPod's own blocks (``elasticPolicy``,
``runPolicy.restartPolicy``, ``runPolicy.logMonitoringConfiguration``) are handed on as
they are, for the models to fold in. What HyperPod and Kubernetes would have done to the
pod and resurge's agent does not, the converter does: ``$(VAR)`` references in the
container's env, command and args are expanded as the kubelet expands them
(:mod:`~resurge.jobspec.env_expansion`), a launcher is taken off the command or off the
shell script it runs (:mod:`~resurge.jobspec.shell_launcher`), and ``NNODES`` is set
where the job's size is fixed. Every change gets a :class:`Note` naming the manifest
field by its path and saying what became of it: where it went (pod-level settings stay in
``spec.template``, which only Kubernetes uses), why it was dropped, what was taken off or
added, or what resurge cannot do (a ``$(VAR)`` the pod fills in, NNODES of an elastic
job). docs/coming-from-hyperpod.md has the whole mapping.

Errors: :class:`HyperPodError` for text that is not YAML or a document that is not a
HyperPodPyTorchJob (or has no container command to run, or a shell script that starts a
launcher resurge cannot take off); :class:`JobSpecError` naming the TrainingJob field for
a converted job that does not validate.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml

from resurge.jobspec.elastic import ELASTIC_POLICY_FIELDS, NOT_TAKEN_FROM_ELASTIC_POLICY
from resurge.jobspec.env_expansion import expand
from resurge.jobspec.job import API_VERSION, TrainingJob, parse_job
from resurge.jobspec.launcher import Launched, split_launcher
from resurge.jobspec.shell_launcher import take_off_launchers

__all__ = [
    "HYPERPOD_API_VERSION",
    "HYPERPOD_KIND",
    "Conversion",
    "HyperPodError",
    "Note",
    "convert_hyperpod",
    "convert_hyperpod_yaml",
]

HYPERPOD_API_VERSION = "sagemaker.amazonaws.com/v1"
HYPERPOD_KIND = "HyperPodPyTorchJob"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NNODES = "NNODES"
"""What HyperPod sets in every pod: the job's replica count."""

_KEPT = "kept in spec.template (Kubernetes only; the local cluster ignores it)"
_NO_PLACE = "dropped: a TrainingJob has no such field"
_SHELLS = ("sh", "bash", "dash", "zsh")


class HyperPodError(ValueError):
    """Not a HyperPodPyTorchJob resurge can convert; the message names the field."""


@dataclass(frozen=True)
class Note:
    """A manifest field that has no TrainingJob field of its own: where it went, or why
    it was dropped."""

    path: str
    """The field's path in the HyperPod manifest, e.g. ``spec.runPolicy.cleanPodPolicy``."""
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


class _MultilineDumper(yaml.SafeDumper):
    """Writes strings with line breaks (shell scripts) as ``|`` blocks."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_MultilineDumper.add_representer(str, _string)


@dataclass(frozen=True)
class Conversion:
    """The converted job and the notes on what did not map onto a field of its own."""

    job: TrainingJob
    notes: tuple[Note, ...]

    def to_yaml(self, source: str | None = None) -> str:
        """The job as TrainingJob YAML (only the fields the manifest set), which
        :func:`~resurge.jobspec.load_job` reads back as :attr:`job`; ``source`` names the
        manifest in a comment on the first line."""
        document = self.job.model_dump(by_alias=True, exclude_unset=True, mode="json")
        text = yaml.dump(document, Dumper=_MultilineDumper, sort_keys=False, allow_unicode=True)
        header = f"# Converted by `resurge convert` from {source}\n" if source else ""
        return header + text


class _Converter:
    """One conversion: the TrainingJob document being built and the notes on the way."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] = {}
        self.notes: list[Note] = []
        self.container_path: str | None = None
        self.env_names: set[str] = set()
        self.env_values: dict[str, str] = {}
        """The plain env values so far, expanded: what a ``$(VAR)`` may refer to."""
        self.pod_env: set[str] = set()
        """Env names the pod fills in (``valueFrom``), which resurge cannot expand."""

    def note(self, path: str, what: str) -> None:
        self.notes.append(Note(path, what))

    def section(self, name: str) -> dict[str, Any]:
        section: dict[str, Any] = self.spec.setdefault(name, {})
        return section

    def metadata(self, metadata: Any) -> dict[str, Any]:
        if not isinstance(metadata, Mapping):
            raise HyperPodError("metadata: missing or not a mapping")
        converted: dict[str, Any] = {}
        for key, value in metadata.items():
            if key in ("name", "namespace"):
                converted[key] = value
            elif key == "labels" and isinstance(value, Mapping):
                # Kueue's priority-class label stays: it is the priority of the job's
                # Kueue Workload (resurge.cluster.kubernetes.kueue), as under HyperPod.
                labels = {k: v for k, v in value.items() if k != QUEUE_LABEL}
                if QUEUE_LABEL in value:
                    self.spec["queue"] = value[QUEUE_LABEL]
                if labels:
                    converted["labels"] = labels
            elif key == "annotations":
                self.note("metadata.annotations", "dropped: TrainingJob metadata has none")
            else:
                self.note(f"metadata.{key}", _NO_PLACE)
        return converted

    def elastic_policy(self, policy: Any, path: str) -> None:
        if not isinstance(policy, Mapping):
            self.spec["elasticPolicy"] = policy  # the spec model names the problem
            return
        for key, value in policy.items():
            if key in NOT_TAKEN_FROM_ELASTIC_POLICY:
                self.note(f"{path}.{key}", f"dropped: {NOT_TAKEN_FROM_ELASTIC_POLICY[key]}")
            elif key in ELASTIC_POLICY_FIELDS:
                self.section("elasticPolicy")[key] = value
            elif key == "scaleUpSnoozeTimeInSeconds":
                self.section("elastic")[key] = value
            else:
                self.note(f"{path}.{key}", _NO_PLACE)

    def run_policy(self, policy: Any, path: str) -> None:
        if not isinstance(policy, Mapping):
            raise HyperPodError(f"{path}: not a mapping")
        for key, value in policy.items():
            if key in ("jobMaxRetryCount", "restartPolicy"):
                self.section("recovery")[key] = value
            elif key == "logMonitoringConfiguration":
                self.section("monitoring")[key] = value
            elif key == "cleanPodPolicy":
                self.note(f"{path}.{key}", "dropped: resurge has no pod clean-up policy")
            else:
                self.note(f"{path}.{key}", _NO_PLACE)

    def replica_specs(self, specs: Any, path: str) -> None:
        if not isinstance(specs, list) or not specs or not isinstance(specs[0], Mapping):
            raise HyperPodError(f"{path}: a HyperPodPyTorchJob needs a list of replica specs")
        first = _priority_class(specs[0])
        for index in range(1, len(specs)):
            self.note(
                f"{path}[{index}]",
                f"dropped: resurge runs one kind of replica, taken from {path}[0] only",
            )
            other = _priority_class(specs[index])
            if other != first:
                self.note(
                    f"{path}[{index}].template.spec.priorityClassName",
                    f"{other!r} dropped: a TrainingJob has one PriorityClass, so every "
                    f"replica runs at {path}[0]'s {first!r} (spec.priorityClassName), "
                    "those this replica spec would have added too (resurge's scaler does "
                    "shrink an elastic job toward replicas.min before it suspends it)",
                )
        self.replica_spec(specs[0], f"{path}[0]")

    def replica_spec(self, spec: Mapping[str, Any], path: str) -> None:
        elastic_min = "minReplicas" in self.spec.get("elasticPolicy", {})
        for key, value in spec.items():
            if key == "replicas" and elastic_min:
                self.note(
                    f"{path}.{key}",
                    "dropped: resurge has no initial size; the job runs between "
                    "elasticPolicy.minReplicas and maxReplicas",
                )
            elif key in ("replicas", "maxReplicas"):
                self.section("replicas")["min" if key == "replicas" else "max"] = value
            elif key == "spares":
                self.section("recovery")["spares"] = value
            elif key == "template":
                self.pod_template(value, f"{path}.template")
            elif key == "name":
                self.note(f"{path}.name", "dropped: resurge has one kind of replica, unnamed")
            else:
                self.note(f"{path}.{key}", _NO_PLACE)

    def pod_template(self, template: Any, path: str) -> None:
        if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
            raise HyperPodError(f"{path}.spec: missing or not a mapping")
        pod: Mapping[str, Any] = template["spec"]
        containers = pod.get("containers")
        if not isinstance(containers, list) or not containers:
            raise HyperPodError(f"{path}.spec.containers: no container to take the command from")
        kept_pod = {key: value for key, value in pod.items() if key != "containers"}
        if "priorityClassName" in kept_pod:
            self.spec["priorityClassName"] = kept_pod.pop("priorityClassName")
        for key in kept_pod:
            self.note(f"{path}.spec.{key}", _KEPT)
        main = self.container(containers[0], f"{path}.spec.containers[0]")
        for index in range(1, len(containers)):
            self.note(f"{path}.spec.containers[{index}]", f"{_KEPT}; it runs beside the workers")
        kept_containers = ([main] if set(main) - {"name"} else []) + list(containers[1:])
        if kept_containers:
            kept_pod["containers"] = kept_containers
        kept = {key: value for key, value in template.items() if key != "spec"}
        for key in kept:
            self.note(f"{path}.{key}", _KEPT)
        if kept_pod:
            kept["spec"] = kept_pod
        if kept:
            self.spec["template"] = copy.deepcopy(kept)

    def container(self, container: Any, path: str) -> dict[str, Any]:
        """Take the workers' command, image, folder and environment out of ``container``;
        returns what is left of it, for ``spec.template``."""
        if not isinstance(container, Mapping):
            raise HyperPodError(f"{path}: not a mapping")
        self.container_path = path
        kept_env = self.env(container.get("env") or [], f"{path}.env")
        argv: list[Any] = []
        for key in ("command", "args"):
            argv += self.expanded(list(container.get(key) or []), f"{path}.{key}")
        if not argv:
            raise HyperPodError(
                f"{path}: no command or args; resurge needs the training command "
                "(the image's entrypoint is not known here)"
            )
        has = {key: f"{path}.{key}" for key in ("command", "args") if container.get(key)}
        self.command(argv, has.get("command", f"{path}.args"), has.get("args", f"{path}.command"))
        left = {k: v for k, v in container.items() if k not in ("command", "args", "env")}
        image = left.pop("image", None)
        if image:
            self.spec["image"] = image
        elif "image" in container:
            self.note(f"{path}.image", "dropped: empty; spec.image left unset")
        if "workingDir" in left:
            self.spec["workingDir"] = left.pop("workingDir")
        for key in left:
            if key != "name":
                self.note(f"{path}.{key}", _KEPT)
        if kept_env:
            left["env"] = kept_env
        return left

    def env(self, entries: list[Any], path: str) -> list[Any]:
        """Put plain ``name``/``value`` entries into ``spec.env``, their ``$(VAR)``
        references expanded as Kubernetes does; returns the others."""
        kept = []
        for index, entry in enumerate(entries):
            name = entry.get("name", "?") if isinstance(entry, Mapping) else "?"
            self.env_names.add(str(name))
            if isinstance(entry, Mapping) and set(entry) <= {"name", "value"}:
                value = entry.get("value", "")
                if isinstance(value, str):
                    value, missing = expand(value, self.env_values)
                    self.unexpanded(missing, f"{path}[{index}] ({name})")
                    entry = {**entry, "value": value} if "value" in entry else dict(entry)
                self.spec.setdefault("env", []).append(dict(entry))
                self.env_values[str(name)] = str(value)
            else:
                self.note(
                    f"{path}[{index}] ({name})",
                    f"{_KEPT}; spec.env takes a name and a value only",
                )
                kept.append(entry)
                self.pod_env.add(str(name))
        return kept

    def expanded(self, tokens: list[Any], path: str) -> list[Any]:
        """``tokens`` of a command or args, ``$(VAR)`` expanded as Kubernetes does."""
        out = []
        for token in tokens:
            if isinstance(token, str):
                token, missing = expand(token, self.env_values)
                self.unexpanded(missing, path)
            out.append(token)
        return out

    def unexpanded(self, names: tuple[str, ...], path: str) -> None:
        """Note references to variables only the pod defines (``valueFrom``)."""
        pod = [f"$({name})" for name in dict.fromkeys(names) if name in self.pod_env]
        if pod:
            self.note(
                path,
                f"{', '.join(pod)} not expanded: Kubernetes fills it in from the pod "
                "(valueFrom), and resurge's agent runs spec.command and spec.env as written",
            )

    def command(self, argv: list[Any], path: str, script_path: str) -> None:
        """``spec.command`` from the container's ``argv``; ``path`` names where the
        program is, ``script_path`` where a shell's script is (``args`` if given)."""
        launched = split_launcher([str(token) for token in argv])
        if launched is None:
            self.spec["command"] = self.shell_launchers(argv, script_path)
            return
        self.spec["command"] = list(launched.script)
        what = (
            f"the launcher `{_said(launched)}` dropped: resurge's agent starts nprocPerNode "
            "workers as torchrun would, so spec.command is the script's argv"
        )
        self.note(path, what + self.launcher_nproc(launched))

    def launcher_nproc(self, launched: Launched) -> str:
        """Fill ``nprocPerNode`` from the launcher's ``--nproc-per-node``; what to say."""
        nproc = launched.nproc_per_node
        if nproc is not None and "nprocPerNode" not in self.spec:
            self.spec["nprocPerNode"] = nproc
            return f"; its --nproc-per-node {nproc} is spec.nprocPerNode"
        if nproc is not None and str(self.spec["nprocPerNode"]) != nproc:
            return f"; its --nproc-per-node {nproc} differs from nprocPerNode, which is kept"
        return ""

    def shell_launchers(self, argv: list[Any], path: str) -> list[Any]:
        """``argv``, with the launchers a shell script in it starts taken off."""
        if not argv or PurePosixPath(str(argv[0])).name not in _SHELLS:
            return argv
        out: list[Any] = [argv[0]]
        for token in argv[1:]:
            if not isinstance(token, str):
                out.append(token)
                continue
            taken = take_off_launchers(token)
            if taken.left:
                raise HyperPodError(
                    f"{path}: this shell script starts {taken.left[0]} where resurge cannot "
                    "take the launcher off (not as a command of its own, or with no script "
                    "after its options): resurge runs spec.command once per worker, so edit "
                    "it to run the training script itself"
                )
            for launched in taken.launched:
                self.note(
                    path,
                    f"the launcher `{_said(launched)}` taken off this shell script, which "
                    f"now runs `{_started(launched)} ...`: "
                    "resurge's agent starts nprocPerNode workers and each runs spec.command, "
                    "so the rest of the script runs once per worker too"
                    + self.launcher_nproc(launched),
                )
            out.append(taken.script)
        return out

    def nnodes(self) -> None:
        """Set ``NNODES`` as HyperPod does in every pod, where the job's size is fixed."""
        if self.container_path is None or NNODES in self.env_names:
            return
        path = f"{self.container_path}.env"
        policy = self.spec.get("elasticPolicy")
        policy = policy if isinstance(policy, Mapping) else {}
        replicas = self.spec.get("replicas", {})
        low = policy.get("minReplicas", replicas.get("min"))
        high = policy.get("maxReplicas", replicas.get("max", low))
        if low is not None and str(low) == str(high) and str(low).isdigit():
            self.spec.setdefault("env", []).append({"name": NNODES, "value": str(low)})
            self.note(
                path,
                f"{NNODES}={low} added to spec.env: HyperPod sets it in every pod (the "
                "job's replica count)",
            )
        elif policy or "max" in replicas:
            self.note(
                path,
                f"{NNODES}, which HyperPod sets in every pod to the job's replica count, is "
                "not set: this job's size changes as it is resized; resurge gives each "
                "worker GROUP_WORLD_SIZE, the replica count of its generation",
            )


def _priority_class(replica_spec: Any) -> Any:
    template = replica_spec.get("template") if isinstance(replica_spec, Mapping) else None
    pod = template.get("spec") if isinstance(template, Mapping) else None
    return pod.get("priorityClassName") if isinstance(pod, Mapping) else None


def _said(launched: Launched) -> str:
    return " ".join((launched.launcher, *launched.options))


def _started(launched: Launched) -> str:
    """What the script runs now: ``python SCRIPT``, ``python -m MODULE`` or ``PROGRAM``."""
    script = launched.script
    return " ".join(script[: 3 if script[1:2] == ("-m",) else 2 if script[0] == "python" else 1])


def _check_kind(document: Any) -> Mapping[str, Any]:
    if not isinstance(document, Mapping):
        raise HyperPodError("not a HyperPodPyTorchJob: the document is not a mapping")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if api_version != HYPERPOD_API_VERSION or str(kind).lower() != HYPERPOD_KIND.lower():
        raise HyperPodError(
            f"not a HyperPodPyTorchJob: apiVersion {api_version!r}, kind {kind!r} "
            f"(expected {HYPERPOD_API_VERSION}, {HYPERPOD_KIND})"
        )
    if not isinstance(document.get("spec"), Mapping):
        raise HyperPodError("spec: missing or not a mapping")
    return document


def convert_hyperpod(document: Any) -> Conversion:
    """The TrainingJob a decoded HyperPodPyTorchJob manifest describes, with notes."""
    manifest = _check_kind(document)
    converter = _Converter()
    metadata = converter.metadata(manifest.get("metadata"))
    spec: Mapping[str, Any] = manifest["spec"]
    # nprocPerNode first (a launcher's --nproc-per-node only fills it in), and
    # elasticPolicy before replicaSpecs (its minReplicas replaces their replicas).
    handlers: dict[str, Callable[[Any, str], None]] = {
        "nprocPerNode": lambda value, _: converter.spec.__setitem__("nprocPerNode", value),
        "elasticPolicy": converter.elastic_policy,
        "replicaSpecs": converter.replica_specs,
        "runPolicy": converter.run_policy,
    }
    for key, handle in handlers.items():
        if key in spec:
            handle(spec[key], f"spec.{key}")
    converter.nnodes()
    for key in spec:
        if key not in handlers:
            converter.note(f"spec.{key}", _NO_PLACE)
    for key in manifest:
        if key == "status":
            converter.note(key, "dropped: resurge writes a TrainingJob's status itself")
        elif key not in ("apiVersion", "kind", "metadata", "spec"):
            converter.note(key, _NO_PLACE)
    document = {"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": metadata}
    job = parse_job({**document, "spec": converter.spec})
    return Conversion(job=job, notes=tuple(converter.notes))


def convert_hyperpod_yaml(text: str) -> Conversion:
    """:func:`convert_hyperpod` of a manifest's YAML text."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise HyperPodError(f"not valid YAML: {error}") from None
    return convert_hyperpod(document)
