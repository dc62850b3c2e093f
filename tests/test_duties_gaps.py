"""train.duties: gaps the suite left (found by a mutation run)."""

from __future__ import annotations

from types import SimpleNamespace

from aiayn.train.duties import drop_later_checkpoints
from test_average_and_resume import _run


def test_a_resume_drops_only_the_unlisted_checkpoints_saved_at_or_after_its_step(
    sample_model_dir, tmp_path
):
    """Kept: those listed, those saved before the resumed step, and a run's-name file
    with no readable step; dropped: the unlisted ones of the step or later."""
    saves = [
        ("checkpoint_epoch001.pt", 4),  # before the step: the resumed run made it too
        ("checkpoint_epoch002.pt", 5),  # at the step: from updates done again
        ("checkpoint_epoch003.pt", 9),  # after it
        ("checkpoint_epoch004.pt", 12),  # listed in the resumed checkpoint: kept
    ]
    run = _run(sample_model_dir, tmp_path / "run", saves)
    (run / "checkpoint_step0000100.pt").write_bytes(b"not a checkpoint")
    logged: list[str] = []
    trainer = SimpleNamespace(
        out_dir=run, epoch_checkpoints=["checkpoint_epoch004.pt"], step=5, log=logged.append
    )
    drop_later_checkpoints(trainer)  # type: ignore[arg-type]
    left = sorted(p.name for p in run.glob("checkpoint_*.pt"))
    assert "checkpoint_epoch001.pt" in left and "checkpoint_epoch004.pt" in left
    assert "checkpoint_step0000100.pt" in left  # no step to tell: kept
    assert "checkpoint_epoch002.pt" not in left and "checkpoint_epoch003.pt" not in left
    assert len(logged) == 2 and all("from updates done again" in line for line in logged)


def test_a_save_every_steps_checkpoint_counts_as_the_last_before_the_first_epoch_one(
    tmp_path, sample_prepared
):
    """checkpoint_last.pt saved every save_every_steps is the one that comes before the
    run's first epoch checkpoint (at step 3, the sample's epoch): no second pending save of
    it there (module doc: the epoch's validation, its checkpoint, then checkpoint_last.pt
    once more). At the stop, step 4, the one of save_every_steps is the pending one too."""
    from aiayn.train.trainer import Trainer
    from test_train_library_use import quiet, tiny

    recipe = tiny(sample_prepared, "max_steps=4", "save_every_steps=2", "valid_every_steps=0")
    trainer = Trainer(recipe, tmp_path / "r", log=quiet)
    saves: list[tuple[str, int, bool]] = []
    _train_watching_saves(
        trainer, lambda name, pending: saves.append((name, trainer.step, pending))
    )
    lasts = [(step, pending) for name, step, pending in saves if name == "checkpoint_last.pt"]
    assert lasts == [(2, True), (3, False), (4, True), (4, False)], saves


def test_an_old_epoch_checkpoint_deleted_by_hand_is_not_an_error_when_pruned(
    tmp_path, sample_prepared
):
    """keep_last prunes the oldest epoch checkpoint; one already gone (deleted by its
    user to free the disk) does not stop the run."""
    from aiayn.train.trainer import Trainer
    from test_train_library_use import quiet, tiny

    recipe = tiny(sample_prepared, "max_epochs=2", "keep_last=1", "valid_every_steps=0")
    out = tmp_path / "r"
    trainer = Trainer(recipe, out, log=quiet)

    def deleting_the_first(name, pending):
        if name == "checkpoint_epoch002.pt":
            (out / "checkpoint_epoch001.pt").unlink()

    _train_watching_saves(trainer, deleting_the_first)
    assert sorted(p.name for p in out.glob("checkpoint_epoch*.pt")) == ["checkpoint_epoch002.pt"]


def _train_watching_saves(trainer, before) -> None:
    """Train ``trainer`` to its end, calling ``before(name, pending)`` ahead of each of its
    saves, and let go of its run directory however the run ends."""
    save = trainer.save

    def watched(name, fence=True, pending=False):
        before(name, pending)
        return save(name, fence=fence, pending=pending)

    trainer.save = watched
    try:
        trainer.train()
    finally:
        trainer.run.release()


class _Trainer:
    """What Duties.keep reads of a trainer."""

    def __init__(self, out_dir, keep_last: int):
        from types import SimpleNamespace

        self.out_dir, self.step, self.elapsed, self.epoch_checkpoints = out_dir, 1, 0.0, []
        self.recipe = SimpleNamespace(save_every_minutes=0, keep_last=keep_last)
        self.world = SimpleNamespace(is_main=True)

    def save(self, name, fence=True, pending=False):
        (self.out_dir / name).write_bytes(b"x")
        return self.out_dir / name


def test_an_epoch_checkpoint_saved_again_counts_once_and_is_not_pruned(tmp_path):
    """A time-limited run's partial epoch, finished after a resume, rewrites the same
    file: it is listed once, and pruning to keep_last keeps it."""
    from aiayn.train.duties import Duties

    trainer = _Trainer(tmp_path, keep_last=2)
    duties = Duties(trainer)  # type: ignore[arg-type]
    for name in ("checkpoint_epoch001.pt", "checkpoint_epoch002.pt", "checkpoint_epoch002.pt"):
        duties.keep(name)
    assert trainer.epoch_checkpoints == ["checkpoint_epoch001.pt", "checkpoint_epoch002.pt"]
    assert (tmp_path / "checkpoint_epoch001.pt").exists()
    assert (tmp_path / "checkpoint_epoch002.pt").exists()
    duties.keep("checkpoint_epoch003.pt")
    assert trainer.epoch_checkpoints == ["checkpoint_epoch002.pt", "checkpoint_epoch003.pt"]
    assert not (tmp_path / "checkpoint_epoch001.pt").exists()
