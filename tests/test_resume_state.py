"""What a resumed run takes from its checkpoint besides weights, optimizer and position:
fp16's loss scale, the count of non-finite updates in a row, and the timed checkpoint its
step saved after it; and a validation beam no run could use, refused before training."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.cli import main
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer
from cli_util import one_line_error
from test_train_faults import train_text


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> dict[str, Path]:
    from sample_data import write_sample

    return write_sample(tmp_path_factory.mktemp("text"))


def test_a_resumed_run_keeps_its_loss_scale_and_its_non_finite_streak(tmp_path, text):
    """fp16's loss scale was not saved: every resume started again at 2^16, so a run whose
    scale had settled lower overflowed (skipping updates) and then trained other weights
    than the uninterrupted run (0.22 apart after one overflow). Nor was the count of
    non-finite updates in a row, which stops a diverging run: a resumed one stopped later."""
    out = tmp_path / "run"
    argv = train_text(text, out, "precision=fp16", "max_steps=2")
    assert main(argv) == 0
    state = load_checkpoint(out / "checkpoint_last.pt")
    assert state["loss_scale"]["scale"] == 2.0**16 and state["bad_in_a_row"] == 0
    settled = {**state["loss_scale"], "scale": 1024.0, "_growth_tracker": 7}
    save_checkpoint({**state, "loss_scale": settled, "bad_in_a_row": 5}, out / "checkpoint_last.pt")

    trainer = Trainer(Recipe.from_yaml(out / "recipe.yaml"), out, resume=True, log=print)
    assert trainer.updater.scaler.state_dict() == settled
    assert trainer.bad_in_a_row == 5
    trainer.run.release()
    del trainer
    assert main([*train_text(text, out, "precision=fp16", "max_steps=3"), "--resume"]) == 0
    scale = load_checkpoint(out / "checkpoint_last.pt")["loss_scale"]
    assert (scale["scale"], scale["_growth_tracker"]) == (1024.0, 8)  # one more update


def test_the_first_timed_checkpoint_survives_a_kill_right_after_it(tmp_path, text, monkeypatch):
    """The run's first timed checkpoint comes after the pending checkpoint_last.pt saved
    for it (at the same step, not listing it). A kill between the two and a resume removed
    it "from updates done again", though none is done again, and it was never saved again."""
    import aiayn.train.duties as duties

    out = tmp_path / "run"
    argv = train_text(text, out, "max_steps=2", "save_every_minutes=1e-6", "keep_last=5")
    keep = duties.Duties.keep

    def killed_after_timed(self: duties.Duties, name: str) -> None:
        keep(self, name)
        if name.startswith("checkpoint_step"):
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(duties.Duties, "keep", killed_after_timed)
        assert main(argv) == 130
    last = load_checkpoint(out / "checkpoint_last.pt")
    assert last["step"] == 1 and last["epoch_checkpoints"] == []
    assert (out / "checkpoint_step0000001.pt").is_file()
    assert main([*argv, "--resume"]) == 0
    assert (out / "checkpoint_step0000001.pt").is_file()
    kept = load_checkpoint(out / "checkpoint_last.pt")["epoch_checkpoints"]
    assert kept[0] == "checkpoint_step0000001.pt", kept


def test_a_validation_beam_wider_than_the_vocabulary_is_refused_before_training(
    tmp_path, text, capsys
):
    """It was refused at the first validation, after an epoch of training, naming no field."""
    out = tmp_path / "run"
    err = one_line_error(train_text(text, out, "valid_beam=121"), capsys)
    assert "recipe field valid_beam: 121 is larger than the target vocabulary (120" in err
    assert not out.exists() or not any(out.glob("*.pt"))
    assert main(train_text(text, out, "valid_beam=120", "max_steps=1")) == 0


@pytest.mark.parametrize("stop", ["max_steps=2", "max_epochs=1"])  # mid-epoch; an epoch's end
@pytest.mark.parametrize("periodic", [False, True])  # the stop's validation, or valid_every's
def test_a_run_killed_in_its_final_validation_keeps_every_update(
    tmp_path, text, monkeypatch, stop, periodic
):
    """checkpoint_last.pt is saved at the stop before the final validation, as at every
    save_every_steps, also where valid_every_steps validates the stop's step: a kill in
    that validation (long, with a large validation set) lost the updates since the last
    save_every_steps (all of them: no checkpoint at all), though the docs said it kept them."""
    import aiayn.train.trainer as trainer
    from test_train_faults import interrupted, logged

    out = tmp_path / "run"
    steps = 2 if stop == "max_steps=2" else 3  # the sample's epoch is 3 batches
    every = f"valid_every_steps={steps if periodic else 0}"
    argv = train_text(text, out, stop, "save_every_steps=100", every)
    with monkeypatch.context() as patch:
        patch.setattr(trainer, "validate_world", interrupted)
        assert main(argv) == 130
    last = load_checkpoint(out / "checkpoint_last.pt")
    assert (last["step"], last["duties_pending"]) == (steps, True)
    assert main([*argv, "--resume"]) == 0
    assert logged(out) == list(range(1, steps + 1)) and logged(out, "valid") == [steps]
    for name in ("checkpoint_epoch001.pt", "checkpoint_last.pt"):
        assert load_checkpoint(out / name)["step"] == steps, name
    assert load_checkpoint(out / "checkpoint_last.pt")["duties_pending"] is False
