"""The accelerator is a setting: which resource a job's pods request (the template's,
``spec.accelerator``, or none for a CPU-only job) and which a node's slots count (its
allocatable of the installation's ``kube_accelerator``, whatever its monitor's
``--gpus`` says)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from resurge.cluster import NodeInfo, WorkerGroupSpec
from resurge.cluster.kubernetes.objects import node_info, pod_manifest, report_patch
from resurge.jobspec import JobSpecError, parse_job
from resurge.jobspec.accelerator import job_accelerator

GROUP = WorkerGroupSpec(job="llama", replica=0, node="n1", nproc=4, command=["python", "t.py"])


def training_job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "llama", "namespace": "team", "uid": "u-1"},
        "spec": {"command": ["python", "t.py"], **spec},
    }


def document(**spec: Any) -> dict[str, Any]:
    """The job as ``kubectl apply`` takes it (no uid)."""
    job = training_job(**spec)
    del job["metadata"]["uid"]
    return job


def with_resources(**resources: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "resources": resources}]}}


def resources(job: dict[str, Any] | None) -> dict[str, Any]:
    resources: dict[str, Any] = pod_manifest(GROUP, job, {}, "img")["spec"]["containers"][0].get(
        "resources", {}
    )
    return resources


def test_a_cpu_only_job_requests_no_accelerator() -> None:
    assert resources(training_job()) == {}
    assert resources(None) == {}
    cpu = with_resources(limits={"cpu": "4", "memory": "8Gi"}, requests={"cpu": "2"})
    assert resources(training_job(template=cpu)) == {
        "limits": {"cpu": "4", "memory": "8Gi"},
        "requests": {"cpu": "2"},
    }


@pytest.mark.parametrize(
    "accelerator",
    ["nvidia.com/gpu", "aws.amazon.com/neuroncore", "amd.com/gpu", "nvidia.com/mig-1g.10gb"],
)
def test_the_templates_accelerator_is_requested_one_per_worker(accelerator: str) -> None:
    """As HyperPod and Kubeflow manifests write it: the count is resurge's, per pod."""
    template = with_resources(limits={accelerator: 8, "vpc.amazonaws.com/efa": 4})
    assert resources(training_job(template=template)) == {
        "limits": {accelerator: "4", "vpc.amazonaws.com/efa": 4},
        "requests": {accelerator: "4"},
    }


def test_spec_accelerator_names_it_where_the_template_does_not() -> None:
    assert resources(training_job(accelerator="aws.amazon.com/neuron")) == {
        "limits": {"aws.amazon.com/neuron": "4"},
        "requests": {"aws.amazon.com/neuron": "4"},
    }
    # One the built-in list does not know, named by the job.
    assert job_accelerator({"accelerator": "example.com/npu"}) == "example.com/npu"


def test_other_extended_resources_are_no_accelerator() -> None:
    template = with_resources(limits={"vpc.amazonaws.com/efa": 1, "hugepages-2Mi": "1Gi"})
    assert job_accelerator({"template": template}) is None


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {
                "accelerator": "amd.com/gpu",
                "template": with_resources(limits={"nvidia.com/gpu": 8}),
            },
            "spec.accelerator is amd.com/gpu but spec.template.spec.containers[0].resources "
            "names nvidia.com/gpu",
        ),
        (
            {"template": with_resources(limits={"nvidia.com/gpu": 8}, requests={"amd.com/gpu": 1})},
            "names 2 accelerators (amd.com/gpu, nvidia.com/gpu)",
        ),
        ({"accelerator": "gpu"}, "spec.accelerator: String should match pattern"),
        ({"accelerator": "node.kubernetes.io/gpu"}, "spec.accelerator 'node.kubernetes.io/gpu'"),
    ],
)
def test_an_accelerator_that_cannot_be_is_an_error_naming_the_field(
    spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job(document(**spec))
    assert words in str(caught.value)


def test_the_same_accelerator_in_both_places_is_fine() -> None:
    template = with_resources(limits={"nvidia.com/gpu": 8})
    job = parse_job(document(accelerator="nvidia.com/gpu", template=template, nprocPerNode=8))
    assert job.spec.accelerator == "nvidia.com/gpu"


def node(allocatable: dict[str, str] | None, monitor_slots: int | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "n1"}, "status": {}}
    if allocatable is not None:
        obj["status"]["allocatable"] = {"cpu": "64", **allocatable}
    if monitor_slots is not None:
        report = NodeInfo(name="n1", slots=monitor_slots)
        obj["metadata"].update(copy.deepcopy(report_patch(None, report)["metadata"]))
    return obj


