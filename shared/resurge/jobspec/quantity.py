"""A size in bytes, as a job spec gives it: a Kubernetes quantity or a whole number.

:func:`memory_bytes` reads what a pod's ``resources`` take for memory ("Quantity" in the
Kubernetes API reference): a decimal number with a binary suffix (``Ki``, ``Mi``, ``Gi``,
``Ti``, ``Pi``, ``Ei``), a decimal one (``k``, ``M``, ``G``, ``T``, ``P``, ``E``, ``m``)
or an exponent (``1e9``), as a string, or a number of bytes. The size must come to a
whole, positive number of bytes, at most 2**63 - 1 ("1.5Gi" does; "0.5" does not);
anything else raises ValueError naming the value. :data:`MemorySize` is a model field
type that holds the bytes and accepts either form on input (its schema: an integer or a
string).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["MemorySize", "memory_bytes"]

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_MOST = Decimal(2**63 - 1)  # the largest quantity Kubernetes keeps
_QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+)|([a-zA-Z]*))$")


def memory_bytes(value: object) -> int:
    """``value`` (``"8Gi"``, ``"512Mi"``, ``"1G"``, ``"1500000000"``, ``8589934592``) in
    bytes. Raises ValueError for anything that is not a whole, positive number of bytes."""
    size = _size(value)
    if size is None or not 0 < size <= _MOST or size != size.to_integral_value():
        raise ValueError(
            f"{value!r} is not a memory size: give a whole, positive number of bytes or a "
            "Kubernetes quantity such as '8Gi', '512Mi' or '1G'"
        )
    return int(size)


def _size(value: object) -> Decimal | None:
    if isinstance(value, bool):
        return None  # YAML's true is not a size
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(value) if value == value and abs(value) != float("inf") else None
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        if exponent is not None:
            return Decimal(number).scaleb(int(exponent))
        return Decimal(number) * _SUFFIXES[suffix]
    except (KeyError, InvalidOperation):
        return None


MemorySize = Annotated[int, BeforeValidator(memory_bytes, json_schema_input_type=int | str)]
