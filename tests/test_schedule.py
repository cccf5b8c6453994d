"""Robbins-Monro step size and the update trigger."""

from __future__ import annotations

import pytest

from stream_vips.schedule import Trigger, step_size


def test_step_size_closed_form_and_conditions():
    assert step_size(1, 0.0, 1.0) == 1.0
    assert step_size(5, 3.0, 0.5 + 1e-9) == pytest.approx(8 ** -(0.5 + 1e-9))
    assert step_size(10, 100.0, 0.7) == pytest.approx(110**-0.7)
    # monotone decreasing in t
    rhos = [step_size(t, 10.0, 0.9) for t in range(50)]
    assert all(a > b for a, b in zip(rhos, rhos[1:]))
    # with tau0 = 0, kappa = 1 the steps average: rho_t = 1/t
    assert [step_size(t, 0.0, 1.0) for t in (1, 2, 4)] == [1.0, 0.5, 0.25]


@pytest.mark.parametrize(
    "args, match",
    [((1, -1.0, 0.7), "tau0"), ((1, 0.0, 0.5), "kappa"), ((1, 0.0, 1.1), "kappa"),
     ((0, 0.0, 0.7), "above 1"), ((-1, 10.0, 0.7), "non-negative")],
)
def test_step_size_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        step_size(*args)


def test_trigger_by_records():
    trig = Trigger(every_records=100, now=0.0)
    trig.observe(60)
    assert not trig.due(1e9)
    trig.observe(40)
    assert trig.due(0.0)
    trig.reset(0.0)
    assert trig.pending == 0 and not trig.due(0.0)


def test_trigger_by_seconds_and_either():
    trig = Trigger(every_seconds=2.0, now=10.0)
    assert not trig.due(11.9)
    assert trig.due(12.0)
    trig.reset(12.0)
    assert not trig.due(13.0)
    both = Trigger(every_records=5, every_seconds=60.0, now=0.0)
    both.observe(5)
    assert both.due(1.0)
    both.reset(1.0)
    assert both.due(61.0) and not both.due(30.0)


def test_trigger_validation():
    with pytest.raises(ValueError, match="every_records and/or every_seconds"):
        Trigger()
    with pytest.raises(ValueError, match="every_records"):
        Trigger(every_records=0)
    with pytest.raises(ValueError, match="every_seconds"):
        Trigger(every_seconds=-1.0)
