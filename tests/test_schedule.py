"""The learning-rate schedule: warm-up then decay, as the plan's knobs say."""

import pytest

from trainwise.engine.schedule import lr_multiplier


def test_warmup_rises_linearly_to_the_peak():
    assert [lr_multiplier(s, 100, 4, "cosine") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decay_starts_at_the_peak_and_ends_at_zero(schedule):
    assert lr_multiplier(10, 110, 10, schedule) == pytest.approx(1.0)
    assert lr_multiplier(110, 110, 10, schedule) == pytest.approx(0.0, abs=1e-12)


def test_cosine_is_half_way_at_the_middle():
    assert lr_multiplier(50, 100, 0, "cosine") == pytest.approx(0.5)


def test_constant_stays_at_the_peak_after_warmup():
    assert {lr_multiplier(s, 10, 2, "constant") for s in range(2, 10)} == {1.0}
