"""The controller's TrainingJob side against the API emulator over real HTTP, with the
official client and a real nats-server: what is submitted when (metadata.generation),
the ``resurge.dev/cleanup`` finalizer and what a deletion leaves behind (nothing, even
while the controller was down), and a refused pod as an Event and a condition.

The emulator lacks a scheduler and kubelets: pods here are created and deleted, never run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client as k8s

from resurge.cluster import ClusterBackend, WorkerGroupSpec
from resurge.events import JobDeleted, JobSubmitted
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, services_of, training_job, until

FINALIZER = "resurge.dev/cleanup"
MERGE = "application/merge-patch+json"


def group(job: str, replica: int, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=replica, node=node, nproc=2, command=["python"])


def status_of(api: KubeApi, name: str) -> dict[str, Any]:
    return dict(api.get("trainingjobs", name).get("status") or {})


def condition(api: KubeApi, name: str, kind: str) -> dict[str, Any] | None:
    found = [c for c in status_of(api, name).get("conditions") or [] if c.get("type") == kind]
    return found[0] if found else None


def exists(api: KubeApi, name: str) -> bool:
    return any(tj["metadata"]["name"] == name for tj in api.objects("trainingjobs", "default"))


def custom(api: KubeApi) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api.api_client())


async def patch(api: KubeApi, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """A merge patch of the TrainingJob through the official client (``kubectl label``,
    ``kubectl patch --type=merge``)."""
    result = await asyncio.to_thread(
        custom(api).patch_namespaced_custom_object,
        "resurge.dev",
        "v1alpha1",
        "default",
        "trainingjobs",
        name,
        body,
        _content_type=MERGE,
    )
    assert isinstance(result, dict)
    return result


async def settled(api: KubeApi, jobs: Events, marker: str) -> None:
    """Every TrainingJob event before now acted on: the controller takes them in order,
    so once a TrainingJob created now is submitted, what came before it was handled."""
    api.create("trainingjobs", training_job(marker))
    await jobs.wait_for(
        lambda items: [e for e in items if isinstance(e, JobSubmitted) and e.job == marker]
    )


def submissions(jobs: Events, name: str) -> list[JobSubmitted]:
    return [e for e in jobs.of(JobSubmitted) if e.job == name]


# -- submitted on metadata.generation ---------------------------------------------------------


async def test_a_label_change_submits_nothing_and_a_finished_job_never_runs_again(
    kube_api_thread: KubeApi, controller: Running, jobs: Events
) -> None:
    """Defect 3: labels are metadata, not spec (they leave metadata.generation alone); a
    Succeeded job stays finished whatever is edited, until deleted and created again."""
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await jobs.wait_for(lambda items: submissions(jobs, "llama"))
    await until(
        "submittedGeneration 1",
        lambda: status_of(kube_api_thread, "llama").get("submittedGeneration") == 1,
    )
    await patch(kube_api_thread, "llama", {"metadata": {"labels": {"team": "vision"}}})
    await settled(kube_api_thread, jobs, "marker-1")
    assert len(submissions(jobs, "llama")) == 1, "a label change submitted the job again"

    # The job ends (as the status writer records it); then both kinds of edit.
    kube_api_thread.patch_status("trainingjobs", "llama", {"phase": "Succeeded"})
    await patch(kube_api_thread, "llama", {"metadata": {"labels": {"team": "audio"}}})
    await patch(
        kube_api_thread, "llama", {"spec": {"monitoring": {"heartbeatTimeoutSeconds": 900}}}
    )
    assert kube_api_thread.get("trainingjobs", "llama")["metadata"]["generation"] == 2
    await settled(kube_api_thread, jobs, "marker-2")
    assert len(submissions(jobs, "llama")) == 1, "a finished job ran again"
    assert status_of(kube_api_thread, "llama")["submittedGeneration"] == 1

    # Deleted and created again: a new object, a new run.
    kube_api_thread.delete("trainingjobs", "llama")
    await until("llama gone", lambda: not exists(kube_api_thread, "llama"))
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await jobs.wait_for(lambda items: len(submissions(jobs, "llama")) == 2)


async def test_a_spec_edit_of_a_running_job_is_submitted_again(
    kube_api_thread: KubeApi, controller: Running, jobs: Events
) -> None:
    """Defect 3: a new metadata.generation of a job that has not finished is submitted
    (the scaler applies what may change on a running job), once."""
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await jobs.wait_for(lambda items: submissions(jobs, "llama"))
    kube_api_thread.patch_status("trainingjobs", "llama", {"phase": "Running"})
    await patch(
        kube_api_thread, "llama", {"spec": {"monitoring": {"heartbeatTimeoutSeconds": 900}}}
    )
    [_, again] = await jobs.wait_for(
        lambda items: len(submissions(jobs, "llama")) == 2 and submissions(jobs, "llama")
    )
    assert again.spec.spec.monitoring.heartbeat_timeout_seconds == 900
    await until(
        "submittedGeneration 2",
        lambda: status_of(kube_api_thread, "llama").get("submittedGeneration") == 2,
    )
    await settled(kube_api_thread, jobs, "marker")
    assert len(submissions(jobs, "llama")) == 2


async def test_an_invalid_spec_fails_with_a_failed_condition_and_is_not_retried(
    kube_api_thread: KubeApi, controller: Running, jobs: Events
) -> None:
    """The controller's own status for a spec it rejects (one the CRD's schema lets
    through: a rule between fields): phase, message, the Failed condition
    (metav1.Condition) and the generation it judged."""
    replicas = {"min": 2, "max": 4, "step": 2, "discrete": [2, 4]}
    kube_api_thread.create("trainingjobs", training_job("bad", replicas=replicas))
    failed = await until(
        "the Failed condition", lambda: condition(kube_api_thread, "bad", "Failed")
    )
    status = status_of(kube_api_thread, "bad")
    assert status["phase"] == "Failed", status
    assert "replicas.step and replicas.discrete" in status["message"], status
    assert status["submittedGeneration"] == 1, status
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec", failed
    assert failed["observedGeneration"] == 1 and failed["lastTransitionTime"], failed
    assert failed["message"] == status["message"], failed
    await settled(kube_api_thread, jobs, "marker")
    assert not submissions(jobs, "bad")
    reasons = [e["reason"] for e in kube_api_thread.objects("events", "default")]
    assert reasons.count("InvalidSpec") == 1, reasons


async def test_an_invalid_edit_of_a_running_job_is_refused_and_the_job_runs_on(
    kube_api_thread: KubeApi, controller: Running, jobs: Events
) -> None:
    """An edit the CRD lets through but the models refuse (a log rule whose pattern does
    not compile) is a Warning Event; the running job keeps its spec and its phase (it
    was marked Failed while it ran on)."""
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await jobs.wait_for(lambda items: submissions(jobs, "llama"))
    kube_api_thread.patch_status("trainingjobs", "llama", {"phase": "Running"})
    rule = {"name": "loss", "logPattern": "loss: ("}
    await patch(kube_api_thread, "llama", {"spec": {"monitoring": {"logRules": [rule]}}})
    await until(
        "submittedGeneration 2",
        lambda: status_of(kube_api_thread, "llama").get("submittedGeneration") == 2,
    )
    status = status_of(kube_api_thread, "llama")
    assert status["phase"] == "Running", status
    assert condition(kube_api_thread, "llama", "Failed") is None

    def refusals() -> list[dict[str, Any]]:
        return [e for e in kube_api_thread.objects("events", "default")
                if e["reason"] == "InvalidEdit"]  # fmt: skip

    # The controller records the status, then the Event: awaited, not assumed.
    events = await until("the InvalidEdit Event", refusals)
    assert len(events) == 1 and "the edit is not applied" in events[0]["message"], events
    await settled(kube_api_thread, jobs, "marker")
    assert len(submissions(jobs, "llama")) == 1, "the refused edit reached the scaler"


# -- the finalizer, and nothing left behind -------------------------------------------------


async def test_a_deleted_training_job_is_cleaned_up_before_its_finalizer_goes(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Defect 4: every TrainingJob gets the finalizer; deleting it tells the job deleted,
    deletes its pods and Service, then lets the object go. Kubernetes documents the
    protocol: https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/
    ("the object remains in a terminating state while the control plane ... takes the
    actions defined by the finalizers", then removes the key)."""
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await until(
        "the finalizer",
        lambda: (
            FINALIZER
            in kube_api_thread.get("trainingjobs", "llama")["metadata"].get("finalizers", [])
        ),
    )
    await backend.create_worker_group(group("llama", 0, "n1"))
    await until(
        "its pod and Service",
        lambda: pods_of(kube_api_thread, "llama") and services_of(kube_api_thread, "llama"),
    )

    kube_api_thread.delete("trainingjobs", "llama")
    await jobs.wait_for(
        lambda items: [e for e in items if isinstance(e, JobDeleted) and e.job == "llama"]
    )
    await until("the TrainingJob gone", lambda: not exists(kube_api_thread, "llama"))
    assert not pods_of(kube_api_thread, "llama")
    assert not services_of(kube_api_thread, "llama")


