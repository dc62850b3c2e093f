"""What a training run does besides its updates, and when: its checkpoints, its
validations and its stop (:class:`Duties`, for :class:`~aiayn.train.trainer.Trainer`).

After each update, in this order: checkpoint_last.pt every ``save_every_steps``
updates, a timed checkpoint when one is due (``save_every_minutes``), a validation every
``valid_every_steps``. At the end of an epoch, and at a stop (the ``max_steps`` or time
limit reached): a validation (at every epoch's end when ``valid_every_steps`` is 0, and
at a stop, unless that step was just validated), the epoch's checkpoint, and
checkpoint_last.pt once more.

checkpoint_last.pt is saved after an update but before that update's validation and
stop, so that a run killed in a long validation keeps its updates; it is then marked
pending (:data:`PENDING` in the state), and a run resumed from it does that validation
and that stop first. Without the mark, a run killed (or failing: a full disk) in its
final validation or saves would find its budget spent when resumed, and never have its
final validation, best or epoch checkpoint.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from aiayn.checkpoint import (
    BEST,
    LAST,
    epoch_checkpoint_name,
    epoch_checkpoints,
    saved_step,
    step_checkpoint_name,
)
from aiayn.train.metrics_log import MetricsLog
from aiayn.train.schedule import budget_spent

if TYPE_CHECKING:
    from aiayn.train.trainer import Trainer

# The checkpoint key that marks a state saved before its step's validation and stop.
PENDING = "duties_pending"
# The names of the epoch and timed checkpoints a run writes (and prunes).
KEPT_NAME = re.compile(r"checkpoint_(epoch\d{3,}|step\d{7,})\.pt")


class Duties:
    """The saves, validations and stop of ``trainer``'s run, from the position it starts
    at (a new run's, or a resumed one's); ``pending`` when that position is a checkpoint
    marked :data:`PENDING`."""

    def __init__(self, trainer: Trainer, pending: bool = False):
        self.t, self.pending = trainer, pending
        self.validated_at = -1  # the step validated last
        period = trainer.recipe.save_every_minutes * 60  # its next multiple, after a resume
        self.timed_save_at = (math.floor(trainer.elapsed / period) + 1) * period if period else 0

    def keep(self, name: str) -> None:
        """Save an epoch or timed checkpoint; only the last ``keep_last`` stay on disk."""
        t = self.t
        t.save(name)
        # A time-limited run saves its partial epoch; finishing that epoch after --resume
        # rewrites the same file, which must not count twice (or be pruned as "old").
        if name in t.epoch_checkpoints:
            t.epoch_checkpoints.remove(name)
        t.epoch_checkpoints.append(name)
        while len(t.epoch_checkpoints) > t.recipe.keep_last:
            (t.out_dir / t.epoch_checkpoints.pop(0)).unlink(missing_ok=True)

    def validate(self, metrics: MetricsLog) -> None:
        """Every rank validates its share; rank 0 logs, and saves the best."""
        t = self.t
        v = t.validate()
        self.validated_at = t.step
        metrics.write("valid", t.step, epoch=t.epoch + 1, seconds=round(t.elapsed, 2), **v)
        # A model whose validation loss is not finite is broken, whatever its BLEU says.
        improved = math.isfinite(v["loss"]) and v["bleu"] > t.best_bleu
        t.log(
            f"valid epoch {t.epoch + 1} step {t.step}: loss {v['loss']:.3f} "
            f"ppl {v['ppl']:.2f} BLEU {v['bleu']:.2f}" + (" (best)" if improved else "")
        )
        if improved:
            t.best_bleu = v["bleu"]
            t.save(BEST)

    def owed(self, metrics: MetricsLog) -> str:
        """What a run resumed from a pending checkpoint still owes its step (see
        :meth:`after_save`), done once; "max_epochs" when it owes nothing."""
        if not self.pending:
            return "max_epochs"
        self.pending = False
        return self.after_save(metrics)

    def after_update(self, metrics: MetricsLog) -> str:
        """The duties of an update: its saves, then :meth:`after_save`."""
        t, r = self.t, self.t.recipe
        period = r.save_every_minutes * 60
        if period and t.elapsed >= self.timed_save_at:  # first: checkpoint_last.pt lists it
            self.timed_save_at = (math.floor(t.elapsed / period) + 1) * period
            self.keep(step_checkpoint_name(t.step))
        if r.save_every_steps and t.step % r.save_every_steps == 0:
            t.save(LAST, pending=True)
        return self.after_save(metrics)

    def after_save(self, metrics: MetricsLog) -> str:
        """The validation every ``valid_every_steps``; "max_steps"/"time_limit" when the
        run must stop, else "max_epochs"."""
        t, r = self.t, self.t.recipe
        if r.valid_every_steps and t.step % r.valid_every_steps == 0:
            self.validate(metrics)
        return budget_spent(r, t.step, t.elapsed) or "max_epochs"

    def end(self, metrics: MetricsLog, stopped_by: str, epoch_done: bool) -> None:
        """The end of an epoch (``epoch_done``) or a stop (``stopped_by`` other than
        "max_epochs"): its validation and epoch checkpoint; then checkpoint_last.pt, not
        pending: a run resumed from it starts after them."""
        t, r = self.t, self.t.recipe
        stopping = stopped_by != "max_epochs"
        if epoch_done or stopping:
            if (stopping or not r.valid_every_steps) and self.validated_at != t.step:
                self.validate(metrics)
            self.keep(epoch_checkpoint_name(t.epoch + 1))
        if epoch_done:
            t.epoch, t.batch_in_epoch = t.epoch + 1, 0
        t.save(LAST)


def drop_later_checkpoints(t: Trainer) -> None:
    """For a resumed run (rank 0): remove the epoch and timed checkpoints that its
    checkpoint does not list and that were saved at or after its step. The killed run
    saved them after checkpoint_last.pt, from updates the resumed run does again (as
    metrics.jsonl is cut back); kept, they were never pruned, and ``aiayn average`` took
    them among the newest."""
    for path in epoch_checkpoints(t.out_dir):
        if not KEPT_NAME.fullmatch(path.name) or path.name in t.epoch_checkpoints:
            continue  # a name a run does not write (a copy of the user's), or still listed
        step = saved_step(path)
        if step is not None and step >= t.step:
            path.unlink(missing_ok=True)
            t.log(f"removed {path.name} (step {step}): saved after {LAST}, from updates done again")
