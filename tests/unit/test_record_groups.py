"""The job record's fields are grouped by who writes them: every field is in one group
of FIELD_GROUPS, and the model declares them in the groups' order, so a new field is
placed (and its writer named) where it belongs."""

from __future__ import annotations

from resurge.control.state.records import FIELD_GROUPS, JobRecord


def test_every_field_is_in_one_group_in_the_groups_order() -> None:
    grouped = [name for names in FIELD_GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped))
    assert list(JobRecord.model_fields) == grouped
