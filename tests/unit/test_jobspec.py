import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from resurge.events import FaultScope, JobPhase, RecoveryLevel
from resurge.jobspec import JobSpecError, TrainingJob, load_job, parse_job

REPO = Path(__file__).resolve().parents[2]


def minimal(**spec: object) -> dict[str, object]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"command": ["python", "train.py"], **spec},
    }


def test_hyperpod_names_are_accepted() -> None:
    job = parse_job(minimal(nprocPerNode=4, recovery={"jobMaxRetryCount": 7}))
    assert job.spec.nproc_per_node == 4
    assert job.spec.recovery.max_restarts == 7
    assert job.spec.replicas.min == 1 and job.spec.replicas.max is None


def test_unknown_field_is_named() -> None:
    with pytest.raises(
        JobSpecError, match=r"unknown field spec\.nprocPerNod, did you mean nprocPerNode\?"
    ):
        parse_job(minimal(nprocPerNod=2))


def test_unknown_field_with_no_close_name_lists_the_known_ones() -> None:
    with pytest.raises(JobSpecError, match=r"unknown field spec\.zzz \(known here: .*nprocPerNode"):
        parse_job(minimal(zzz=2))


def test_wrong_shape_reads_as_a_sentence() -> None:
    with pytest.raises(JobSpecError, match=r"spec\.replicas must be a mapping, not a whole number"):
        parse_job(minimal(replicas=2))


def test_a_file_that_does_not_validate_is_named(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(minimal(nprocsPerNode=2)))
    with pytest.raises(JobSpecError, match=rf"^{re.escape(str(path))}: invalid TrainingJob: "):
        load_job(path)


def test_bad_values_are_named() -> None:
    with pytest.raises(JobSpecError, match=r"spec\.replicas: .*replicas.max \(1\) is below"):
        parse_job(minimal(replicas={"min": 2, "max": 1}))
    with pytest.raises(JobSpecError, match=r"metadata\.name"):
        parse_job({**minimal(), "metadata": {"name": "Bad_Name"}})
    with pytest.raises(JobSpecError, match=r"spec\.command"):
        parse_job(minimal(command=[]))
    with pytest.raises(JobSpecError, match="kind"):
        parse_job({**minimal(), "kind": "Pod"})


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="mapping"):
        parse_job(["a"])
    path = tmp_path / "bad.yaml"
    path.write_text("spec: [unclosed")
    with pytest.raises(JobSpecError, match="not valid YAML"):
        load_job(path)


def test_example_job_loads() -> None:
    job = load_job(REPO / "examples" / "crash_once" / "job.yaml")
    assert job.name == "crash-once"
    assert job.spec.replicas.min == 2


# The full TrainingJob: every section, HyperPod's names, errors, docs/jobspec.md.

DOC = REPO / "docs" / "jobspec.md"
RULE = {"name": "oom", "logPattern": ".*out of memory.*", "faultOnMatch": True}


def doc_example() -> dict[str, Any]:
    block = re.search(r"## Full example\n.*?```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert block is not None, "docs/jobspec.md lost its full example"
    document = yaml.safe_load(block.group(1))
    assert isinstance(document, dict)
    return document


def monitoring(*rules: dict[str, object], key: str = "logRules") -> dict[str, object]:
    return minimal(monitoring={key: list(rules)})


def test_full_example_in_the_docs_parses_with_every_section() -> None:
    job = parse_job(doc_example())
    spec = job.spec
    assert (spec.image, spec.priority, spec.priority_class_name, spec.queue) == (
        "registry.example.com/llama-train:1.4",
        100,
        "training-high",
        "team-nlp",
    )
    assert spec.template == {
        "spec": {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}
    }
    assert spec.replicas.allowed_sizes() == [2, 4, 6, 8] and spec.replicas.elastic
    assert (
        spec.elastic.cooldown_seconds,
        spec.elastic.scale_up_snooze_seconds,
        spec.elastic.checkpoint_timeout_seconds,
        spec.elastic.scaling_timeout_seconds,
    ) == (120, 300, 60, 600)
    assert spec.recovery.levels == [
        RecoveryLevel.IN_PROCESS,
        RecoveryLevel.PROCESS,
        RecoveryLevel.NODE,
        RecoveryLevel.JOB,
    ]
    assert spec.recovery.max_restarts_per_level == {RecoveryLevel.IN_PROCESS: 5, "process": 3}
    assert (spec.recovery.backoff.initial_seconds, spec.recovery.spares) == (2.0, 1)
    assert [rule.name for rule in spec.monitoring.log_rules] == [
        "JobStart",
        "TrainingHang",
        "LossSpike",
        "CudaOutOfMemory",
    ]
    spike = spec.monitoring.log_rules[2]
    assert (spike.metric_threshold, spike.operator, spike.action) == (2.5, "gt", "alert")
    assert spec.monitoring.log_rules[0].ranks == [0]
    assert spec.monitoring.straggler.slow_factor == 1.5
    assert spec.monitoring.gpu.xid_overrides[79] == "replace_node"
    assert (spec.checkpoint.dir, spec.checkpoint.interval_steps) == (
        "/fsx/checkpoints/llama-pretrain",
        500,
    )
    assert job.status is not None
    assert job.status.phase is JobPhase.RUNNING
    assert job.status.restarts == {RecoveryLevel.PROCESS: 2, RecoveryLevel.NODE: 1}
    assert job.status.last_fault is not None and job.status.last_fault.scope is FaultScope.NODE
    assert job.status.latest_checkpoint is not None
    assert job.status.latest_checkpoint.step == 12000


def models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in models_in(arg)]