def test_a_nodes_slots_are_its_allocatable_not_its_monitors_default() -> None:
    """An 8-GPU node whose monitor runs with the old default (--gpus 1) offers 8."""
    assert node_info(node({"nvidia.com/gpu": "8"}, monitor_slots=1)).slots == 8
    assert node_info(node({"nvidia.com/gpu": "8"}, monitor_slots=None)).slots == 8
    assert node_info(node({"nvidia.com/gpu": "0"}, monitor_slots=2)).slots == 0
    # No device plugin advertises it (kind, an emulator): what the monitor reports.
    assert node_info(node(None, monitor_slots=2)).slots == 2
    assert node_info(node({}, monitor_slots=2)).slots == 2


def test_a_nodes_slots_count_the_installations_accelerator() -> None:
    trn = node({"aws.amazon.com/neuron": "16", "aws.amazon.com/neuroncore": "32"}, 0)
    assert node_info(trn, accelerator="aws.amazon.com/neuroncore").slots == 32
    assert node_info(trn, accelerator="aws.amazon.com/neuron").slots == 16
    mig = node({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu": "0"}, 1)
    assert node_info(mig, accelerator="nvidia.com/mig-1g.10gb").slots == 7


def test_a_count_not_one_device_per_worker_is_an_error_naming_both_fields() -> None:
    """Trainium: 16 aws.amazon.com/neuron devices hold 32 cores, one per process. Before,
    the pods asked for 32 devices, which no node has: Pending for ever."""
    template = with_resources(limits={"aws.amazon.com/neuron": 16})
    with pytest.raises(JobSpecError) as caught:
        parse_job(document(template=template, nprocPerNode=32))
    assert (
        "spec.template.spec.containers[0].resources.limits[aws.amazon.com/neuron] is 16 "
        "but nprocPerNode is 32" in str(caught.value)
    )
    assert "aws.amazon.com/neuroncore" in str(caught.value)
    cores = with_resources(limits={"aws.amazon.com/neuroncore": 32})
    assert parse_job(document(template=cores, nprocPerNode=32)).spec.nproc_per_node == 32


def test_a_template_asking_for_0_asks_for_none_and_a_placeholder_is_replaced() -> None:
    """HyperPod's task-governance example asks for ``nvidia.com/gpu: "0"``: its pods keep
    that 0. An envsubst placeholder left in (``$GPU_PER_NODE``) is no count: replaced."""
    zero = with_resources(limits={"nvidia.com/gpu": "0"}, requests={"nvidia.com/gpu": "0"})
    assert parse_job(document(template=zero, nprocPerNode=4)).spec.nproc_per_node == 4
    assert job_accelerator({"template": zero}) is None
    assert resources(training_job(template=zero)) == {
        "limits": {"nvidia.com/gpu": "0"},
        "requests": {"nvidia.com/gpu": "0"},
    }
    placeholder = with_resources(requests={"nvidia.com/gpu": "$GPU_PER_NODE"})
    assert parse_job(document(template=placeholder, nprocPerNode=8))
    assert resources(training_job(template=placeholder)) == {
        "limits": {"nvidia.com/gpu": "4"},
        "requests": {"nvidia.com/gpu": "4"},
    }
