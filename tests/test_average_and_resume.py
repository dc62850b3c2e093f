"""Which epoch and timed checkpoints `aiayn average` and a resumed run look at: those a
run writes, newest by the step each was saved at (not by file times, which a copied run
changes), a broken link named in one line; and a fine-tune resumed with its
``--init-from`` spelled another way."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from aiayn.checkpoint import (
    AVERAGED,
    BEST,
    epoch_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from aiayn.cli import main
from aiayn.errors import CheckpointError, RecipeError
from aiayn.train.duties import drop_later_checkpoints
from aiayn.train.model_checks import check_resume
from aiayn.train.recipe import Recipe
from cli_util import one_line_error


def _run(sample_model_dir, folder: Path, saves: list[tuple[str, int]]) -> Path:
    """A run directory of ``saves`` (name, step), each file's time made newer than the one
    before, whatever its step: a copy (cp -r, rsync, a download) writes them in any order."""
    state = load_checkpoint(sample_model_dir() / BEST)
    folder.mkdir()
    for i, (name, step) in enumerate(saves):
        save_checkpoint({**state, "step": step}, folder / name)
        os.utime(folder / name, ns=(10**18 + i * 10**9,) * 2)
    return folder


def _averaged_from(run: Path) -> list[str]:
    return [Path(p).name for p in load_checkpoint(run / AVERAGED)["averaged_from"]]


def test_the_newest_are_those_of_the_latest_steps_not_of_the_latest_file_times(
    sample_model_dir, tmp_path, capsys
):
    """A copied run's files have the copy's times: `average --last 2` took epochs 2 and 1."""
    saves = [(f"checkpoint_epoch{e:03d}.pt", 10 * e) for e in (4, 3, 2, 1)]
    run = _run(sample_model_dir, tmp_path / "copy", saves)
    assert [p.name for p in epoch_checkpoints(run)] == [name for name, _ in saves[::-1]]
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert _averaged_from(run) == ["checkpoint_epoch003.pt", "checkpoint_epoch004.pt"]


def test_a_timed_checkpoint_of_an_epochs_step_is_older_whatever_its_file_time(
    sample_model_dir, tmp_path, capsys
):
    """At one step, the timed checkpoint counts as saved before the epoch's (as the trainer
    saves them), so the average takes that state once even when its file is newer."""
    saves = [("checkpoint_epoch001.pt", 20), ("checkpoint_step0000030.pt", 30)]
    saves += [("checkpoint_epoch002.pt", 40), ("checkpoint_step0000040.pt", 40)]
    run = _run(sample_model_dir, tmp_path / "run", saves)
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert "note: checkpoint_step0000040.pt is step 40, as checkpoint_epoch002.pt" in (
        capsys.readouterr().err
    )
    assert _averaged_from(run) == ["checkpoint_step0000030.pt", "checkpoint_epoch002.pt"]


def test_an_average_beside_a_run_that_prunes_lists_again(sample_model_dir, tmp_path, monkeypatch):
    """`average` while a run trains in the folder with keep_last: a checkpoint pruned
    between the listing and its loading failed the average, naming a file the user never
    gave ("no such checkpoint file"). It lists them again and averages the newest."""
    import aiayn.checkpoint as checkpoints

    saves = [(f"checkpoint_epoch{e:03d}.pt", 10 * e) for e in (1, 2, 3)]
    run = _run(sample_model_dir, tmp_path / "run", saves)
    real, calls = checkpoints.epoch_checkpoints, []

    def listed_then_pruned(model_dir):
        found = real(model_dir)
        calls.append(len(found))
        if len(calls) == 1:  # the run saves epoch 4 and prunes epoch 2 meanwhile
            state = load_checkpoint(run / "checkpoint_epoch003.pt")
            save_checkpoint({**state, "step": 40}, run / "checkpoint_epoch004.pt")
            (run / "checkpoint_epoch002.pt").unlink()
        return found

    monkeypatch.setattr(checkpoints, "epoch_checkpoints", listed_then_pruned)
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert calls == [3, 3] and _averaged_from(run) == [
        "checkpoint_epoch003.pt",
        "checkpoint_epoch004.pt",
    ]


@pytest.mark.parametrize("step", ["abc", -3, True])
def test_a_checkpoint_whose_step_is_no_count_is_named(sample_model_dir, tmp_path, capsys, step):
    """A step that is no count (another tool's checkpoint, or one edited by hand) was a
    TypeError traceback from comparing it with the others' steps."""
    saves = [("checkpoint_epoch001.pt", 10), ("checkpoint_epoch002.pt", step)]
    run = _run(sample_model_dir, tmp_path / "run", saves)
    error = one_line_error(["average", "--model", str(run), "--last", "2"], capsys)
    assert re.search(
        r"checkpoint_epoch002\.pt: checkpoint entry 'step' is .*not a step count", error
    )
    assert not (run / AVERAGED).exists()


def test_a_users_copy_of_a_checkpoint_is_not_averaged(sample_model_dir, tmp_path, capsys):
    """checkpoint_epoch004_before_finetune.pt (a backup) was averaged as one more state."""
    saves = [("checkpoint_step12.pt", 50), ("checkpoint_epoch1.pt", 60)]  # not a run's names
    saves += [("checkpoint_epoch002.pt", 20), ("checkpoint_epoch003.pt", 30)]
    saves += [("checkpoint_epoch004.pt", 40), ("checkpoint_epoch004_before_finetune.pt", 40)]
    run = _run(sample_model_dir, tmp_path / "run", saves)
    assert [p.name for p in epoch_checkpoints(run)] == [
        "checkpoint_epoch002.pt",
        "checkpoint_epoch003.pt",
        "checkpoint_epoch004.pt",
    ]
    assert main(["average", "--model", str(run), "--last", "3"]) == 0
    assert _averaged_from(run) == [
        "checkpoint_epoch002.pt",
        "checkpoint_epoch003.pt",
        "checkpoint_epoch004.pt",
    ]


def test_a_broken_link_is_named_and_a_file_gone_since_the_listing_is_left_out(
    sample_model_dir, tmp_path, capsys, monkeypatch
):
    """A dangling link named like a checkpoint gave a FileNotFoundError traceback in
    `average` and in `train --resume` (dropping the checkpoints saved after the last)."""
    run = _run(sample_model_dir, tmp_path / "run", [("checkpoint_epoch001.pt", 10)])
    link = run / "checkpoint_epoch000.pt"
    link.symlink_to(tmp_path / "gone" / "checkpoint_epoch000.pt")
    err = one_line_error(["average", "--model", str(run)], capsys)
    assert f"{link}: cannot read (a broken link to {tmp_path / 'gone'}" in err, err
    trainer = SimpleNamespace(out_dir=run, epoch_checkpoints=[], step=5, log=print)
    with pytest.raises(CheckpointError, match=r"checkpoint_epoch000\.pt: cannot read"):
        drop_later_checkpoints(trainer)  # type: ignore[arg-type]
    link.unlink()
    # Pruned between the listing and the look at it (a run pruning while `average` runs).
    listed = Path.glob

    def glob_with_a_gone_file(self: Path, pattern: str):
        return [*listed(self, pattern), self / "checkpoint_epoch009.pt"]

    monkeypatch.setattr(Path, "glob", glob_with_a_gone_file)
    assert [p.name for p in epoch_checkpoints(run)] == ["checkpoint_epoch001.pt"]
    drop_later_checkpoints(trainer)  # type: ignore[arg-type]
    assert not (run / "checkpoint_epoch001.pt").exists()  # step 10 >= 5: saved after it


def _resumed(base: Path, started: str) -> dict:
    """The state of a fine-tune started with ``--init-from started`` (as the trainer
    records it: the spec in the recipe, the file it resolved to in the origin)."""
    return {
        "config": {},
        "recipe": {"init_from": started},
        "origin": {"init_from": str(base / BEST)},
    }


def test_resume_takes_the_start_checkpoint_in_any_spelling(tmp_path):
    """Started as base:best, a resume with --init-from base (or base/checkpoint_best.pt)
    was refused as another model: the recipe's text was compared, not the checkpoint."""
    base, other = tmp_path / "base", tmp_path / "other"
    for folder in (base, other):
        folder.mkdir()
        (folder / BEST).write_bytes(b"a checkpoint")
    (tmp_path / "link").symlink_to(base)
    state = _resumed(base, f"{base}:best")
    same = [str(base), f"{base}:best", f"{base}:auto", str(base / BEST), f"{tmp_path}/link"]
    for spec in same:
        check_resume(Recipe.from_dict({"init_from": spec}), state, "ft/checkpoint_last.pt")
    (base / "checkpoint_last.pt").write_bytes(b"another checkpoint")
    for spec in (str(other), f"{base}:last", str(tmp_path / "missing"), f"{base}:averaged"):
        with pytest.raises(RecipeError, match=re.escape(f"init_from={spec} differs")):
            check_resume(Recipe.from_dict({"init_from": spec}), state, "ft/checkpoint_last.pt")
    # A run that records no origin (nor one that started from scratch) takes no other.
    with pytest.raises(RecipeError, match="started from scratch"):
        check_resume(Recipe.from_dict({"init_from": str(base)}), {"config": {}}, "x.pt")
    # Under torchrun, rank 0's start is the run's: another machine's rank names the same
    # model at its own path (distributed.md), which its resume never reads. It was refused,
    # so a job of model paths that differ by machine could never resume.
    elsewhere = Recipe.from_dict({"init_from": str(other)})
    check_resume(elsewhere, state, "ft/checkpoint_last.pt", start=False)


def test_averages_notes_go_to_stderr_as_every_commands_do(sample_model_dir, tmp_path, capsys):
    """average printed its notes on stdout, where every other command writes only its
    result: `aiayn average ... > log` hid them, and a script reading the result read them."""
    run = _run(
        sample_model_dir,
        tmp_path / "run",
        [("checkpoint_step0000010.pt", 10), ("checkpoint_epoch001.pt", 10)],
    )
    assert main(["average", "--model", str(run), "--last", "5"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("averaged checkpoint_epoch001.pt -> ") and "note:" not in out, out
    assert "note: checkpoint_step0000010.pt is step 10, as checkpoint_epoch001.pt" in err
    assert "note: averaging the 1 checkpoint(s) found (asked 5)" in err