def wire_names(model: type[BaseModel]) -> set[str]:
    """The YAML name of every field of ``model`` and of the models inside it."""
    names = set()
    for field in model.model_fields.values():
        assert field.description, f"{model.__name__} has a field without a description"
        assert field.alias is not None
        names.add(field.alias)
        for inner in models_in(field.annotation):
            names |= wire_names(inner)
    return names


def keys_in(document: object) -> set[str]:
    if isinstance(document, dict):
        return {str(key) for key in document} | {k for v in document.values() for k in keys_in(v)}
    if isinstance(document, list):
        return {key for item in document for key in keys_in(item)}
    return set()


def test_every_field_is_described_documented_and_in_the_example() -> None:
    names = wire_names(TrainingJob)
    assert {"logRules", "xidOverrides", "lastFault", "initialSeconds", "intervalSteps"} <= names
    # Every wire name appears in some `code span` of the docs, alone or in a dotted path.
    prose = re.sub(r"```.*?```", "", DOC.read_text(), flags=re.DOTALL)
    spans = re.findall(r"`([^`]+)`", prose)
    documented = {word for span in spans for word in re.findall(r"\w+", span)}
    assert not sorted(names - documented), "docs/jobspec.md does not describe these fields"
    left_out = names - keys_in(doc_example()) - {"discrete"}  # excludes step, which is set
    assert not sorted(left_out), "the full example leaves these out"


def test_round_trips_by_alias_and_by_name() -> None:
    job = parse_job(doc_example())
    assert parse_job(json.loads(job.model_dump_json(by_alias=True))) == job
    assert parse_job(json.loads(job.model_dump_json())) == job


@pytest.mark.parametrize("key", ["logRules", "logMonitoringConfiguration", "log_rules"])
def test_log_rules_accept_either_spelling(key: str) -> None:
    job = parse_job(monitoring(RULE, key=key))
    assert [rule.name for rule in job.spec.monitoring.log_rules] == ["oom"]
    assert job.spec.monitoring.log_rules[0].fault_on_match is True


def test_log_rules_spelled_twice_are_rejected() -> None:
    document = minimal(monitoring={"logRules": [RULE], "logMonitoringConfiguration": [RULE]})
    with pytest.raises(JobSpecError, match=r"logRules and logMonitoringConfiguration name the"):
        parse_job(document)


def test_hyperpod_recovery_names() -> None:
    job = parse_job(
        minimal(
            recovery={
                "jobMaxRetryCount": 9,
                "numRestartBeforeFullJobRestart": 3,
                "evalPeriodSeconds": 21600,
                "maxFullJobRestarts": 1,
                "faultyScaleDownTimeoutInSeconds": 30,
                "spares": 2,
            }
        )
    )
    recovery = job.spec.recovery
    assert recovery.max_restarts == 9
    assert recovery.num_restart_before_full_job_restart == 3
    assert recovery.eval_period_seconds == 21600
    assert recovery.max_full_job_restarts == 1
    assert recovery.faulty_scale_down_timeout_seconds == 30
    assert recovery.spares == 2
    assert recovery.levels == list(RecoveryLevel)
    # HyperPod writes nprocPerNode as a string.
    assert parse_job(minimal(nprocPerNode="8")).spec.nproc_per_node == 8


@pytest.mark.parametrize(
    ("field", "pattern"), [("logPattern", "(unclosed"), ("stopPattern", "[a-")]
)
def test_bad_regex_names_the_rule(field: str, pattern: str) -> None:
    rule = {**RULE, "name": "broken", field: pattern}
    with pytest.raises(JobSpecError, match=rf"logRules\.1\.{field}: rule 'broken': {field}"):
        parse_job(monitoring(RULE | {"name": "fine"}, rule))


