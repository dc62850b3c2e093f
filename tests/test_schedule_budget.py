"""aiayn.train.schedule at its edges: Eq. 3 at step 0 (counted as step 1, as
the budgeted kinds already are) and the wall-clock budget, which is in minutes."""

from __future__ import annotations

import pytest

from aiayn.train.recipe import Recipe
from aiayn.train.schedule import budget_spent, noam_rate, scheduled_rate


def test_noam_rate_counts_step_0_as_step_1():
    d, w = 512, 4000
    assert noam_rate(0, d, w) == noam_rate(1, d, w) == pytest.approx(d**-0.5 * w**-1.5)
    assert noam_rate(-3, d, w) == noam_rate(1, d, w)
    for kind in ("noam", "noam_cooldown"):
        assert scheduled_rate(kind, 0, 0.0, d, w) == pytest.approx(noam_rate(1, d, w))


def test_the_time_budget_is_in_minutes_and_ends_at_the_limit():
    recipe = Recipe(time_limit_minutes=2.0)
    assert budget_spent(recipe, 10, 0.0) == ""
    assert budget_spent(recipe, 10, 119.9) == ""  # seconds: not yet two minutes
    assert budget_spent(recipe, 10, 120.0) == "time_limit"
    assert budget_spent(recipe, 10, 500.0) == "time_limit"
    assert budget_spent(Recipe(), 10**9, 10.0**9) == ""  # no budget: never spent
    both = Recipe(max_steps=5, time_limit_minutes=2.0)
    assert budget_spent(both, 4, 10.0) == ""
    assert budget_spent(both, 5, 10.0) == "max_steps"
    assert budget_spent(both, 5, 200.0) == "max_steps"  # the step budget is named first
    assert budget_spent(both, 4, 200.0) == "time_limit"