async def test_deleted_while_the_controller_was_down_leaves_nothing_behind(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Defect 4, reproduced: a TrainingJob deleted while no controller runs. Held by the
    finalizer, the restarted controller cleans it up; one whose finalizer was removed by
    hand (or that never had it) went with its pods, and the restarted controller must
    neither recreate its pod (ownerless, with the fallback image) nor keep its records;
    and a pod and Service left without owner are swept."""
    kube_api_thread.add_node("n1", gpus=8)
    for name in ("held", "bare"):
        kube_api_thread.create("trainingjobs", training_job(name))
        await until(
            f"the finalizer on {name}",
            lambda n=name: (
                FINALIZER  # type: ignore[misc]
                in kube_api_thread.get("trainingjobs", n)["metadata"].get("finalizers", [])
            ),
        )
    await backend.create_worker_group(group("held", 0, "n1"))
    await backend.create_worker_group(group("bare", 0, "n1"))
    await until(
        "two pods", lambda: pods_of(kube_api_thread, "held") and pods_of(kube_api_thread, "bare")
    )
    # Left over by an older controller: an ownerless pod and Service of a job long gone.
    kube_api_thread.create("services", {
        "metadata": {"name": "stale", "labels": {"resurge.dev/job": "stale"}},
        "spec": {"clusterIP": "None", "selector": {"resurge.dev/job": "stale"}},
    })  # fmt: skip
    kube_api_thread.create("pods", {
        "metadata": {"name": "stale-0-abcde", "labels": {"resurge.dev/job": "stale"}},
        "spec": {"containers": [{"name": "agent", "image": "resurge:latest"}]},
    })  # fmt: skip

    await controller.stop()
    kube_api_thread.delete("trainingjobs", "held")
    await patch(kube_api_thread, "bare", {"metadata": {"finalizers": None}})
    kube_api_thread.delete("trainingjobs", "bare")
    assert not pods_of(kube_api_thread, "bare"), "garbage-collected with its owner"
    assert exists(kube_api_thread, "held"), "held by the finalizer"

    controller.start()
    deleted = await jobs.wait_for(
        lambda items: {e.job for e in items if isinstance(e, JobDeleted)} >= {"held", "bare"}
    )
    assert deleted
    await until("held gone", lambda: not exists(kube_api_thread, "held"))
    await until(
        "no pod and no Service left",
        lambda: (
            not kube_api_thread.objects("pods", "default")
            and not kube_api_thread.objects("services", "default")
        ),
    )
    # The scaler deletes a deleted job's records (here: as the scaler would).
    for name in ("held", "bare"):
        await backend.delete_worker_group(name, 0, "n1")
    await settled(kube_api_thread, jobs, "marker")
    assert not kube_api_thread.objects("pods", "default"), "a pod was made for a deleted job"


async def test_a_record_without_a_training_job_gets_no_pod(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Every pod has its TrainingJob as owner: a worker group of a job with none
    (``resurge submit`` on Kubernetes) gets no pod, and the job is told deleted."""
    kube_api_thread.add_node("n1", gpus=4)
    await settled(kube_api_thread, jobs, "marker")
    await backend.create_worker_group(group("cli-job", 0, "n1"))
    await jobs.wait_for(
        lambda items: [e for e in items if isinstance(e, JobDeleted) and e.job == "cli-job"]
    )
    assert not pods_of(kube_api_thread, "cli-job")


# -- refusals ---------------------------------------------------------------------------------


async def test_a_refused_pod_is_an_event_and_the_pods_refused_condition_until_one_is_made(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Defect 8: a pod the API refuses (here 403 Forbidden, as Pod Security admission
    answers: https://kubernetes.io/docs/concepts/security/pod-security-admission/) is a
    Warning Event on the TrainingJob and its ``PodsRefused`` condition, both with the
    API's message; once a pod is created the condition is False again. Conditions are
    metav1.Condition: https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/
    and the API conventions' "Typical status properties"."""
    message = (
        'pods "llama-0-x" is forbidden: violates PodSecurity "baseline:latest": '
        "host namespaces (hostNetwork=true)"
    )
    refusing = [True]
    status = {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
        "reason": "Forbidden", "code": 403,
    }  # fmt: skip
    kube_api_thread.call(
        lambda em: (
            em["post /api/v1/namespaces/default/pods"][lambda _: refusing[0]] << 403 << status
        )
    )
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await backend.create_worker_group(group("llama", 0, "n1"))

    refused = await until("PodsRefused", lambda: condition(kube_api_thread, "llama", "PodsRefused"))
    assert refused["status"] == "True" and refused["message"] == message, refused
    assert refused["reason"] == "FailedCreatePod" and refused["observedGeneration"] == 1, refused
    events = [
        e for e in kube_api_thread.objects("events", "default") if e["reason"] == "FailedCreatePod"
    ]
    assert events and events[0]["type"] == "Warning" and events[0]["message"] == message, events
    assert events[0]["involvedObject"]["name"] == "llama"
    assert not pods_of(kube_api_thread, "llama")

    refusing[0] = False  # the namespace's policy relaxed: the controller tries again
    await until("the pod", lambda: pods_of(kube_api_thread, "llama"))
    cleared = await until(
        "PodsRefused False",
        lambda: (
            (c := condition(kube_api_thread, "llama", "PodsRefused"))
            and c["status"] == "False"
            and c
        ),
    )
    assert cleared["reason"] == "PodCreated", cleared


async def test_a_job_an_older_controller_ran_is_not_run_again_after_an_upgrade(
    kube_api_thread: KubeApi, backend: ClusterBackend, jobs: Events
) -> None:
    """An older resurge recorded what it submitted in ``status.submittedSpec``, which the
    API server prunes now: a TrainingJob whose status has a phase was submitted before
    (a new object's status is empty: the status subresource ignores it on create), so a
    finished one stays finished, and a running one is submitted only as an edit."""
    kube_api_thread.create("trainingjobs", training_job("done"))
    kube_api_thread.patch_status("trainingjobs", "done", {"phase": "Succeeded"})
    kube_api_thread.create("trainingjobs", training_job("busy"))
    kube_api_thread.patch_status("trainingjobs", "busy", {"phase": "Running"})
    running = Running(backend)
    running.start()
    try:
        await settled(kube_api_thread, jobs, "marker")
    finally:
        await running.stop()
    assert not submissions(jobs, "done"), "a finished job ran again"
    assert [e.update for e in submissions(jobs, "busy")] == [True], "only as an edit"


async def test_a_refused_service_is_an_event_and_the_pods_refused_condition(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running
) -> None:
    """Defect 8, the Service: a job's headless Service the API refuses (here a quota,
    403 as the ResourceQuota admission answers:
    https://kubernetes.io/docs/concepts/policy/resource-quotas/) is the
    ``FailedCreateService`` Event and ``PodsRefused``; no pod is made without it."""
    message = 'services "llama" is forbidden: exceeded quota: services, requested: services=1'
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
              "reason": "Forbidden", "code": 403}  # fmt: skip
    kube_api_thread.call(lambda em: em["post /api/v1/namespaces/default/services"] << 403 << status)
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await backend.create_worker_group(group("llama", 0, "n1"))
    refused = await until("PodsRefused", lambda: condition(kube_api_thread, "llama", "PodsRefused"))
    assert (refused["status"], refused["reason"]) == ("True", "FailedCreateService"), refused
    assert refused["message"] == message, refused
    events = [
        e for e in kube_api_thread.objects("events", "default")
        if e["reason"] == "FailedCreateService"
    ]  # fmt: skip
    assert events and events[0]["message"] == message, events
    assert not pods_of(kube_api_thread, "llama")


async def test_a_training_job_the_controller_failed_to_act_on_is_tried_again(
    kube_api_thread: KubeApi, controller: Running, jobs: Events
) -> None:
    """A TrainingJob event the controller could not act on (the API answered 500 to its
    first write) is acted on again after a backoff, without waiting for another change
    of the object: as client-go's work queues requeue with rate limiting."""
    failures = [1]

    def first(_: object) -> bool:
        failing, failures[0] = failures[0] > 0, failures[0] - 1
        return failing

    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
              "reason": "InternalError", "message": "etcdserver: request timed out"}  # fmt: skip
    kube_api_thread.call(
        lambda em: (
            em["patch /apis/resurge.dev/v1alpha1/namespaces/default/trainingjobs/llama"][first]
            << 500
            << status
        )
    )
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await until(
        "the finalizer, at the second try",
        lambda: (
            FINALIZER
            in kube_api_thread.get("trainingjobs", "llama")["metadata"].get("finalizers", [])
        ),
    )
    assert failures[0] < 0, "the first try failed"
    await jobs.wait_for(lambda items: submissions(jobs, "llama"))
