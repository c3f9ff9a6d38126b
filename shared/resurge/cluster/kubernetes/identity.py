"""A TrainingJob's name on the bus, and which namespaces an install serves: pure functions.

One install serves the TrainingJobs of every namespace (or of the namespaces listed in
``RESURGE_KUBE_NAMESPACES``), and two teams may each have a job named ``train``. On the
bus (subjects, job records, ``resurge status``) a job is one name, so a TrainingJob's
**bus name** is:

- its ``metadata.name`` when it is in the install's own namespace
  (``RESURGE_KUBE_NAMESPACE``, ``default`` unless set): a job there keeps the name it has
  always had, so an upgrade renames nothing;
- ``<namespace>/<name>`` in any other namespace, as kubectl writes an object's
  namespace and name (``team-b/train``). Neither a namespace (a DNS label) nor an object
  name (a DNS subdomain) can hold ``/``, so no two TrainingJobs share a bus name.

:func:`kube_name` maps a bus name back to the TrainingJob's namespace and name. A
worker group's pod and Service carry the object name (label ``resurge.dev/job``, pod
and Service names), as names inside a namespace; the group's spec in the pod carries the
bus name.
"""

from __future__ import annotations

__all__ = ["SEPARATOR", "bus_name", "kube_name", "local_name", "parse_namespaces"]

SEPARATOR = "/"


def bus_name(namespace: str, name: str, home: str) -> str:
    """The bus name of TrainingJob ``name`` in ``namespace``; ``home`` is the install's
    own namespace (module docstring)."""
    return name if namespace == home else f"{namespace}{SEPARATOR}{name}"


def kube_name(job: str, home: str) -> tuple[str, str]:
    """The namespace and name of the TrainingJob whose bus name is ``job``."""
    namespace, separator, name = job.rpartition(SEPARATOR)
    return (namespace, name) if separator else (home, job)


def local_name(job: str) -> str:
    """The TrainingJob's name (in its namespace) of bus name ``job``."""
    return job.rpartition(SEPARATOR)[2]


def parse_namespaces(text: str) -> tuple[str, ...] | None:
    """The namespaces a comma-separated ``RESURGE_KUBE_NAMESPACES`` lists, sorted and
    without repeats; None (every namespace) where it lists none."""
    names = sorted({part.strip() for part in text.split(",") if part.strip()})
    return tuple(names) if names else None
