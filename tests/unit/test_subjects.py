import pytest

from resurge.contract.subjects import Subjects, escape_token, unescape_token

TRICKY = [
    "train",
    "a.b",
    "a_b",
    "a__b",
    "_",
    ".",
    "x*y",
    "x>y",
    "with space",
    "tab\there",
    "ünïcode",
    "a_2eb",
    "-lead",
    "pytorch-job.v2.run_3",
]


@pytest.mark.parametrize("name", TRICKY)
def test_escape_round_trips_and_yields_one_safe_token(name: str) -> None:
    token = escape_token(name)
    assert unescape_token(token) == name
    assert all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in token)


def test_distinct_names_never_share_a_token() -> None:
    tokens = {escape_token(name) for name in TRICKY}
    assert len(tokens) == len(TRICKY)


def test_dotted_job_stays_one_token_in_subjects() -> None:
    s = Subjects("resurge")
    assert s.fault("team.llm.run", "process") == "resurge.v1.fault.team_2ellm_2erun.process"
    assert len(s.raw("a.b", "log_line", "node.1").split(".")) == 6


def test_none_means_wildcard_and_node_level_job_is_underscore() -> None:
    s = Subjects("ns")
    assert s.raw(None, "process_exited", None) == "ns.v1.raw.*.process_exited.*"
    assert s.raw("_", "gpu_sample", "n1") == "ns.v1.raw._.gpu_sample.n1"
    assert s.cmd("j", None) == "ns.v1.cmd.j.*"
    assert s.all("fault") == "ns.v1.fault.>"


def test_empty_name_and_bad_namespace_are_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        escape_token("")
    with pytest.raises(ValueError, match="namespace"):
        Subjects("has.dot")
