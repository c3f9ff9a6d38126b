"""The node attribution table: which faults count against the node they happened on.

The table is data, ``resurge/data/node_attribution.yaml`` (versioned, each rule with the
evidence it needs), read once on first use; ``docs/nodes.md`` prints it.
:func:`attribute` answers one fault: the node it counts against, the weight, and the
rule that decided; None where no rule gives it weight (the job's own error, or a fault
with no node). A rule matches the fault's ``reason`` and every evidence key it lists
(one of the listed values, or a regular expression found in the value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from resurge.contract.data_tables import read_table
from resurge.events import FaultDetected

__all__ = ["Attribution", "Rule", "attribute", "fault_node", "rules", "table_version"]

_TABLE_FILE = "node_attribution.yaml"


class _Matches(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    matches: str

    @field_validator("matches")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        re.compile(pattern)
        return pattern


class Rule(BaseModel):
    """One row of the table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    reason: list[str] = Field(min_length=1, description="Fault reasons it applies to.")
    evidence: dict[str, list[str | int] | _Matches] = Field(default_factory=dict)
    weight: float = Field(ge=0)
    needs: str = Field(min_length=1, description="The evidence it relies on, in words.")

    @field_validator("reason", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    def applies(self, fault: FaultDetected) -> bool:
        """Whether ``fault`` is what this rule is about."""
        if fault.reason not in self.reason:
            return False
        for key, wanted in self.evidence.items():
            value = fault.evidence.get(key)
            if value is None:
                return False
            if isinstance(wanted, _Matches):
                if re.search(wanted.matches, str(value), re.IGNORECASE) is None:
                    return False
            elif value not in wanted and str(value) not in map(str, wanted):
                return False
        return True


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: NonNegativeInt
    rules: list[Rule] = Field(min_length=1)


@dataclass(frozen=True)
class Attribution:
    """A fault counted against a node: how much, and by which rule."""

    node: str
    weight: float
    rule: str
    needs: str


def _table() -> _Table:
    return read_table(_TABLE_FILE, _Table)


def table_version() -> int:
    """The table's version (bump it on every change)."""
    return _table().version


def rules() -> list[Rule]:
    """The table's rules, in the order they are tried."""
    return list(_table().rules)


def fault_node(fault: FaultDetected) -> str | None:
    """The node a fault happened on: its own, else the one its evidence names."""
    if fault.node:
        return fault.node
    named = fault.evidence.get("node")
    return named if isinstance(named, str) and named else None


def attribute(fault: FaultDetected) -> Attribution | None:
    """What ``fault`` counts against its node; None where it counts nothing."""
    node = fault_node(fault)
    if node is None:
        return None
    rule = next((r for r in _table().rules if r.applies(fault)), None)
    if rule is None or rule.weight == 0:
        return None
    return Attribution(node=node, weight=rule.weight, rule=rule.name, needs=rule.needs)
