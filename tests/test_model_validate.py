"""Constructor checks shared by the model families (stream_vips.models._validate)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_vips.models._validate import integer, optional_positive, positive


def test_positive_accepts_finite_positive_numbers_of_any_numeric_type():
    assert positive("clip", 2) == 2.0 and isinstance(positive("clip", 2), float)
    assert positive("clip", np.float32(0.5)) == 0.5
    assert positive("clip", np.int64(3)) == 3.0
    assert optional_positive("x_clip", None) is None
    assert optional_positive("x_clip", 1.5) == 1.5


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1.0", None, [1.0]])
def test_positive_names_the_key(bad):
    with pytest.raises(ValueError, match=r"^clip must be a finite number > 0, got "):
        positive("clip", bad)


def test_integer_bounds_and_wording():
    assert integer("dim", np.int32(4)) == 4 and type(integer("dim", np.int32(4))) is int
    assert integer("burn_in", 0, minimum=0) == 0
    with pytest.raises(ValueError, match=r"^dim must be a positive integer, got 0$"):
        integer("dim", 0)
    with pytest.raises(ValueError, match=r"^mcmc_steps must be an integer >= 2, got 1$"):
        integer("mcmc_steps", 1, minimum=2)
    for bad in (True, 2.0, "3", None):
        with pytest.raises(ValueError, match="dim"):
            integer("dim", bad)
