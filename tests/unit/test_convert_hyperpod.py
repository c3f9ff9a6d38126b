"""Converting HyperPod HyperPodPyTorchJob manifests: the published ones kept under
tests/data/hyperpod/, and small ones for each rule."""

import copy
import re
import string
from pathlib import Path
from typing import Any

import pytest

from resurge.contract.vocabulary import RecoveryLevel
from resurge.jobspec import JobSpecError, load_job, parse_job
from resurge.jobspec.hyperpod import (
    Conversion,
    HyperPodError,
    convert_hyperpod,
    convert_hyperpod_yaml,
)
from resurge.jobspec.launcher import split_launcher

DATA = Path(__file__).resolve().parents[1] / "data" / "hyperpod"
ELASTIC = DATA / "elastic-training-job.yaml"
FSDP = DATA / "llama3_1_8b-fsdp-hpto.yaml"
PRETRAIN = DATA / "pretrain_llama3_70b_p5.yaml"
# What `envsubst` fills into the FSDP template before `kubectl apply`, as its README does.
FSDP_VALUES = {
    "GPU_PER_NODE": "8",
    "NUM_NODES": "4",
    "EFA_PER_NODE": "32",
    "IMAGE_URI": "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp:pytorch2.5",
    "INSTANCE_TYPE": "ml.p5.48xlarge",
    "HF_TOKEN": "hf_example",
}
KEPT = "kept in spec.template"
POD = "spec.replicaSpecs[0].template.spec"
CONTAINER = f"{POD}.containers[0]"


def fsdp_text() -> str:
    return string.Template(FSDP.read_text()).substitute(FSDP_VALUES)


def notes_by_path(conversion: Conversion) -> dict[str, str]:
    return {note.path: note.what for note in conversion.notes}


def manifest(**spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "img", "command": ["python", "train.py"]}
    base: dict[str, Any] = {
        "replicaSpecs": [
            {"name": "pods", "replicas": 2, "template": {"spec": {"containers": [container]}}}
        ]
    }
    return {
        "apiVersion": "sagemaker.amazonaws.com/v1",
        "kind": "HyperPodPyTorchJob",
        "metadata": {"name": "j"},
        "spec": {**base, **spec},
    }


def test_elastic_manifest_lands_in_replicas_elastic_and_recovery() -> None:
    conversion = convert_hyperpod_yaml(ELASTIC.read_text())
    spec = conversion.job.spec
    assert conversion.job.name == "elastic-training-job"
    assert (spec.replicas.min, spec.replicas.max, spec.replicas.step) == (2, 8, 2)
    assert spec.replicas.allowed_sizes() == [2, 4, 6, 8]
    assert spec.elastic.checkpoint_timeout_seconds == 600
    assert spec.elastic.scaling_timeout_seconds == 300  # not HyperPod's (its own test below)
    assert spec.recovery.faulty_scale_down_timeout_seconds == 30
    assert spec.command == ["python", "train.py"]
    assert spec.nproc_per_node == 8  # from hyperpodrun's --nproc-per-node
    assert spec.image == "<your-training-container>"
    assert spec.template == {
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "resources": {
                        "requests": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32},
                        "limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32},
                    },
                }
            ]
        }
    }
    notes = notes_by_path(conversion)
    assert set(notes) == {
        "spec.elasticPolicy.scalingTimeoutInSeconds",
        "spec.replicaSpecs[0].name",
        "spec.replicaSpecs[0].replicas",
        f"{CONTAINER}.command",
        f"{CONTAINER}.env",
        f"{CONTAINER}.resources",
    }
    assert (
        "hyperpodrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=hyperpod"
        in (notes[f"{CONTAINER}.command"])
    )
    assert notes[f"{CONTAINER}.resources"].startswith(KEPT)


