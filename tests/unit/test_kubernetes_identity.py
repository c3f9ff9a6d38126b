"""A TrainingJob's bus name (shared/resurge/cluster/kubernetes/identity.py) and the
namespaces setting: a job in the install's namespace keeps its name, any other is
``<namespace>/<name>``; no two TrainingJobs share a bus name, and each maps back."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from resurge.cluster.kubernetes.identity import bus_name, kube_name, local_name, parse_namespaces
from resurge.contract.subjects import Subjects, escape_token, unescape_token
from resurge.runtime.settings import Settings

HOME = "default"


@pytest.mark.parametrize(
    ("namespace", "name", "bus"),
    [
        ("default", "llama", "llama"),
        ("team-b", "llama", "team-b/llama"),
        ("team-b", "llama-3.1-8b", "team-b/llama-3.1-8b"),
        ("hyperpod-ns-team-a", "a" * 63, "hyperpod-ns-team-a/" + "a" * 63),
    ],
)
def test_a_bus_name_maps_back_to_its_training_job(namespace: str, name: str, bus: str) -> None:
    assert bus_name(namespace, name, HOME) == bus
    assert kube_name(bus, HOME) == (namespace, name)
    assert local_name(bus) == name
    # One subject token, and back.
    assert "." not in escape_token(bus) and unescape_token(escape_token(bus)) == bus
    assert Subjects().job(bus).count(".") == Subjects().job("llama").count(".")


def test_two_namespaces_jobs_of_one_name_have_two_bus_names() -> None:
    names = {bus_name(ns, "llama", HOME) for ns in ("default", "team-a", "team-b")}
    assert len(names) == 3
    assert bus_name("team-b", "llama", "team-b") == "llama", "the install's namespace"


def test_the_namespaces_setting() -> None:
    assert parse_namespaces("") is None
    assert parse_namespaces(" team-b, team-a,team-b ,") == ("team-a", "team-b")
    assert Settings(kube_namespaces="team-a, team-b").kube_namespaces == "team-a, team-b"
    for bad in ("Team-A", "team_a", "team-a/x", "-a"):
        with pytest.raises(ValidationError, match="kube_namespaces"):
            Settings(kube_namespaces=bad)
