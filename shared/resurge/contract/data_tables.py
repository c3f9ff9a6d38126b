"""Tables resurge ships as data (``resurge/data/*.yaml``), read and validated once each.

:func:`read_table` loads one file of the package's data folder and validates it with its
model: a table that does not validate is an error of the release, raised on first use.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

__all__ = ["read_table"]

_Model = TypeVar("_Model", bound=BaseModel)


def read_table(name: str, model: type[_Model]) -> _Model:
    """``resurge/data/<name>`` validated as ``model`` (cached: read once)."""
    found: Any = _read(name, model)
    assert isinstance(found, model)
    return found


@functools.cache
def _read(name: str, model: type[BaseModel]) -> BaseModel:
    document: Any = yaml.safe_load(files("resurge").joinpath("data", name).read_text())
    return model.model_validate(document)