def test_fsdp_manifest_lands_in_recovery_monitoring_and_command() -> None:
    conversion = convert_hyperpod_yaml(fsdp_text())
    spec = conversion.job.spec
    assert conversion.job.name == "llama3-1-8b-fsdp-hpto"
    assert spec.nproc_per_node == 8 and spec.replicas.min == 4 and not spec.replicas.elastic
    assert spec.image == FSDP_VALUES["IMAGE_URI"]
    recovery = spec.recovery
    assert recovery.max_restarts == 10
    assert recovery.num_restart_before_full_job_restart == 3
    assert recovery.eval_period_seconds == 21600
    assert recovery.max_full_job_restarts == 1
    assert recovery.levels == list(RecoveryLevel)  # untouched: HyperPod has no ladder
    rules = {rule.name: rule for rule in spec.monitoring.log_rules}
    assert set(rules) == {"JobStart", "JobHangingDetection"}
    assert rules["JobStart"].log_pattern == ".*Loss:.*"
    assert rules["JobStart"].expected_start_cut_off_in_seconds == 240
    assert rules["JobHangingDetection"].expected_recurring_frequency_in_seconds == 600
    assert spec.command[:3] == ["python", "/fsdp/train.py", "--max_context_width=4096"]
    assert spec.command[-1] == "--offload_activations=1" and len(spec.command) == 21
    env = {var.name: var.value for var in spec.env}
    assert len(env) == 16 and env["NCCL_SOCKET_IFNAME"] == "^lo" and env["HF_TOKEN"] == "hf_example"
    assert env["NNODES"] == "4"
    assert spec.template is not None
    pod = spec.template["spec"]
    assert set(pod) == {"volumes", "affinity", "topologySpreadConstraints", "containers"}
    assert spec.template["metadata"]["labels"]["replica-type"] == "pods"
    assert set(pod["containers"][0]) == {"name", "imagePullPolicy", "resources", "volumeMounts"}
    notes = notes_by_path(conversion)
    assert set(notes) == {
        "spec.runPolicy.cleanPodPolicy",
        "spec.replicaSpecs[0].name",
        "spec.replicaSpecs[0].template.metadata",
        f"{POD}.volumes",
        f"{POD}.affinity",
        f"{POD}.topologySpreadConstraints",
        f"{CONTAINER}.command",
        f"{CONTAINER}.env",
        f"{CONTAINER}.imagePullPolicy",
        f"{CONTAINER}.resources",
        f"{CONTAINER}.volumeMounts",
    }
    assert notes["spec.runPolicy.cleanPodPolicy"].startswith("dropped")
    assert "--tee=3 --log_dir=/tmp/hyperpod" in notes[f"{CONTAINER}.command"]


def test_pretrain_manifest_keeps_its_shell_command_and_says_so() -> None:
    conversion = convert_hyperpod_yaml(PRETRAIN.read_text())
    job = conversion.job
    spec = job.spec
    assert job.name == "username-llama3-pretrain"
    assert job.metadata.labels == {
        "app.kubernetes.io/name": "hyperpod",
        "app.kubernetes.io/managed-by": "kustomize",
    }
    assert spec.nproc_per_node == 8 and spec.replicas.min == 16
    assert spec.command[:2] == ["/bin/sh", "-c"] and "hyperpodrun" not in spec.command[2]
    assert spec.image is None
    env = {var.name: var.value for var in spec.env}
    assert env["JOB_NAME"] == "username-llama3-pretrain"  # the YAML anchor resolved
    assert "POD_NAME" not in env and len(env) == 15 and env["NNODES"] == "16"
    assert spec.template is not None
    container = spec.template["spec"]["containers"][0]
    assert [entry["name"] for entry in container["env"]] == ["POD_NAME", "NODE_NAME"]
    assert spec.template["spec"]["nodeSelector"] == {
        "beta.kubernetes.io/instance-type": "ml.p5.48xlarge"
    }
    notes = notes_by_path(conversion)
    assert set(notes) == {
        "metadata.annotations",
        "spec.runPolicy.cleanPodPolicy",
        "spec.replicaSpecs[0].name",
        f"{POD}.hostNetwork",
        f"{POD}.nodeSelector",
        f"{POD}.volumes",
        f"{CONTAINER}.args",
        f"{CONTAINER}.env",
        f"{CONTAINER}.image",
        f"{CONTAINER}.imagePullPolicy",
        f"{CONTAINER}.securityContext",
        f"{CONTAINER}.ports",
        f"{CONTAINER}.resources",
        f"{CONTAINER}.volumeMounts",
        f"{CONTAINER}.env[8] (POD_NAME)",
        f"{CONTAINER}.env[9] (NODE_NAME)",
    }
    assert "taken off this shell script" in notes[f"{CONTAINER}.args"]
    assert notes[f"{CONTAINER}.env[8] (POD_NAME)"].startswith(KEPT)


