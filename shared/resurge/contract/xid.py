"""The XID table: what an NVIDIA XID event asks of the jobs on that GPU.

The table is data, ``resurge/data/xid_actions.yaml`` (versioned, with its sources), read
once on first use. :func:`action_for` answers one code, a job's
``spec.monitoring.gpu.xidOverrides`` first; a code the table does not list gets the
table's documented ``default`` (``reset_gpu``). ``reset_gpu`` and ``replace_node`` take
the GPU, and so the node, out of the job; ``restart_process`` leaves the GPU in use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from resurge.contract.data_tables import read_table

__all__ = [
    "TABLE_VERSION",
    "XidAction",
    "XidEntry",
    "action_for",
    "lookup",
    "table_version",
]

_TABLE_FILE = "xid_actions.yaml"


class XidAction(StrEnum):
    """What an XID asks for (the values of ``xidOverrides``)."""

    RESTART_PROCESS = "restart_process"
    RESET_GPU = "reset_gpu"
    REPLACE_NODE = "replace_node"
    IGNORE = "ignore"

    @property
    def takes_gpu_out(self) -> bool:
        """The GPU must not be used again until it is reset or its machine replaced."""
        return self in (XidAction.RESET_GPU, XidAction.REPLACE_NODE)


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: XidAction
    description: str = Field(min_length=1)
    nvidia: str | None = None  # the catalog's immediate-action bucket, for reference


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: NonNegativeInt
    default: _Row
    xids: dict[NonNegativeInt, _Row]


@dataclass(frozen=True)
class XidEntry:
    """One code as the table sees it; ``known`` is False where the default applied."""

    code: int
    action: XidAction
    description: str
    known: bool


def _table() -> _Table:
    return read_table(_TABLE_FILE, _Table)


def table_version() -> int:
    """Version of the built-in table (faults carry it as evidence)."""
    return _table().version


TABLE_VERSION = table_version()


def lookup(xid: int) -> XidEntry:
    """The built-in table's entry for ``xid`` (the default for an unlisted code)."""
    table = _table()
    row = table.xids.get(xid)
    if row is None:
        return XidEntry(xid, table.default.action, table.default.description, known=False)
    return XidEntry(xid, row.action, row.description, known=True)


def action_for(xid: int, overrides: Mapping[int, str] | None = None) -> XidAction:
    """The action for ``xid``: the job's override if it has one, else the table's."""
    if overrides and xid in overrides:
        return XidAction(overrides[xid])
    return lookup(xid).action
