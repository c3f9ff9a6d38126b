"""Names derived from a job's name (resurge.cluster.names): every job name the CRD's name
pattern allows gives a valid Service name and pod hostname, and distinct job names give
distinct Service names.

The rules are the API server's name validation, "Object Names and IDs"
(https://kubernetes.io/docs/concepts/overview/working-with-objects/names/): a Service's
name is an RFC 1035 label name, a pod's ``spec.hostname`` and ``spec.subdomain`` are
RFC 1123 labels ("DNS for Services and Pods", Pod's hostname and subdomain fields,
https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resurge.cluster.names import group_digest, service_name, worker_hostname
from resurge.cluster.protocol import WorkerGroupSpec
from resurge.jobspec.job import _NAME_PATTERN

RFC_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
RFC_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

JOB_NAMES = st.from_regex(_NAME_PATTERN, fullmatch=True)


def group(job: str, replica: int = 0, node: str = "n1", incarnation: int = 0) -> WorkerGroupSpec:
    return WorkerGroupSpec(
        job=job, replica=replica, node=node, nproc=1, command=["x"], incarnation=incarnation
    )


@given(JOB_NAMES)
def test_every_job_name_the_crd_allows_gives_an_rfc_1035_service_name(job: str) -> None:
    assert RFC_1035_LABEL.match(service_name(job)), service_name(job)


@given(JOB_NAMES, JOB_NAMES)
def test_two_job_names_never_share_a_service(first: str, second: str) -> None:
    if first != second:
        assert service_name(first) != service_name(second)


@given(
    JOB_NAMES,
    st.integers(min_value=0, max_value=10_000),
    st.text(min_size=1, max_size=80),
    st.integers(min_value=0, max_value=10_000),
)
def test_every_job_name_the_crd_allows_gives_an_rfc_1123_hostname(
    job: str, replica: int, node: str, incarnation: int
) -> None:
    name = worker_hostname(group(job, replica, node, incarnation))
    assert RFC_1123_LABEL.match(name), name
    assert name.endswith(f"-{replica}-{group_digest(group(job, replica, node, incarnation))}")


@pytest.mark.parametrize(
    ("job", "service"),
    [
        ("llama", "llama"),
        ("ddp-example", "ddp-example"),
        ("llama-3.1-8b", "llama-3-1-8b-"),
        ("70b-pretrain", "job-70b-pretrain-"),
        ("7", "job-7-"),
    ],
)
def test_a_service_name_is_the_job_name_where_it_can_be_and_readable_where_not(
    job: str, service: str
) -> None:
    if job == service:
        assert service_name(job) == job
    else:
        derived = service_name(job)
        assert derived.startswith(service) and re.fullmatch(r"[0-9a-f]{6}", derived[len(service) :])


def test_a_long_job_name_is_cut_to_one_label() -> None:
    job = "a" * 40 + "." + "b" * 22  # 63 characters, a dot: changed, then cut
    assert len(service_name(job)) == 63 and service_name(job).startswith("a" * 40 + "-b")
    assert len(worker_hostname(group(job, replica=12))) == 63


def test_pods_of_one_replica_on_other_nodes_or_incarnations_get_other_hostnames() -> None:
    names = {
        worker_hostname(group("llama-3.1-8b", 0, node, incarnation))
        for node in ("n1", "n2")
        for incarnation in (0, 1)
    }
    assert len(names) == 4
    assert all(n.startswith("llama-3-1-8b-0-") for n in names)
