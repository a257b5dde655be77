"""Checks of user-given numbers, shared by the β controller, the configs and the callbacks (each raises its own
message)."""

from __future__ import annotations

import math
from numbers import Real


def require(condition: bool, message: str) -> None:
    """Raises `ValueError(message)` unless `condition`."""
    if not condition:
        raise ValueError(message)


def is_int(value) -> bool:
    """An integer, not a bool (YAML's `true` must not pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value) -> bool:
    """A finite real number, not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
