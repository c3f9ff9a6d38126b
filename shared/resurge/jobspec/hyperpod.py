"""A SageMaker HyperPod ``HyperPodPyTorchJob`` manifest, converted into a TrainingJob.

:func:`convert_hyperpod` renames and moves HyperPod's fields into a TrainingJob document
and lets the TrainingJob models validate it: HyperPod's own blocks (``elasticPolicy``,
``runPolicy.restartPolicy``, ``runPolicy.logMonitoringConfiguration``) are handed on as
they are, for the models to fold in. Each field that does not land in a TrainingJob field
of its own gets a :class:`Note` naming it by its path in the manifest and saying where it
went (pod-level settings stay in ``spec.template``, which only Kubernetes uses) or why it
was dropped. docs/coming-from-hyperpod.md has the whole mapping.

Errors: :class:`HyperPodError` for text that is not YAML or a document that is not a
HyperPodPyTorchJob (or has no container command to run); :class:`JobSpecError` naming
the TrainingJob field for a converted job that does not validate.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml

from resurge.jobspec.elastic import ELASTIC_POLICY_FIELDS
from resurge.jobspec.job import API_VERSION, TrainingJob, parse_job
from resurge.jobspec.launcher import LAUNCHERS, split_launcher

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
            if key in ELASTIC_POLICY_FIELDS:
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
        for index in range(1, len(specs)):
            self.note(
                f"{path}[{index}]",
                f"dropped: resurge runs one kind of replica, taken from {path}[0] only",
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
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if not argv:
            raise HyperPodError(
                f"{path}: no command or args; resurge needs the training command "
                "(the image's entrypoint is not known here)"
            )
        self.command(argv, path)
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
        kept_env = self.env(container.get("env") or [], f"{path}.env")
        if kept_env:
            left["env"] = kept_env
        return left

    def env(self, entries: list[Any], path: str) -> list[Any]:
        """Put plain ``name``/``value`` entries into ``spec.env``; returns the others."""
        kept = []
        for index, entry in enumerate(entries):
            if isinstance(entry, Mapping) and set(entry) <= {"name", "value"}:
                self.spec.setdefault("env", []).append(dict(entry))
            else:
                name = entry.get("name", "?") if isinstance(entry, Mapping) else "?"
                self.note(
                    f"{path}[{index}] ({name})",
                    f"{_KEPT}; spec.env takes a name and a value only",
                )
                kept.append(entry)
        return kept

    def command(self, argv: list[Any], path: str) -> None:
        launched = split_launcher([str(token) for token in argv])
        if launched is None:
            self.spec["command"] = argv
            self.shell_launcher(argv, path)
            return
        self.spec["command"] = list(launched.script)
        said = " ".join((launched.launcher, *launched.options))
        what = (
            f"the launcher `{said}` dropped: resurge's agent starts nprocPerNode workers as "
            "torchrun would, so spec.command is the script's argv"
        )
        nproc = launched.nproc_per_node
        if nproc is not None and "nprocPerNode" not in self.spec:
            self.spec["nprocPerNode"] = nproc
            what += f"; its --nproc-per-node {nproc} is spec.nprocPerNode"
        elif nproc is not None and str(self.spec["nprocPerNode"]) != nproc:
            what += f"; its --nproc-per-node {nproc} differs from nprocPerNode, which is kept"
        self.note(f"{path}.command", what)

    def shell_launcher(self, argv: list[Any], path: str) -> None:
        if PurePosixPath(str(argv[0])).name not in _SHELLS:
            return
        found = [name for name in LAUNCHERS if any(name in str(token) for token in argv[1:])]
        if found:
            self.note(
                f"{path}.args",
                f"kept as spec.command, but this shell script starts {found[0]}: resurge runs "
                "spec.command once per worker, so edit it to run the training script itself",
            )


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
