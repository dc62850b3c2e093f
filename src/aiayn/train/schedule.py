"""The learning-rate schedule of Section 5.3 (Eq. 3), often called "Noam", and variants
that know the run's budget (an update count or a wall-clock limit) and decay to zero at
its end; :func:`budget_spent` tells when that end has come.

The paper's rate is still high when a short run stops (a run of twice the warmup ends at
70% of the peak); a schedule that anneals to zero by the budget's end gets the benefit of
a low final rate without checkpoint averaging having to supply it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch.optim import Optimizer

from aiayn.errors import RecipeError

if TYPE_CHECKING:
    from aiayn.train.recipe import Recipe

# noam: Eq. 3. linear / cosine: linear warmup to Eq. 3's peak, then down to 0 at the end
# of the budget. noam_cooldown: Eq. 3, multiplied down to 0 over the budget's last
# ``cooldown`` fraction (inverse square root with a cool-down, Hägele et al. 2024).
SCHEDULES = ("noam", "linear", "cosine", "noam_cooldown")


def noam_rate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

    Rises linearly for ``warmup`` steps, peaks at scale / sqrt(d_model * warmup), then
    decays as 1/sqrt(step).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def scheduled_rate(
    kind: str,
    step: int,
    used: float,
    d_model: int,
    warmup: int,
    scale: float = 1.0,
    cooldown: float = 0.2,
) -> float:
    """The rate of schedule ``kind`` at ``step`` (from 1) when the fraction ``used`` in
    [0, 1] of the run's budget is spent (ignored by "noam"). The budgeted schedules share
    Eq. 3's warmup and peak, scale / sqrt(d_model * warmup), and reach 0 at ``used`` = 1."""
    used = min(max(used, 0.0), 1.0)
    if kind == "noam":
        return noam_rate(step, d_model, warmup, scale)
    if kind == "noam_cooldown":
        return noam_rate(step, d_model, warmup, scale) * min(1.0, (1.0 - used) / cooldown)
    warm = min(1.0, max(step, 1) / warmup) * scale * (d_model * warmup) ** -0.5
    if kind == "linear":
        return warm * (1.0 - used)
    if kind == "cosine":
        return warm * 0.5 * (1.0 + math.cos(math.pi * used))
    raise RecipeError(f"schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")


class NoamSchedule:
    """Sets every parameter group's ``lr`` to the schedule's rate at the current step.

    Call :meth:`step` after each optimizer update. ``state_dict`` holds the step, so a
    resumed run continues the same curve. ``kind`` is one of :data:`SCHEDULES` (default
    Eq. 3); the budgeted ones decay over ``max_steps`` updates or over the wall clock that
    ``time_used()`` reports as a fraction, whichever runs out first.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        d_model: int,
        warmup: int = 4000,
        scale: float = 1.0,
        kind: str = "noam",
        max_steps: int = 0,
        time_used: Callable[[], float] | None = None,
        cooldown: float = 0.2,
    ):
        if warmup < 1:
            raise RecipeError(f"warmup must be >= 1 step, got {warmup}")
        if kind not in SCHEDULES:
            raise RecipeError(f"schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")
        if kind != "noam" and not max_steps and time_used is None:
            raise RecipeError(
                f"schedule {kind!r} decays to 0 at the end of the run: it needs a budget "
                "(max_steps or time_limit_minutes)"
            )
        if not 0.0 < cooldown <= 1.0:
            raise RecipeError(f"cooldown must be a fraction in (0, 1], got {cooldown}")
        self.optimizer, self.d_model, self.warmup, self.scale = optimizer, d_model, warmup, scale
        self.kind, self.max_steps, self.time_used, self.cooldown = (
            kind,
            max_steps,
            time_used,
            cooldown,
        )
        self.step_count = 0
        self._apply()

    def budget_used(self) -> float:
        """The fraction of the budget spent before the next update: updates done of
        ``max_steps``, or ``time_used()``, whichever is further along."""
        used = self.step_count / self.max_steps if self.max_steps else 0.0
        return max(used, self.time_used()) if self.time_used is not None else used

    def rate(self, step: int | None = None) -> float:
        step = self.step_count + 1 if step is None else step
        return scheduled_rate(
            self.kind,
            step,
            self.budget_used(),
            self.d_model,
            self.warmup,
            self.scale,
            self.cooldown,
        )

    def _apply(self) -> None:
        lr = self.rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"step_count": self.step_count, "warmup": self.warmup, "scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self._apply()


def budget_spent(recipe: Recipe, step: int, elapsed: float) -> str:
    """ "max_steps" or "time_limit" once a run at update ``step`` after ``elapsed``
    seconds has used that budget of ``recipe``; "" while it has not."""
    if recipe.max_steps and step >= recipe.max_steps:
        return "max_steps"
    if recipe.time_limit_minutes and elapsed >= recipe.time_limit_minutes * 60:
        return "time_limit"
    return ""
