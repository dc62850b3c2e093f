"""What a training run does besides its updates, and when: its checkpoints, its
validations and its stop (:class:`Duties`, for :class:`~aiayn.train.trainer.Trainer`).

After each update, in this order: checkpoint_last.pt every ``save_every_steps``
updates, a timed checkpoint when one is due (``save_every_minutes``), a validation every
``valid_every_steps``. At the end of an epoch, and at a stop (the ``max_steps`` or time
limit reached, or the end of the last epoch): a validation (at every epoch's end when
``valid_every_steps`` is 0, and at a stop, unless that step was just validated), the
epoch's checkpoint, and checkpoint_last.pt once more. Before the run's first best, epoch
or timed checkpoint comes a checkpoint_last.pt (:meth:`Duties.last_first`).

checkpoint_last.pt is saved after an update but before that update's validation and
stop (every ``save_every_steps``, and at a stop known before its final validation), so
that a run killed in a long validation keeps its updates; it is then marked
pending (:data:`PENDING` in the state), and a run resumed from it does that validation
and that stop first. Without the mark, a run killed (or failing: a full disk) in its
final validation or saves would find its budget spent when resumed, and never have its
final validation, best or epoch checkpoint.

A run driven from Python keeps its duties across ``train()`` calls: one cut short in the
duties of its step (an interrupt in a validation, a save) leaves them pending too, and the
next call does what is left of them first, as a run resumed from a pending checkpoint.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, cast

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


class Duties:
    """The saves, validations and stop of ``trainer``'s run, from the position it starts
    at (a new run's, or a resumed one's); ``pending`` when that position is a checkpoint
    marked :data:`PENDING`. Each duty of a step is done once: those that a call cut short
    had done already are not done again."""

    def __init__(self, trainer: Trainer, pending: bool = False):
        # Weak: the trainer keeps its duties between train() calls, and a cycle would hold
        # the lock on the run directory (let go with the trainer) until the collector runs.
        self.t = cast("Trainer", weakref.proxy(trainer))
        self.done_at = -1 if pending else trainer.step  # the step whose duties are all done
        self.saved_at = trainer.step if pending else -1  # checkpoint_last.pt, pending
        self.validated_at = -1  # the step validated (and logged) last
        self.last_saved = trainer.step > 0  # a resumed run's checkpoint_last.pt is there
        period = trainer.recipe.save_every_minutes * 60  # its next multiple, after a resume
        self.timed_save_at = (math.floor(trainer.elapsed / period) + 1) * period if period else 0

    @property
    def pending(self) -> bool:
        """Whether duties of the trainer's current step are still to be done."""
        return self.done_at != self.t.step

    def keep(self, name: str) -> None:
        """Save an epoch or timed checkpoint; only the last ``keep_last`` stay on disk."""
        t = self.t
        self.last_first()
        t.save(name)
        # A time-limited run saves its partial epoch; finishing that epoch after --resume
        # rewrites the same file, which must not count twice (or be pruned as "old").
        if name in t.epoch_checkpoints:
            t.epoch_checkpoints.remove(name)
        t.epoch_checkpoints.append(name)
        while len(t.epoch_checkpoints) > t.recipe.keep_last:
            old = t.out_dir / t.epoch_checkpoints.pop(0)
            if t.world.is_main:  # it wrote them; another machine's folder may hold others'
                old.unlink(missing_ok=True)

    def validate(self, metrics: MetricsLog) -> None:
        """Every rank validates its share; rank 0 saves the best, then logs. Cut short
        before it is logged, it is done again whole by the step's next try."""
        t = self.t
        v = t.validate()
        # A model whose validation loss is not finite is broken, whatever its BLEU says.
        improved = math.isfinite(v["loss"]) and v["bleu"] > t.best_bleu
        if improved:
            self.last_first()
            best, t.best_bleu = t.best_bleu, v["bleu"]
            try:
                t.save(BEST)
            except BaseException:
                t.best_bleu = best  # not on disk: the next try must find it better again
                raise
        metrics.write("valid", t.step, epoch=t.epoch + 1, seconds=round(t.elapsed, 2), **v)
        self.validated_at = t.step
        t.log(
            f"valid epoch {t.epoch + 1} step {t.step}: loss {v['loss']:.3f} "
            f"ppl {v['ppl']:.2f} BLEU {v['bleu']:.2f}" + (" (best)" if improved else "")
        )

    def last_first(self) -> None:
        """checkpoint_last.pt (pending) before the run's first other checkpoint: a folder
        with those but no last is refused on resume (lest a new run overwrite them), so a
        job killed before its first save_every_steps was lost to torchrun's restarts."""
        if not self.last_saved:
            self.save_pending()

    def owed(self, metrics: MetricsLog) -> str:
        """What the run still owes its step before any update (see :meth:`after_update`):
        a run resumed from a pending checkpoint, or a train() called again after one cut
        short in those duties; "max_epochs" when it owes nothing."""
        return self.after_update(metrics) if self.pending else "max_epochs"

    def after_update(self, metrics: MetricsLog, last_of_run: bool = False) -> str:
        """The duties of an update: its saves, then its validation every
        ``valid_every_steps`` (those done already skipped); "max_steps"/"time_limit" when
        the run must stop, else "max_epochs". The step's duties are done unless it stops:
        its stop (:meth:`end`) remains. ``last_of_run``: the last update of the last epoch."""
        t, r = self.t, self.t.recipe
        period = r.save_every_minutes * 60
        if period and t.elapsed >= self.timed_save_at:  # first: checkpoint_last.pt lists it
            self.keep(step_checkpoint_name(t.step))
            self.timed_save_at = (math.floor(t.elapsed / period) + 1) * period  # once saved
        if r.save_every_steps and t.step % r.save_every_steps == 0:
            self.save_pending()
        due = r.valid_every_steps and t.step % r.valid_every_steps == 0
        if due and self.validated_at != t.step:
            if last_of_run or budget_spent(r, t.step, t.elapsed):  # the final one: see end()
                self.save_pending()
            self.validate(metrics)
        stopped_by = budget_spent(r, t.step, t.elapsed) or "max_epochs"
        if stopped_by == "max_epochs":
            self.done_at = t.step
        return stopped_by

    def save_pending(self) -> None:
        """checkpoint_last.pt of this step (unless saved), before its validation and stop."""
        if self.saved_at != self.t.step:
            self.t.save(LAST, pending=True)
            self.saved_at, self.last_saved = self.t.step, True

    def end(self, metrics: MetricsLog, stopped_by: str, epoch_done: bool) -> None:
        """The end of an epoch (``epoch_done``) or a stop (``stopped_by`` other than
        "max_epochs", or the end of the last epoch): its validation and epoch checkpoint;
        then checkpoint_last.pt, not pending: a run resumed from it starts after them.
        Cut short, the run stays at the end of its epoch, which the next try ends again."""
        t, r = self.t, self.t.recipe
        # The last epoch's end is the run's stop: its final model is validated there too.
        stopping = stopped_by != "max_epochs" or (epoch_done and t.epoch + 1 >= r.max_epochs)
        if epoch_done or stopping:
            if (stopping or not r.valid_every_steps) and self.validated_at != t.step:
                if stopping:  # a kill in the final validation keeps the updates before it
                    self.save_pending()
                self.validate(metrics)
            self.keep(epoch_checkpoint_name(t.epoch + 1))
        position = t.epoch, t.batch_in_epoch
        if epoch_done:
            t.epoch, t.batch_in_epoch = t.epoch + 1, 0
        try:
            t.save(LAST)
            self.last_saved = True
        except BaseException:
            # Not saved: back at the epoch's end, which a train() called again then ends
            # again (past it, it would save the epoch's checkpoint under the next one's name).
            t.epoch, t.batch_in_epoch = position
            raise
        self.done_at = t.step


def drop_later_checkpoints(t: Trainer, pending: bool = False) -> None:
    """For a resumed run (rank 0): remove the epoch and timed checkpoints that its
    checkpoint does not list and that were saved at or after its step. The killed run
    saved them after checkpoint_last.pt, from updates the resumed run does again (as
    metrics.jsonl is cut back); kept, they were never pruned, and ``aiayn average`` took
    them among the newest. Only the names a run writes are looked at (a user's copy, such
    as checkpoint_epoch004_old.pt, is not: :data:`~aiayn.checkpoint.KEPT_NAME`).

    One of the very step of a ``pending`` checkpoint is from its step's duties, which
    saved it after that checkpoint (the run's first timed one, after the checkpoint_last.pt
    of :meth:`Duties.last_first`): no update is done again, so it stays, listed."""
    for path in epoch_checkpoints(t.out_dir):
        if path.name in t.epoch_checkpoints:
            continue  # still listed
        step = saved_step(path)
        if pending and step == t.step:
            t.epoch_checkpoints.append(path.name)  # an epoch's is saved again, not twice
        elif step is not None and step >= t.step:
            path.unlink(missing_ok=True)
            t.log(f"removed {path.name} (step {step}): saved after {LAST}, from updates done again")
