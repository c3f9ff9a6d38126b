"""The base every TrainingJob model shares.

Frozen, unknown fields rejected (``extra="forbid"``), camelCase names on the wire and
snake_case in Python; either spelling is accepted on input, and so is each extra name
a field lists in ``validation_alias`` (HyperPod's spellings), but only one at a time.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

__all__ = ["SpecModel"]


class SpecModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, alias_generator=to_camel
    )

    @model_validator(mode="before")
    @classmethod
    def _one_name_per_field(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if isinstance(field.validation_alias, AliasChoices):
                    spellings = [str(choice) for choice in field.validation_alias.choices]
                    given = [key for key in (*spellings, name) if key in data]
                    if len(given) > 1:
                        raise ValueError(f"{' and '.join(given)} name the same field: give one")
        return data
