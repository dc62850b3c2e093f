"""The learning-rate schedule of Section 5.3 (Eq. 3), often called "Noam"."""

from __future__ import annotations

from torch.optim import Optimizer

from aiayn.errors import RecipeError


def noam_rate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

    Rises linearly for ``warmup`` steps, peaks at scale / sqrt(d_model * warmup), then
    decays as 1/sqrt(step).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


class NoamSchedule:
    """Sets every parameter group's ``lr`` to :func:`noam_rate` of the current step.

    Call :meth:`step` after each optimizer update. ``state_dict`` holds the step, so a
    resumed run continues the same curve.
    """

    def __init__(self, optimizer: Optimizer, d_model: int, warmup: int = 4000, scale: float = 1.0):
        if warmup < 1:
            raise RecipeError(f"warmup must be >= 1 step, got {warmup}")
        self.optimizer, self.d_model, self.warmup, self.scale = optimizer, d_model, warmup, scale
        self.step_count = 0
        self._apply()

    def rate(self, step: int | None = None) -> float:
        return noam_rate(
            self.step_count + 1 if step is None else step, self.d_model, self.warmup, self.scale
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
