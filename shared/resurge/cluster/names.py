"""Names a job's worker groups get on a cluster, derived from the job's name: pure functions.

A job's name is a Kubernetes object name (a DNS subdomain: lowercase letters, digits,
``-`` and ``.``, up to 63 characters here), which is not always a valid DNS label:

- :func:`service_name`: the job's headless Service, an RFC 1035 label (a letter first,
  no dots, at most 63 characters). A job name that is one already is kept as it is;
  any other (``llama-3.1-8b``, ``70b-pretrain``) has its dots turned into dashes, ``job-``
  put in front when it starts with a digit, is cut to fit, and ends with ``-`` and six
  hex digits of a hash of the job name, so two job names never share a Service (short
  of a job named exactly like another's derived name).
- :func:`worker_hostname`: a worker group's ``spec.hostname``, an RFC 1123 label (no
  dots, at most 63 characters): the job name with dots as dashes, cut to fit, then the
  replica and five hex digits of a hash of its node and incarnation. Two pods of one
  replica (a recreated or moved group, while its predecessor ends) never share a
  hostname, so a DNS name never points at a pod on its way out.
- :func:`group_digest`: that hash, which the pod's name also ends with.
"""

from __future__ import annotations

import hashlib
import re

from resurge.cluster.protocol import WorkerGroupSpec

__all__ = ["LABEL_MAX", "group_digest", "service_name", "worker_hostname"]

LABEL_MAX = 63
"""The longest DNS label (RFC 1035 and RFC 1123)."""

_RFC_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]")
_SERVICE_PREFIX = "job-"  # in front of a job name that starts with a digit


def _dashed(job: str) -> str:
    """``job`` lowercased, each character a label cannot hold (a dot) a dash."""
    return _NOT_IN_LABEL.sub("-", job.lower())


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _fit(base: str, suffix: str) -> str:
    """``base`` cut so that it and ``suffix`` fit in one label, then ``suffix``; a label
    never ends (or, cut to nothing, starts) with a dash."""
    head = base[: max(0, LABEL_MAX - len(suffix))].strip("-")
    return f"{head}{suffix}" if head else suffix.lstrip("-")


def service_name(job: str) -> str:
    """The job's Service name, an RFC 1035 label (module docstring)."""
    if len(job) <= LABEL_MAX and _RFC_1035_LABEL.match(job):
        return job
    base = _dashed(job)
    if not base[:1].isalpha():
        base = _SERVICE_PREFIX + base
    return _fit(base, f"-{_digest(job, 6)}")


def group_digest(spec: WorkerGroupSpec) -> str:
    """Five hex digits of a hash of the group's node and incarnation."""
    return _digest(f"{spec.node}/{spec.incarnation}", 5)


def worker_hostname(spec: WorkerGroupSpec) -> str:
    """The hostname of worker group ``spec``'s pod, an RFC 1123 label (module docstring)."""
    return _fit(_dashed(spec.job), f"-{spec.replica}-{group_digest(spec)}")