@pytest.mark.parametrize("text", [ELASTIC.read_text(), fsdp_text(), PRETRAIN.read_text()])
def test_output_loads_back_as_the_same_job(text: str, tmp_path: Path) -> None:
    conversion = convert_hyperpod_yaml(text)
    out = tmp_path / "job.yaml"
    out.write_text(conversion.to_yaml(source="manifest.yaml"))
    assert out.read_text().startswith("# Converted by `resurge convert` from manifest.yaml\n")
    assert load_job(out) == conversion.job


def test_template_not_filled_in_is_an_error_naming_the_fields() -> None:
    with pytest.raises(JobSpecError) as caught:
        convert_hyperpod_yaml(FSDP.read_text())
    assert "spec.nprocPerNode" in str(caught.value) and "spec.replicas.min" in str(caught.value)


def test_pod_and_metadata_fields_with_a_place_of_their_own() -> None:
    document = manifest(nprocPerNode=2)
    document["metadata"] = {
        "name": "j",
        "namespace": "team",
        "labels": {"kueue.x-k8s.io/queue-name": "q", "team": "nlp"},
    }
    replica = document["spec"]["replicaSpecs"][0]
    replica["spares"] = 1
    pod = replica["template"]["spec"]
    pod["priorityClassName"] = "high"
    pod["containers"][0]["workingDir"] = "/work"
    pod["containers"][0]["args"] = ["--lr", "0.1"]
    conversion = convert_hyperpod(document)
    job = conversion.job
    assert job.metadata.namespace == "team" and job.metadata.labels == {"team": "nlp"}
    assert job.spec.queue == "q" and job.spec.priority_class_name == "high"
    assert job.spec.recovery.spares == 1 and job.spec.working_dir == "/work"
    assert job.spec.command == ["python", "train.py", "--lr", "0.1"]
    assert job.spec.template is None  # nothing was left for it
    assert [note.path for note in conversion.notes] == [
        "spec.replicaSpecs[0].name",
        f"{CONTAINER}.env",  # NNODES=2 added
    ]


def test_fields_without_a_place_are_noted_by_path() -> None:
    document = manifest(
        elasticPolicy={"minReplicas": 1, "maxReplicas": 4, "scaleUpSnoozeTimeInSeconds": 90},
        runPolicy={"ttlSecondsAfterFinished": 60},
        suspend=True,
    )
    document["spec"]["replicaSpecs"].append(document["spec"]["replicaSpecs"][0])
    document["status"] = {"conditions": []}
    document["metadata"]["uid"] = "1234"
    conversion = convert_hyperpod(document)
    assert conversion.job.spec.elastic.scale_up_snooze_seconds == 90
    assert (conversion.job.spec.replicas.min, conversion.job.spec.replicas.max) == (1, 4)
    notes = notes_by_path(conversion)
    assert set(notes) == {
        "metadata.uid",
        "spec.replicaSpecs[0].name",
        "spec.replicaSpecs[0].replicas",
        "spec.replicaSpecs[1]",
        "spec.runPolicy.ttlSecondsAfterFinished",
        "spec.suspend",
        "status",
        f"{CONTAINER}.env",  # NNODES not set: the job is elastic
    }
    assert all(what.startswith("dropped") for path, what in notes.items() if "env" not in path)


def test_values_are_checked_by_the_job_models() -> None:
    bad_policy = manifest(runPolicy={"restartPolicy": {"maxFullJobRestart": 1}})
    with pytest.raises(JobSpecError, match="restartPolicy"):
        convert_hyperpod(bad_policy)
    disagreeing = manifest(elasticPolicy={"maxReplicas": 4})
    disagreeing["spec"]["replicaSpecs"][0]["maxReplicas"] = 8
    with pytest.raises(JobSpecError, match=r"elasticPolicy.maxReplicas .* replicas.max"):
        convert_hyperpod(disagreeing)
    bad_rule = manifest(
        runPolicy={"logMonitoringConfiguration": [{"name": "r", "logPattern": "x"}]}
    )
    with pytest.raises(JobSpecError, match="checks nothing"):
        convert_hyperpod(bad_rule)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [b", "not valid YAML"),
        ("- 1\n- 2\n", "not a mapping"),
        ("apiVersion: v1\nkind: Pod\nspec: {}\n", "kind 'Pod'"),
        ("apiVersion: kubeflow.org/v1\nkind: HyperPodPyTorchJob\n", "apiVersion 'kubeflow.org/v1'"),
        ("apiVersion: sagemaker.amazonaws.com/v1\nkind: HyperPodPyTorchJob\n", "spec: missing"),
    ],
)
def test_not_a_hyperpod_job(text: str, message: str) -> None:
    with pytest.raises(HyperPodError, match=message):
        convert_hyperpod_yaml(text)


