"""The built-in XID table: loads, is versioned, honours a job's overrides, has a default."""

from importlib.resources import files

import pytest
import yaml

from resurge.contract import xid
from resurge.contract.xid import TABLE_VERSION, XidAction, action_for, lookup
from resurge.local import job_factory


def test_table_loads_with_a_version_and_a_row_per_common_code() -> None:
    document = yaml.safe_load(files("resurge").joinpath("data/xid_actions.yaml").read_text())
    assert isinstance(TABLE_VERSION, int) and TABLE_VERSION == document["version"] >= 1
    assert xid.table_version() == TABLE_VERSION
    for code in (13, 31, 43, 45, 48, 63, 64, 68, 74, 79, 92, 94, 95):
        entry = lookup(code)
        assert entry.known and entry.code == code and entry.description


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (13, XidAction.RESTART_PROCESS),  # graphics engine exception: the application's
        (31, XidAction.RESTART_PROCESS),  # memory page fault: the application's
        (43, XidAction.RESTART_PROCESS),
        (68, XidAction.RESTART_PROCESS),
        (94, XidAction.RESTART_PROCESS),  # contained ECC error: only its application
        (48, XidAction.RESET_GPU),  # double-bit ECC
        (64, XidAction.RESET_GPU),  # row remapping failed
        (74, XidAction.RESET_GPU),  # NVLink
        (95, XidAction.RESET_GPU),  # uncontained ECC error
        (79, XidAction.REPLACE_NODE),  # fell off the bus
        (45, XidAction.IGNORE),  # logged whenever a GPU process is killed
        (63, XidAction.IGNORE),  # row remapping recorded
        (92, XidAction.IGNORE),  # corrected-error rate
    ],
)
def test_common_codes_follow_nvidias_catalog(code: int, action: XidAction) -> None:
    assert action_for(code) is action


def test_gpu_out_of_use_only_for_reset_and_replace() -> None:
    assert {a for a in XidAction if a.takes_gpu_out} == {
        XidAction.RESET_GPU,
        XidAction.REPLACE_NODE,
    }


def test_unknown_code_gets_the_documented_default() -> None:
    entry = lookup(9999)
    assert not entry.known
    assert entry.action is XidAction.RESET_GPU
    assert "not in resurge's table" in entry.description
    assert action_for(9999) is XidAction.RESET_GPU


def test_a_jobs_overrides_come_first() -> None:
    job = job_factory.job(
        "j",
        ["python", "train.py"],
        monitoring={"gpu": {"xidOverrides": {13: "ignore", 9999: "replace_node"}}},
        preload=None,
    )
    overrides = job.spec.monitoring.gpu.xid_overrides
    assert action_for(13, overrides) is XidAction.IGNORE
    assert action_for(9999, overrides) is XidAction.REPLACE_NODE
    assert action_for(79, overrides) is XidAction.REPLACE_NODE  # not overridden: the table
    assert action_for(13) is XidAction.RESTART_PROCESS
    assert action_for(13, {}) is XidAction.RESTART_PROCESS
