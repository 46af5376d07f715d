"""Small predicates for checking settings' values, shared by the run config and the metrics' own options."""

from __future__ import annotations

import math
from typing import Any


def is_int(v: Any) -> bool:
    """A whole number (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_str_list(v: Any) -> bool:
    """A list or tuple of non-empty strings."""
    return isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v)