def test_a_job_without_a_command_or_container_names_the_field() -> None:
    no_command = manifest()
    del no_command["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"]
    with pytest.raises(HyperPodError, match=r"containers\[0\]: no command or args"):
        convert_hyperpod(no_command)
    no_container = manifest()
    no_container["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"] = []
    with pytest.raises(HyperPodError, match=r"template.spec.containers: no container"):
        convert_hyperpod(no_container)
    with pytest.raises(HyperPodError, match=r"spec\.replicaSpecs: a HyperPodPyTorchJob needs"):
        convert_hyperpod(manifest(replicaSpecs=[]))


def test_launcher_nproc_that_disagrees_is_noted_and_spec_wins() -> None:
    document = manifest(nprocPerNode="4")
    container = document["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["command"] = ["torchrun", "--nproc_per_node", "8", "train.py"]
    conversion = convert_hyperpod(document)
    assert conversion.job.spec.nproc_per_node == 4
    assert conversion.job.spec.command == ["python", "train.py"]
    assert "differs from nprocPerNode" in notes_by_path(conversion)[f"{CONTAINER}.command"]


@pytest.mark.parametrize(
    ("argv", "script", "nproc"),
    [
        (
            ["hyperpodrun", "--tee", "3", "--inprocess-restart", "t.py", "-x"],
            ["python", "t.py", "-x"],
            None,
        ),
        (
            ["/usr/bin/torchrun", "--nproc-per-node=2", "-m", "pkg.train"],
            ["python", "-m", "pkg.train"],
            "2",
        ),
        (["torchrun", "--no-python", "--nnodes", "1", "./run.sh"], ["./run.sh"], None),
        (
            [
                "python3",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "4",
                "t.py",
            ],
            ["python", "t.py"],
            "4",
        ),
    ],
)
def test_launcher_is_taken_off(argv: list[str], script: list[str], nproc: str | None) -> None:
    launched = split_launcher(argv)
    assert launched is not None
    assert list(launched.script) == script and launched.nproc_per_node == nproc


@pytest.mark.parametrize(
    "argv", [["python", "train.py"], ["torchrun", "--nnodes", "2"], ["python", "-m", "pkg"], []]
)
def test_no_launcher_or_no_script(argv: list[str]) -> None:
    assert split_launcher(argv) is None


def test_warnings_shown_in_the_docs_are_what_convert_says() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "jobspec.md").read_text()
    block = re.search(r"## Coming from HyperPod\n.*?```text\n(.*?)```", doc, re.DOTALL)
    assert block is not None, "docs/jobspec.md lost its resurge convert warnings"
    said = {
        f"resurge convert: warning: {note}"
        for note in convert_hyperpod_yaml(PRETRAIN.read_text()).notes
    }
    shown = block.group(1).splitlines()
    assert shown and set(shown) <= said


def test_kind_as_some_aws_pages_spell_it_is_accepted() -> None:
    document = manifest()
    document["kind"] = "HyperPodPytorchJob"
    assert convert_hyperpod(document).job.name == "j"


# Issue 28 item 7: everything the converter changes is said, or done as HyperPod does.

GPT_OSS = DATA / "full_finetune_gpt_oss_120b_checkpointless_p5.yaml"
GOVERNANCE = DATA / "hyp-task-governance-team-a.yaml"


