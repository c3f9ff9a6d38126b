"""The Kueue Workload of a queued TrainingJob and the reading of Kueue's answer
(resurge.cluster.kubernetes.kueue), as pure functions."""

from __future__ import annotations

from typing import Any

from resurge.cluster.kubernetes.kueue import (
    admission_of,
    flavor_node_labels,
    queue_of,
    with_node_labels,
    workload_manifest,
    workload_name,
)

TRAINING_JOB: dict[str, Any] = {
    "apiVersion": "resurge.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {
        "name": "llama",
        "namespace": "team-a",
        "uid": "0123456789",
        "labels": {
            "kueue.x-k8s.io/queue-name": "team-a-queue",
            "kueue.x-k8s.io/priority-class": "prod",
        },
    },
    "spec": {"command": ["python"], "template": {"spec": {"nodeSelector": {"zone": "a"}}}},
}
POD: dict[str, Any] = {
    "spec": {
        "containers": [
            {
                "name": "trainer",
                "image": "train:1",
                "command": ["resurge-node-agent", "launch"],
                "env": [{"name": "SECRET", "value": "x"}],
                "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"memory": "1Gi"}},
            }
        ],
        "nodeSelector": {"zone": "a"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"pinned": "to one node"}},
    }
}


def test_the_queue_is_the_label_else_the_spec_field() -> None:
    assert queue_of(TRAINING_JOB) == "team-a-queue"
    assert queue_of({"metadata": {}, "spec": {"queue": "q"}}) == "q"
    assert queue_of({"metadata": {"labels": {}}, "spec": {}}) is None


def test_the_workload_is_one_pod_set_owned_by_the_job_at_its_priority_class() -> None:
    workload = workload_manifest(TRAINING_JOB, POD, count=4, priority=1000)
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert workload["metadata"]["name"] == "trainingjob-llama-01234"
    assert workload["metadata"]["namespace"] == "team-a"
    [owner] = workload["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", "0123456789", True)
    spec = workload["spec"]
    assert spec["queueName"] == "team-a-queue"
    assert (spec["priorityClassName"], spec["priority"]) == ("prod", 1000)
    assert spec["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"
    [podset] = spec["podSets"]
    assert (podset["name"], podset["count"]) == ("workers", 4)
    template = podset["template"]["spec"]
    # What Kueue needs: requests, selector, tolerations; not the node pin, env or command.
    assert template["containers"] == [
        {"name": "trainer", "image": "train:1", "resources": {"requests": {"nvidia.com/gpu": "8"}}}
    ]
    assert template["nodeSelector"] == {"zone": "a"}
    assert template["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert "affinity" not in template


def test_no_priority_class_without_its_value() -> None:
    """Kueue's schema: priority must be set where priorityClassName is."""
    spec = workload_manifest(TRAINING_JOB, POD, count=1, priority=None)["spec"]
    assert "priorityClassName" not in spec and "priority" not in spec


def test_a_long_name_is_cut_and_keeps_the_uid() -> None:
    job = {"metadata": {"name": "x" * 100, "uid": "abcdef"}}
    name = workload_name(job)
    assert len(name) == 63 and name.endswith("-abcde")


def _condition(kind: str, status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": kind, "message": ""}


def test_admission_needs_the_admission_and_the_admitted_condition() -> None:
    workload: dict[str, Any] = {"spec": {"podSets": [{"name": "workers", "count": 4}]}}
    assert not admission_of(workload).admitted
    workload["status"] = {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "workers", "count": 3, "flavors": {"nvidia.com/gpu": "a100", "cpu": "x"}}
            ],
        },
        "conditions": [_condition("QuotaReserved")],
    }
    assert not admission_of(workload).admitted  # quota reserved, admission checks pending
    workload["status"]["conditions"].append(_condition("Admitted"))
    admission = admission_of(workload)
    assert (admission.admitted, admission.count, admission.flavors) == (True, 3, ("a100", "x"))
    workload["status"]["conditions"] = [_condition("Admitted", "False"), _condition("Evicted")]
    admission = admission_of(workload)
    assert (admission.admitted, admission.count, admission.evicted) == (False, 0, True)


def test_the_flavors_node_labels_join_the_templates_selector() -> None:
    labels = flavor_node_labels(
        [
            {"spec": {"nodeLabels": {"gpu": "a100"}}},
            {"spec": {}},
            {"spec": {"nodeLabels": {"z": "1"}}},
        ]
    )
    assert labels == {"gpu": "a100", "z": "1"}
    changed = with_node_labels(TRAINING_JOB, labels)
    assert changed["spec"]["template"]["spec"]["nodeSelector"] == {
        "zone": "a",
        "gpu": "a100",
        "z": "1",
    }
    assert TRAINING_JOB["spec"]["template"]["spec"]["nodeSelector"] == {"zone": "a"}
    bare = with_node_labels({"metadata": {}, "spec": {}}, {"gpu": "a100"})
    assert bare["spec"]["template"] == {"spec": {"nodeSelector": {"gpu": "a100"}}}


def test_an_elastic_jobs_parts_and_the_replicas_they_allow() -> None:
    from resurge.cluster.kubernetes.kueue import Admission, allowed_replicas, part_of

    elastic = workload_manifest(TRAINING_JOB, POD, count=2, part="elastic")
    assert elastic["metadata"]["name"] == "trainingjob-llama-01234-elastic"
    assert part_of(elastic) == "elastic"
    assert part_of(workload_manifest(TRAINING_JOB, POD, count=1)) == "base"
    assert part_of({"metadata": {}}) == "base"
    yes = Admission(admitted=True, count=2, flavors=(), evicted=False, finished=False)
    no = Admission(admitted=False, count=0, flavors=(), evicted=True, finished=False)
    assert allowed_replicas(None, None, (1, 3)) == 0
    assert allowed_replicas(no, yes, (1, 3)) == 0  # no base, no job
    assert allowed_replicas(yes, None, (1, 3)) == 1
    assert allowed_replicas(yes, no, (1, 3)) == 1  # the elastic part preempted
    assert allowed_replicas(yes, yes, (1, 3)) == 3