def test_bad_regex_is_named_in_hyperpods_spelling() -> None:
    rule = {**RULE, "logPattern": "("}
    with pytest.raises(JobSpecError, match=r"logMonitoringConfiguration\.0\.logPattern: rule"):
        parse_job(monitoring(rule, key="logMonitoringConfiguration"))


def test_duplicate_rule_names_are_rejected() -> None:
    with pytest.raises(JobSpecError, match=r"spec\.monitoring\.logRules: .*unique: oom"):
        parse_job(monitoring(RULE, {**RULE, "logPattern": "other"}))


def test_bad_operator_lists_the_allowed_values() -> None:
    rule = {"name": "loss", "logPattern": r"loss (\d+)", "metricThreshold": 2, "operator": "ge"}
    with pytest.raises(JobSpecError) as caught:
        parse_job(monitoring(rule))
    assert "spec.monitoring.logRules.0.operator: Input should be" in str(caught.value)
    assert all(f"'{op}'" in str(caught.value) for op in ("gt", "lt", "eq", "gteq", "lteq"))


def test_metric_rules_need_operator_group_and_a_check() -> None:
    with pytest.raises(JobSpecError, match="rule 'loss': metricThreshold and operator go"):
        parse_job(monitoring({"name": "loss", "logPattern": r"(\d+)", "metricThreshold": 2}))
    with pytest.raises(JobSpecError, match="rule 'loss': metricThreshold needs a capturing"):
        parse_job(
            monitoring(
                {"name": "loss", "logPattern": "loss", "metricThreshold": 2, "operator": "gt"}
            )
        )
    with pytest.raises(JobSpecError, match="rule 'idle' checks nothing"):
        parse_job(monitoring({"name": "idle", "logPattern": "x"}))
    rule = parse_job(
        monitoring(
            {"name": "loss", "logPattern": r"(\d+)", "metricThreshold": 0.25, "operator": "lteq"}
        )
    ).spec.monitoring.log_rules[0]
    assert (rule.metric_threshold, rule.metric_evaluation_data_points) == (0.25, 1)


def test_discrete_sizes_outside_min_max_are_rejected() -> None:
    with pytest.raises(
        JobSpecError, match=r"spec\.replicas: .*discrete sizes \[1, 16\] are outside"
    ):
        parse_job(minimal(replicas={"min": 2, "max": 8, "discrete": [1, 4, 16]}))
    with pytest.raises(JobSpecError, match=r"spec\.replicas\.discrete: .*\[4\] more than once"):
        parse_job(minimal(replicas={"min": 2, "max": 8, "discrete": [4, 2, 4]}))


def test_step_and_discrete_exclude_each_other() -> None:
    with pytest.raises(
        JobSpecError, match=r"spec\.replicas: replicas\.step and replicas\.discrete"
    ):
        parse_job(minimal(replicas={"min": 2, "max": 8, "step": 2, "discrete": [2, 4]}))


@pytest.mark.parametrize(
    ("replicas", "sizes"),
    [
        ({}, [1]),
        ({"min": 3}, [3]),
        ({"min": 2, "max": 2, "step": 4}, [2]),
        ({"min": 1, "max": 4}, [1, 2, 3, 4]),
        ({"min": 2, "max": 8, "step": 2}, [2, 4, 6, 8]),
        ({"min": 1, "max": 6, "step": 2}, [1, 3, 5]),
        ({"min": 2, "max": 8, "discrete": [8, 2, 4]}, [2, 4, 8]),
    ],
)
def test_allowed_sizes(replicas: dict[str, object], sizes: list[int]) -> None:
    assert parse_job(minimal(replicas=replicas)).spec.replicas.allowed_sizes() == sizes


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            {"monitoring": {"logRules": [{**RULE, "logPatern": "x"}]}},
            "monitoring.logRules.0.logPatern",
        ),
        ({"recovery": {"backoff": {"initial": 1}}}, "recovery.backoff.initial"),
        ({"monitoring": {"straggler": {"slowFactr": 2}}}, "monitoring.straggler.slowFactr"),
        ({"checkpoint": {"everySteps": 5}}, "checkpoint.everySteps"),
    ],
)
def test_unknown_nested_field_is_named_by_its_full_path(spec: dict[str, object], path: str) -> None:
    with pytest.raises(JobSpecError, match=rf"unknown field spec\.{re.escape(path)}\b"):
        parse_job(minimal(**spec))


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("8Gi", 8 * 2**30),
        ("512Mi", 512 * 2**20),
        ("1G", 10**9),
        ("1.5Gi", 3 * 2**29),
        ("1500000000", 1_500_000_000),
        ("2e9", 2 * 10**9),
        (1_500_000_000, 1_500_000_000),
        (2e9, 2 * 10**9),
    ],
)
def test_a_memory_budget_is_a_quantity_or_bytes(given: object, size: int) -> None:
    spec = parse_job(minimal(checkpoint={"memoryBudget": given})).spec
    assert spec.checkpoint.memory_budget == size
    assert parse_job(minimal()).spec.checkpoint.memory_budget is None  # no budget


