"""Constructor checks shared by the model families: bad configuration fails at start, naming the key.

JSON/YAML booleans are rejected where numbers are expected (``True`` is an ``int`` in Python).

>>> integer("dim", 3), positive("clip", 0.5), optional_positive("x_clip", None)
(3, 0.5, None)
>>> integer("mcmc_steps", 1, minimum=2)
Traceback (most recent call last):
...
ValueError: mcmc_steps must be an integer >= 2, got 1
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def positive(name: str, value: Any) -> float:
    """``value`` as a float, or a ValueError naming ``name`` unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def optional_positive(name: str, value: Any) -> float | None:
    """``None`` (the option is off) or :func:`positive`."""
    return None if value is None else positive(name, value)


def integer(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int, or a ValueError naming ``name`` unless it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)