def test_env_references_expand_as_kubernetes_expands_them() -> None:
    """Kubernetes expands ``$(VAR)`` in a container's env values from the variables
    defined before it, and in command and args from all of them; ``$$`` escapes a ``$``
    and a reference to an unknown name stays as written (Kubernetes docs, "Define
    Dependent Environment Variables", kubernetes.io/docs/tasks/inject-data-application/
    define-interdependent-environment-variables/).
    resurge's agent does not, so the converter does it."""
    document = manifest()
    container = document["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "ROOT", "value": "/data"},
        {"name": "OUT", "value": "$(ROOT)/out"},
        {"name": "EARLY", "value": "$(LATER)/x"},
        {"name": "ESCAPED", "value": "$$(ROOT) costs $$5"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "LOG", "value": "$(OUT)/$(POD_NAME).log"},
        {"name": "LATER", "value": "later"},
    ]
    container["command"] = ["python", "train.py", "--out=$(OUT)", "--tag=$(LATER)"]
    container["args"] = ["--shell=$(ip route | head)"]
    conversion = convert_hyperpod(document)
    env = {var.name: var.value for var in conversion.job.spec.env}
    assert env["OUT"] == "/data/out"
    assert env["EARLY"] == "$(LATER)/x"  # defined after it: Kubernetes leaves it too
    assert env["ESCAPED"] == "$(ROOT) costs $5"
    assert env["LOG"] == "/data/out/$(POD_NAME).log"
    assert conversion.job.spec.command == [
        "python",
        "train.py",
        "--out=/data/out",
        "--tag=later",
        "--shell=$(ip route | head)",
    ]
    notes = notes_by_path(conversion)
    said = notes[f"{CONTAINER}.env[5] (LOG)"]
    assert "$(POD_NAME)" in said and "not expanded" in said