@pytest.mark.parametrize(
    "given", [0, "0", -1, "-1Gi", "8 gigs", "8GB", "0.5", 1.5, "1e999", True, [8], "", "1500m"]
)
def test_a_bad_memory_budget_is_named_with_its_value(given: object) -> None:
    named = rf"spec\.checkpoint\.memoryBudget: {re.escape(repr(given))} is not a memory size"
    with pytest.raises(JobSpecError, match=named):
        parse_job(minimal(checkpoint={"memoryBudget": given}))


def test_recovery_levels_follow_the_ladder() -> None:
    with pytest.raises(JobSpecError, match="in ladder order: in_process, process, pod, node, job"):
        parse_job(minimal(recovery={"levels": ["node", "process"]}))
    with pytest.raises(JobSpecError, match=r"levels\.0: Input should be 'in_process', 'process'"):
        parse_job(minimal(recovery={"levels": ["restart"]}))
    with pytest.raises(JobSpecError, match=r"limit for node, which is not in recovery\.levels"):
        parse_job(
            minimal(recovery={"levels": ["process", "job"], "maxRestartsPerLevel": {"node": 1}})
        )
    with pytest.raises(JobSpecError, match=r"backoff: backoff\.maxSeconds \(1\.0\) is below"):
        parse_job(minimal(recovery={"backoff": {"initialSeconds": 5, "maxSeconds": 1}}))


def test_xid_overrides_and_status_list_allowed_values() -> None:
    with pytest.raises(JobSpecError, match=r"xidOverrides\.79: Input should be 'restart_process'"):
        parse_job(minimal(monitoring={"gpu": {"xidOverrides": {79: "reboot"}}}))
    with pytest.raises(JobSpecError, match=r"status\.phase: Input should be 'Pending', 'Running'"):
        parse_job({**minimal(), "status": {"phase": "Done"}})
    status = parse_job({**minimal(), "status": {}}).status
    assert status is not None and status.phase is JobPhase.PENDING and status.restarts == {}
    assert parse_job(minimal()).status is None


@pytest.mark.parametrize("first", ["resurge.jobspec", "resurge.events"])
def test_either_package_imports_first(first: str) -> None:
    # resurge.events embeds TrainingJob; both take their shared enums from
    # resurge.contract.vocabulary.
    code = (
        f"import {first}\n"
        "from resurge.events import EVENT_ADAPTER\n"
        "from resurge.jobspec import RecoverySpec\n"
        "assert RecoverySpec().levels[0].value == 'in_process'\n"
        "assert 'TrainingJob' in EVENT_ADAPTER.json_schema()['$defs']\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_hyperpod_restart_policy_block_is_accepted_inside_recovery() -> None:
    job = parse_job(
        {
            "metadata": {"name": "hp"},
            "spec": {
                "command": ["x"],
                "recovery": {
                    "jobMaxRetryCount": 7,
                    "restartPolicy": {
                        "numRestartBeforeFullJobRestart": 3,
                        "evalPeriodSeconds": 1800,
                        "maxFullJobRestarts": 1,
                    },
                },
            },
        }
    )
    recovery = job.spec.recovery
    assert recovery.max_restarts == 7 and recovery.num_restart_before_full_job_restart == 3
    assert recovery.eval_period_seconds == 1800 and recovery.max_full_job_restarts == 1
    with pytest.raises(JobSpecError, match="restartPolicy"):
        parse_job(
            {
                "metadata": {"name": "hp"},
                "spec": {"command": ["x"], "recovery": {"restartPolicy": {"cleanPodPolicy": 1}}},
            }
        )


@pytest.mark.parametrize("name", ["dict", "list", "int", "str"])
def test_an_unknown_field_named_like_a_yaml_type_is_still_named(name: str) -> None:
    # pydantic's union members' type names (dict, list, ...) are dropped from a path;
    # an unknown field of that name is not such a tag (found by the property tests).
    with pytest.raises(JobSpecError, match=rf"unknown field spec\.{name}\b"):
        parse_job({"metadata": {"name": "a"}, "spec": {"command": ["x"], name: 1}})
    with pytest.raises(JobSpecError, match=rf"unknown field {name} "):
        parse_job({"metadata": {"name": "a"}, "spec": {"command": ["x"]}, name: 1})
