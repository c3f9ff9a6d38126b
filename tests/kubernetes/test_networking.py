"""How a job's pods reach each other on Kubernetes: names valid for every job name, pod
networking by default (a DNS name per pod through the job's headless Service), the
host network as an option. Against the API emulator over HTTP with the official client
and a real nats-server (the fixtures of conftest.py); pods are created, never run.

The rules followed: "DNS for Services and Pods", A/AAAA records and Pod's hostname and
subdomain fields (https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/):
a pod with ``spec.hostname`` and ``spec.subdomain`` naming a headless Service in its
namespace is ``<hostname>.<subdomain>.<namespace>.svc.<cluster-domain>``; Service names
are RFC 1035 labels ("Object Names and IDs",
https://kubernetes.io/docs/concepts/overview/working-with-objects/names/).
"""

from __future__ import annotations

import re
from typing import Any

from resurge.cluster import ClusterBackend, WorkerGroupSpec
from resurge.cluster.names import service_name, worker_hostname
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, until
from tests.kubernetes.test_backend import group, training_job

RFC_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
RFC_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def host_network_job(name: str) -> dict[str, Any]:
    return training_job(name, template={"spec": {"hostNetwork": True}})


def group_of(cluster: ClusterBackend, training: dict[str, Any], replica: int) -> WorkerGroupSpec:
    """Replica ``replica``'s group on n1, as the scaler makes it: with the domain the
    backend gives the job (resurge.control.decisions.worker_groups)."""
    job = parse_job(training)
    spec = group(job.name, replica, "n1")
    return spec.model_copy(update={"domain": cluster.worker_domain(job)})


async def test_a_job_named_like_a_model_version_gets_a_valid_service_and_pod_dns_names(
    kube_api_thread: KubeApi,
    backend: ClusterBackend,
    controller: Running,
) -> None:
    """``llama-3.1-8b`` passes the CRD's name pattern but is no RFC 1035 label: the Service
    gets a derived name, and the pods name it as their subdomain."""
    job = "llama-3.1-8b"
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job(job))
    await backend.create_worker_group(group_of(backend, training_job(job), 0))
    [pod] = await until("its pod", lambda: pods_of(kube_api_thread, job))
    [service] = await until("its Service", lambda: kube_api_thread.objects("services", "default"))

    name = service["metadata"]["name"]
    assert RFC_1035_LABEL.match(name) and name == service_name(job), name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"resurge.dev/job": job}
    spec = pod["spec"]
    assert spec["subdomain"] == name
    assert RFC_1123_LABEL.match(spec["hostname"]), spec["hostname"]
    assert spec["hostname"] == worker_hostname(group(job, 0, "n1"))
    domain = f"{name}.default.svc"
    assert WorkerGroupSpec.model_validate_json(
        pod["metadata"]["annotations"]["resurge.dev/worker-group"]
    ) == group(job, 0, "n1").model_copy(update={"domain": domain})
    assert "hostNetwork" not in spec and "dnsPolicy" not in spec

    await backend.delete_worker_group(job, 0, "n1")
    await until("its Service gone", lambda: not kube_api_thread.objects("services", "default"))


async def test_the_host_network_is_an_option_of_the_job_template(
    kube_api_thread: KubeApi,
    backend: ClusterBackend,
    controller: Running,
) -> None:
    """``spec.template.spec.hostNetwork: true`` runs the pods on the host network: no
    hostname or subdomain (the node's name and address are the pod's), and the DNS
    policy that still resolves the cluster's names."""
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", host_network_job("hostnet"))
    await backend.create_worker_group(group_of(backend, host_network_job("hostnet"), 0))
    [pod] = await until("its pod", lambda: pods_of(kube_api_thread, "hostnet"))
    spec = pod["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostname" not in spec and "subdomain" not in spec


async def test_a_worker_group_is_reached_at_its_pod_dns_name_or_at_its_node(
    backend: ClusterBackend,
    bus: Bus,
    settings: Settings,
) -> None:
    """The backend says under which DNS domain a job's worker groups are reached: the
    Service's, in the backend's namespace (``.svc``, resolved through the pod's search
    path whatever the cluster domain); none on the host network (the node's address)."""
    job = parse_job(training_job("llama-3.1-8b"))
    assert backend.worker_domain(job) == f"{service_name(job.name)}.default.svc"
    assert backend.worker_domain(parse_job(host_network_job("hostnet"))) is None

    from resurge.cluster.kubernetes.backend import KubernetesBackend

    assert isinstance(backend, KubernetesBackend)
    everywhere = KubernetesBackend(
        bus, backend.records, backend.kube, settings.model_copy(update={"kube_host_network": True})
    )
    assert everywhere.worker_domain(job) is None
    pod_network = training_job("podnet", template={"spec": {"hostNetwork": False}})
    assert everywhere.worker_domain(parse_job(pod_network)) == "podnet.default.svc"