def test_env_reference_to_a_pod_field_in_the_command_is_warned() -> None:
    document = manifest()
    container = document["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    container["args"] = ["--node=$(NODE)"]
    conversion = convert_hyperpod(document)
    assert conversion.job.spec.command[-1] == "--node=$(NODE)"
    assert "$(NODE)" in notes_by_path(conversion)[f"{CONTAINER}.args"]


def test_pretrain_env_references_are_expanded() -> None:
    env = {var.name: var.value for var in convert_hyperpod_yaml(PRETRAIN.read_text()).job.spec.env}
    assert env["CHECKPOINT_DIR"] == (
        "/data/checkpoints/username/llama3_pretrain/username-llama3-pretrain/baseline"
    )
    assert env["LOGDIR"] == "/data/username/output/logs/username-llama3-pretrain/baseline"


def test_nnodes_is_set_for_a_fixed_size_job_as_hyperpod_does() -> None:
    conversion = convert_hyperpod(manifest())
    env = {var.name: var.value for var in conversion.job.spec.env}
    assert env["NNODES"] == "2"
    assert "NNODES=2" in notes_by_path(conversion)[f"{CONTAINER}.env"]


def test_nnodes_the_manifest_sets_is_kept() -> None:
    document = manifest()
    container = document["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "NNODES", "value": "7"}]
    conversion = convert_hyperpod(document)
    assert [(v.name, v.value) for v in conversion.job.spec.env] == [("NNODES", "7")]
    assert f"{CONTAINER}.env" not in notes_by_path(conversion)


def test_nnodes_of_an_elastic_job_is_warned_about() -> None:
    conversion = convert_hyperpod_yaml(ELASTIC.read_text())
    assert all(var.name != "NNODES" for var in conversion.job.spec.env)
    said = notes_by_path(conversion)[f"{CONTAINER}.env"]
    assert "NNODES" in said and "GROUP_WORLD_SIZE" in said


def test_kueue_priority_class_label_stays_as_the_workloads_priority() -> None:
    """The job is one Kueue workload (docs/kubernetes.md, Kueue): the label is the
    priority of its Workload, as under HyperPod, and nothing is said of it."""
    conversion = convert_hyperpod_yaml(GOVERNANCE.read_text())
    job = conversion.job
    assert job.metadata.labels == {"kueue.x-k8s.io/priority-class": "training-priority"}
    assert job.spec.queue == "hyperpod-ns-team-a-localqueue"
    assert 'metadata.labels["kueue.x-k8s.io/priority-class"]' not in notes_by_path(conversion)


def test_a_second_replica_spec_with_another_priority_is_said() -> None:
    """AWS's partial-preemption pattern: a base replica spec at high priority and an
    elastic one at low priority (sagemaker-eks-elastic-training, "Preemption by high
    priority job")."""
    document = manifest(elasticPolicy={"minReplicas": 2, "maxReplicas": 8})
    base = document["spec"]["replicaSpecs"][0]
    base["template"]["spec"]["priorityClassName"] = "high-priority"
    elastic = copy.deepcopy(base)
    elastic.update(name="elastic", replicas=0, maxReplicas=6)
    elastic["template"]["spec"]["priorityClassName"] = "low-priority"
    document["spec"]["replicaSpecs"].append(elastic)
    conversion = convert_hyperpod(document)
    assert conversion.job.spec.priority_class_name == "high-priority"
    said = notes_by_path(conversion)["spec.replicaSpecs[1].template.spec.priorityClassName"]
    assert "'low-priority'" in said and "'high-priority'" in said


def test_scaling_timeout_is_not_taken_for_resurge_s_own() -> None:
    """AWS: elasticPolicy.scalingTimeoutInSeconds is how long the job controller waits,
    once a scaling event is detected, before it starts a scale-up
    (docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-eks-elastic-training.html);
    resurge's elastic.scalingTimeoutSeconds is how long a grow's replicas may take to
    come up."""
    conversion = convert_hyperpod_yaml(ELASTIC.read_text())
    assert conversion.job.spec.elastic.scaling_timeout_seconds == 300.0  # the default
    said = notes_by_path(conversion)["spec.elasticPolicy.scalingTimeoutInSeconds"]
    assert said.startswith("dropped") and "before" in said and "scale-up" in said


def test_scaling_timeout_pasted_onto_a_job_is_refused_naming_it() -> None:
    with pytest.raises(JobSpecError, match=r"elasticPolicy.scalingTimeoutInSeconds: HyperPod"):
        parse_job(
            {
                "apiVersion": "resurge.dev/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": "j"},
                "spec": {
                    "command": ["python", "t.py"],
                    "elasticPolicy": {"maxReplicas": 2, "scalingTimeoutInSeconds": 60},
                },
            }
        )


def test_a_launcher_in_a_shell_script_is_taken_off() -> None:
    conversion = convert_hyperpod_yaml(PRETRAIN.read_text())
    script = conversion.job.spec.command[2]
    assert "hyperpodrun" not in script
    assert 'python "${ENTRYPOINT}" \\\n' in script
    assert '--config-path="${CONFIG_PATH}"' in script and "--tee" not in script
    assert 'mkdir -p "${LOGDIR}"' in script  # the rest of the script is kept
    said = notes_by_path(conversion)[f"{CONTAINER}.args"]
    assert "hyperpodrun --nproc_per_node=8 --log_dir ${LOGDIR} --tee 3" in said
    assert "once per worker" in said


def test_a_shell_launcher_resurge_cannot_take_off_is_an_error() -> None:
    document = manifest()
    container = document["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["command"] = ["bash", "-c", "L=hyperpodrun; $L --nproc-per-node=8 train.py"]
    with pytest.raises(HyperPodError, match=r"containers\[0\]\.command: .*hyperpodrun"):
        convert_hyperpod(document)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("torchrun --nproc-per-node=2 t.py --x 1", "python t.py --x 1"),
        (
            "cd /w && exec torchrun --standalone -m pkg.train -v",
            "cd /w && exec python -m pkg.train -v",
        ),
        ("python3 -m torch.distributed.run --nnodes 2 t.py; echo done", "python t.py; echo done"),
        ("/opt/bin/hyperpodrun --no-python ./run.sh\n", "./run.sh\n"),
        (
            "hyperpodrun --tee 3 \\\n  'my script.py' a | tee log",
            "python 'my script.py' a | tee log",
        ),
        (
            "# torchrun starts the workers\n  torchrun --nproc-per-node=2 t.py\n",
            "# torchrun starts the workers\n  python t.py\n",
        ),
    ],
)
def test_shell_launchers_taken_off(script: str, expected: str) -> None:
    document = manifest()
    container = document["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["command"] = ["/bin/sh", "-c", script]
    assert convert_hyperpod(document).job.spec.command == ["/bin/sh", "-c", expected]


def test_warnings_shown_in_coming_from_hyperpod_are_what_convert_says() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-hyperpod.md").read_text()
    block = re.search(r"## Converting a manifest\n.*?```text\n(.*?)```", doc, re.DOTALL)
    assert block is not None, "docs/coming-from-hyperpod.md lost its resurge convert warnings"
    said = {
        f"resurge convert: warning: {note}"
        for note in convert_hyperpod_yaml(PRETRAIN.read_text()).notes
    }
    shown = block.group(1).splitlines()
    assert shown and set(shown) <= said
