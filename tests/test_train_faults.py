"""`aiayn train` meeting faults a user's own run meets: a kill between checkpoints and
--resume (TensorBoard's points too), a full disk, non-finite numbers in the log, data
changed under a resume, a run refused once its text is prepared; and the final
validation of a run that ends at max_epochs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from aiayn.errors import CheckpointError, TrainingError
from aiayn.train.metrics_log import MetricsLog
from cli_util import one_line_error, with_settings
from test_train_refusals import TINY_RUN


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> dict[str, Path]:
    """The built-in sample pairs as text files (train.de, train.en, val.de, val.en)."""
    from sample_data import write_sample

    return write_sample(tmp_path_factory.mktemp("text"))


def train_text(text: dict[str, Path], out: Path, *settings: str) -> list[str]:
    """The argv of a TINY_RUN training on the sample text into ``out``."""
    files = ["--train-src", text["train.de"], "--train-tgt", text["train.en"]]
    files += ["--valid-src", text["val.de"], "--valid-tgt", text["val.en"]]
    argv = ["train", *map(str, files), "--out", str(out), "--no-progress"]
    return [*argv, "--set", *with_settings([*TINY_RUN, "vocab_size=120"], *settings)]


def logged(out: Path, kind: str = "train") -> list[int]:
    """The steps of the ``kind`` lines of ``out``'s metrics.jsonl, read as strict JSON."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    return [r["step"] for r in records if r["kind"] == kind]


def test_a_resume_cuts_the_log_back_to_its_checkpoint(tmp_path, text):
    """Lines a killed run logged after its last checkpoint (the buffer reaches the disk
    every few dozen updates) are logged again by the resumed run: they are cut off at
    resume, so that every update is in metrics.jsonl once."""
    out = tmp_path / "run"
    assert main(train_text(text, out, "max_steps=3")) == 0
    with (out / "metrics.jsonl").open("a") as log:  # as a run killed after update 4 left it
        log.write('{"kind": "train", "step": 4, "loss": 9.0}\n')
        log.write('{"kind": "valid", "step": 4, "loss": 9.0}\n')
    assert main([*train_text(text, out, "max_steps=5"), "--resume"]) == 0
    assert logged(out) == [1, 2, 3, 4, 5]
    assert 9.0 not in [json.loads(line).get("loss") for line in (out / "metrics.jsonl").open()]


def test_a_resume_records_its_overrides_in_the_runs_recipe(tmp_path, text):
    """run-directory.md: the run's recipe.yaml holds the recipe as run, overrides included,
    and resumes it. A resume's overrides were not written, so the recipe.yaml of a run
    resumed with a larger max_steps still said the first one."""
    import yaml

    out = tmp_path / "run"
    assert main(train_text(text, out, "max_epochs=1")) == 0
    # at an epoch's end, where the seed may change too
    assert main([*train_text(text, out, "max_epochs=2", "seed=7"), "--resume"]) == 0
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert (recipe["max_epochs"], recipe["seed"]) == (2, 7)
    steps = len(logged(out))
    argv = ["train", "--config", str(out / "recipe.yaml"), "--out", str(out), "--resume"]
    assert main([*argv, "--no-progress", "--set", "max_epochs=3"]) == 0
    assert logged(out) == list(range(1, len(logged(out)) + 1)) and len(logged(out)) > steps
    assert load_checkpoint(out / "checkpoint_last.pt")["recipe"]["seed"] == 7


def test_a_resume_of_an_older_checkpoint_cuts_the_log_at_its_step(tmp_path, text):
    """A checkpoint of an older aiayn has no metrics_bytes (the log's size when saved):
    the lines of the later steps were kept, so the resumed run logged them twice."""
    from aiayn.checkpoint import LAST, save_checkpoint

    out = tmp_path / "run"
    assert main(train_text(text, out, "max_steps=3")) == 0
    state = load_checkpoint(out / LAST)
    del state["metrics_bytes"]  # as older aiayn saved it
    save_checkpoint(state, out / LAST)
    with (out / "metrics.jsonl").open("a") as log:  # as a run killed after update 4 left it
        log.write('{"kind": "train", "step": 4, "loss": 9.0}\n')
        log.write('{"kind": "valid", "step": 4, "loss": 9.0}\n')
    assert main([*train_text(text, out, "max_steps=5"), "--resume"]) == 0
    assert logged(out) == [1, 2, 3, 4, 5]
    assert 9.0 not in [json.loads(line).get("loss") for line in (out / "metrics.jsonl").open()]


def test_the_log_writes_json_and_names_itself_when_the_disk_is_full(tmp_path):
    """A NaN loss is logged as a string (JSON has no NaN); a failed write is one
    TrainingError naming metrics.jsonl, not an OSError from deep inside."""
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write("valid", 1, loss=float("nan"), ppl=float("inf"), bleu=0.0)
    log.size()
    assert logged(tmp_path, "valid") == [1]

    class Full:
        def write(self, _text: str) -> int:
            raise OSError(28, "No space left on device")

        flush = close = tell = lambda self: 0

    log.file = Full()  # type: ignore[assignment]
    with pytest.raises(TrainingError, match=r"metrics\.jsonl: cannot write \(No space left"):
        log.write("valid", 2, loss=1.0)


def test_a_full_disk_while_preparing_or_starting_a_run_is_one_line(
    tmp_path, text, monkeypatch, capsys
):
    """A write that fails for want of space (token files, the run's tokenizer or recipe)
    is one line naming the folder, not an OSError traceback; no half-prepared data stays,
    and a new run into what the stopped one left takes it."""
    import aiayn.data.shards as shards
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.train.recipe import Recipe

    def full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(shards.SplitWriter, "write", full)
        out = tmp_path / "prepared"
        files = [str(text[name]) for name in ("train.de", "train.en", "val.de", "val.en")]
        flags = ("--train-src", "--train-tgt", "--valid-src", "--valid-tgt")
        argv = ["prepare", *(x for pair in zip(flags, files) for x in pair), "--out", str(out)]
        err = one_line_error([*argv, "--vocab-size", "120", "--no-progress"], capsys)
        assert f"{out}: cannot write the prepared data (No space left on device)" in err
        assert list(tmp_path.iterdir()) == []  # no folder, no .prepared.*.tmp
        err = one_line_error(train_text(text, tmp_path / "run", "max_steps=1"), capsys)
        assert f"{tmp_path / 'run' / 'data'}: cannot write the prepared data" in err
    for owner in (Recipe, Tokenizer):  # recipe.yaml, then spm.model
        with monkeypatch.context() as patch:
            patch.setattr(owner, "save", full)
            run = tmp_path / owner.__name__
            err = one_line_error(train_text(text, run, "max_steps=1"), capsys)
            assert f"{run}: cannot write " in err and "No space left on device" in err
            assert not list(run.glob("checkpoint*"))
        # What the stopped run left (its data/, perhaps its recipe) is a run to replace.
        assert main(train_text(text, run, "max_steps=1")) == 0
        assert (run / "checkpoint_last.pt").is_file()


def test_raw_text_is_prepared_with_its_progress_and_log(tmp_path, text, capsys):
    """`train` on raw text prepared it in silence (minutes on millions of pairs): now it
    says so and logs prepare's lines, and shows its progress unless --no-progress."""
    quiet = train_text(text, tmp_path / "quiet", "max_steps=1")
    assert "--no-progress" in quiet
    shown = [a for a in train_text(text, tmp_path / "shown", "max_steps=1") if a != "--no-progress"]
    for argv, run in ((shown, tmp_path / "shown"), (quiet, tmp_path / "quiet")):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert f"preparing the text into {run / 'data'}" in out
        assert f"prepared {run / 'data'}" in out and "tokenizer: " in out
        steps = [line.split(":")[0] for line in err.splitlines() if " pairs" in line]
        assert steps == (["sample", "train", "valid"] if argv is shown else []), err


def test_a_resume_naming_other_text_is_refused(tmp_path, text, capsys):
    """--resume with text files other than those the run's data/ was prepared from used
    to go on with the old data and leave them unread; now refused in one line. The same
    text moved elsewhere (same size and sha256) resumes."""
    out = tmp_path / "run"
    assert main(train_text(text, out, "max_steps=2")) == 0
    other = tmp_path / "other.de"
    other.write_text("Ein anderer Satz.\n" * 50, encoding="utf-8")
    argv = train_text(text, out, "max_steps=3")
    changed = [str(other) if a == str(text["train.de"]) else a for a in argv]
    err = one_line_error([*changed, "--resume"], capsys)
    assert f"recipe field train_src={other} is not the file the run being resumed" in err
    assert str(text["train.de"]) in err
    moved = tmp_path / "moved.de"
    moved.write_bytes(text["train.de"].read_bytes())
    argv = [str(moved) if a == str(text["train.de"]) else a for a in argv]
    assert main([*argv, "--resume"]) == 0
    assert logged(out) == [1, 2, 3]


def test_a_resume_of_prepared_data_with_other_data_is_refused(tmp_path, text, capsys):
    """A run of a prepared directory resumed with another one (of the same tokenizer), or
    with other raw text, went on: its saved position then indexed another batch plan.
    Refused in one line; a copy of its own data elsewhere resumes."""
    import shutil

    def prepare(out: Path, src: Path, *more: str) -> Path:
        files = ["--train-src", str(src), "--train-tgt", str(text["train.en"])]
        files += ["--valid-src", str(text["val.de"]), "--valid-tgt", str(text["val.en"])]
        argv = ["prepare", *files, "--out", str(out), "--no-progress", *more]
        size = [] if "--spm-model" in more else ["--vocab-size", "120"]  # the given one's
        assert main([*argv, *size]) == 0
        return out

    mine = prepare(tmp_path / "mine", text["train.de"])
    shuffled = tmp_path / "shuffled.de"
    shuffled.write_text("".join(reversed(text["train.de"].read_text().splitlines(True))))
    other = prepare(tmp_path / "other", shuffled, "--spm-model", str(mine))
    out = tmp_path / "run"

    def run(data: Path, steps: int) -> list[str]:
        argv = ["train", "--data", str(data), "--out", str(out), "--no-progress"]
        return [*argv, "--set", *TINY_RUN, f"max_steps={steps}"]

    assert main(run(mine, 2)) == 0
    err = one_line_error([*run(other, 3), "--resume"], capsys)
    assert f"{other}: not the data the run being resumed trained on" in err
    as_text = train_text({**text, "train.de": shuffled}, out, "max_steps=3")
    err = one_line_error([*as_text, "--resume"], capsys)
    assert "not the data the run being resumed trained on" in err
    copy = Path(shutil.copytree(mine, tmp_path / "copy"))
    assert main([*run(copy, 3), "--resume"]) == 0
    assert logged(out) == [1, 2, 3]


def test_a_validation_with_a_non_finite_loss_is_never_the_best(tmp_path, text, monkeypatch):
    """A model that gives a NaN validation loss is broken: it is not saved as the best,
    whatever BLEU its (garbage) translations get; a finite one then is. The stop at step 2,
    just validated, validates it once (it was validated twice, and logged twice)."""
    import aiayn.train.trainer as trainer

    losses = [float("nan"), 2.0]  # then 2.0 again at every later validation
    monkeypatch.setattr(
        trainer,
        "validate_world",
        lambda *a: {
            "loss": losses.pop(0) if len(losses) > 1 else losses[0],
            "ppl": 1.0,
            "bleu": 5.0,
        },
    )
    out = tmp_path / "run"
    argv = train_text(text, out, "max_steps=2", "valid_every_steps=1", "max_epochs=1")
    assert main(argv) == 0
    valid = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    valid = [r for r in valid if r["kind"] == "valid"]
    assert [(r["step"], r["loss"]) for r in valid] == [(1, "nan"), (2, 2.0)]
    assert load_checkpoint(out / "checkpoint_best.pt")["step"] == 2


def interrupted(*_args: object) -> dict:
    """validate_world of a run that Ctrl-C (or a kill) stops in its validation."""
    raise KeyboardInterrupt


@pytest.mark.parametrize("cut", ["interrupted in the validation", "disk full at the last save"])
def test_a_run_cut_short_while_it_stops_does_its_stop_when_resumed(
    tmp_path, text, monkeypatch, capsys, cut
):
    """checkpoint_last.pt of the stopping step is saved (every save_every_steps) before
    that step's validation, epoch checkpoint and final save. A run cut short there (Ctrl-C
    or a kill in a long validation; a full disk at its last save) and resumed used to find
    its max_steps reached and do nothing: no final validation, best or epoch checkpoint,
    nothing for `aiayn average`, and after a full disk the log had lost the validation of
    that step. The resumed run now does them, once; resumed again, nothing."""
    import aiayn.train.trainer as trainer

    out = tmp_path / "run"
    argv = train_text(text, out, "max_steps=2", "save_every_steps=2", "valid_every_steps=0")
    save, lasts = trainer.save_checkpoint, []

    def full(state: dict, path: Path) -> Path:
        if Path(path).name == "checkpoint_last.pt" and state["step"] == 2:
            lasts.append(path)
            if len(lasts) == 2:  # the last one, after the validation and epoch checkpoint
                raise CheckpointError(f"{path}: cannot write (No space left on device)")
        return save(state, path)

    with monkeypatch.context() as patch:
        if cut.startswith("interrupted"):
            patch.setattr(trainer, "validate_world", interrupted)
            assert main(argv) == 130
        else:
            patch.setattr(trainer, "save_checkpoint", full)
            assert main(argv) == 2 and "No space left on device" in capsys.readouterr().err
    assert load_checkpoint(out / "checkpoint_last.pt")["step"] == 2
    assert main([*argv, "--resume"]) == 0
    said = capsys.readouterr().out
    assert logged(out) == [1, 2] and logged(out, "valid") == [2]
    for name in ("checkpoint_epoch001.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        assert load_checkpoint(out / name)["step"] == 2, name
    assert "reached its max_steps but was stopped before its final validation" in said
    assert main(["average", "--model", str(out), "--last", "1"]) == 0
    assert main([*argv, "--resume"]) == 0
    assert "nothing to do: the run already reached its max_steps" in capsys.readouterr().out
    assert logged(out, "valid") == [2]


def test_a_stop_cut_short_keeps_its_timed_checkpoint_and_is_done_past_max_epochs(
    tmp_path, text, monkeypatch, capsys
):
    """A timed checkpoint of the stopping step was saved after checkpoint_last.pt, which
    then did not list it: the resumed run removed it as from updates done again, and it was
    never saved again. And a run resumed with a lower max_epochs than the epoch it stopped
    in said it would do its owed stop, then did nothing."""
    import aiayn.train.trainer as trainer

    out = tmp_path / "run"
    settings = ("save_every_steps=4", "valid_every_steps=100", "save_every_minutes=1e-6")
    argv = train_text(text, out, "max_steps=4", *settings)  # 3 batches an epoch: in the 2nd
    with monkeypatch.context() as patch:
        patch.setattr(trainer, "validate_world", interrupted)
        assert main(argv) == 130
    assert load_checkpoint(out / "checkpoint_last.pt")["epoch_checkpoints"][-1] == (
        "checkpoint_step0000004.pt"
    )
    capsys.readouterr()
    assert main([*argv, "max_epochs=1", "--resume"]) == 0
    said = capsys.readouterr().out
    assert "removed" not in said and (out / "checkpoint_step0000004.pt").is_file()
    assert logged(out, "valid") == [4]
    assert load_checkpoint(out / "checkpoint_epoch002.pt")["step"] == 4


@pytest.mark.parametrize("max_steps", [2, 4])
def test_a_run_interrupted_in_a_validation_does_it_when_resumed(
    tmp_path, text, monkeypatch, max_steps
):
    """checkpoint_last.pt is saved before the validation of its step: a run interrupted in
    that validation (every valid_every_steps; at step 2, its stop or not) and resumed
    validates that step first, and once (it skipped it, and at its max_steps did nothing)."""
    import aiayn.train.trainer as trainer

    out = tmp_path / "run"
    settings = ("save_every_steps=2", "valid_every_steps=2")
    argv = train_text(text, out, f"max_steps={max_steps}", *settings)
    with monkeypatch.context() as patch:
        patch.setattr(trainer, "validate_world", interrupted)
        assert main(argv) == 130
    assert main([*argv, "--resume"]) == 0
    assert logged(out, "valid") == list(range(2, max_steps + 1, 2))
    assert load_checkpoint(out / "checkpoint_last.pt")["step"] == max_steps


def test_a_resume_removes_the_checkpoints_a_killed_run_saved_after_its_last(tmp_path, text, capsys):
    """A timed (or epoch) checkpoint the killed run saved after checkpoint_last.pt is from
    updates the resumed run does again: it was never pruned (the resumed checkpoint does
    not list it) and `aiayn average` took it among the newest. It is removed, and said;
    an older one the run does not list stays."""
    from aiayn.checkpoint import save_checkpoint

    out = tmp_path / "run"
    assert main(train_text(text, out, "max_steps=2")) == 0
    state = load_checkpoint(out / "checkpoint_last.pt")
    for step in (1, 3):  # a file the user keeps; one the killed run saved at step 3
        save_checkpoint({**state, "step": step}, out / f"checkpoint_step{step:07d}.pt")
    save_checkpoint({**state, "step": 3}, out / "checkpoint_epoch001-good.pt")  # a user's copy
    assert main([*train_text(text, out, "max_steps=4"), "--resume"]) == 0
    said = capsys.readouterr().out
    assert "removed checkpoint_step0000003.pt (step 3): saved after checkpoint_last.pt" in said
    assert not (out / "checkpoint_step0000003.pt").exists()
    assert (out / "checkpoint_step0000001.pt").exists()
    assert (out / "checkpoint_epoch001-good.pt").exists()


def test_a_run_that_ends_at_max_epochs_validates_its_final_model(tmp_path, text):
    """With valid_every_steps set, a run stopped by max_steps validated its final model,
    one that reached max_epochs did not (the best checkpoint never saw it). 3 updates an
    epoch: validated at 2 and at the end, 3, as when max_steps=3 stops it."""
    for stop in ("max_epochs=1", "max_steps=3"):
        out = tmp_path / stop
        assert main(train_text(text, out, stop, "valid_every_steps=2")) == 0
        assert logged(out) == [1, 2, 3] and logged(out, "valid") == [2, 3], stop
        assert load_checkpoint(out / "checkpoint_last.pt")["epoch"] == 1


def test_a_run_refused_after_preparing_its_text_leaves_no_data_behind(tmp_path, text, capsys):
    """A new run refused by a check of the pairs it prepared (none fits model.max_len, for
    training or for validation) left OUT/data/, without a recipe.yaml beside it: the
    corrected run, of other text, into the same --out was then refused ("prepared data of
    other text"). It removes its data/ and the directories it made; a folder that was there
    keeps what it held, and a resumed run its data/."""
    out = tmp_path / "new" / "run"
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "README").write_text("mine\n")
    for bad, words in [
        ("model.max_len=3", "train: all 50 pairs are longer than model.max_len=3"),
        ("model.max_len=13", "valid: all 10 pairs of "),
    ]:
        assert words in one_line_error(train_text(text, out, "max_steps=1", bad), capsys)
        assert not (tmp_path / "new").exists(), bad
        one_line_error(train_text(text, keep, "max_steps=1", bad), capsys)
        assert [p.name for p in keep.iterdir()] == ["README"], bad
        assert (keep / "README").read_text() == "mine\n"
    other = dict(text)
    for name in ("train.de", "train.en"):  # the corrected run's text: one pair more
        other[name] = tmp_path / f"other.{name}"
        other[name].write_text(text[name].read_text() + "Ein Satz mehr.\n")
    assert main(train_text(other, out, "max_steps=1")) == 0
    prepared = sorted(p.name for p in (out / "data").iterdir())
    err = one_line_error([*train_text(text, out, "max_steps=2"), "--resume"], capsys)
    assert "is not the file the run being resumed" in err
    assert sorted(p.name for p in (out / "data").iterdir()) == prepared


def test_tensorboard_keeps_one_point_a_step_when_a_resume_validates_again(
    tmp_path, text, monkeypatch
):
    """Killed after the validation of a step saved pending (checkpoint_last.pt first), a
    run resumed validates that step again: TensorBoard, purged from the next step only,
    kept both points. Now it holds what the run not killed holds, the step's update too."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import aiayn.train.trainer as trainer

    def points(out: Path) -> dict[str, list]:
        events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        timed = ("seconds", "speed/")  # differ from run to run: their steps only
        return {
            tag: [(e.step, None if any(t in tag for t in timed) else e.value) for e in points]
            for tag in events.Tags()["scalars"]
            for points in [events.Scalars(tag)]
        }

    settings = ("max_steps=4", "save_every_steps=2", "valid_every_steps=2", "log_every=1")
    assert main(train_text(text, tmp_path / "alone", *settings)) == 0
    argv = train_text(text, tmp_path / "run", *settings)
    update, updates = trainer.Updater.update, []

    def killed(self: object, *args: object) -> object:
        updates.append(1)
        if len(updates) == 3:  # after step 2: saved pending, then validated and logged
            raise KeyboardInterrupt
        return update(self, *args)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(trainer.Updater, "update", killed)
        assert main(argv) == 130
    assert logged(tmp_path / "run", "valid") == [2]
    assert main([*argv, "--resume"]) == 0
    assert logged(tmp_path / "run", "valid") == [2, 4]
    wanted = points(tmp_path / "alone")
    assert [s for s, _ in wanted["valid/bleu"]] == [2, 4] and wanted["train/loss"][1][0] == 2
    assert points(tmp_path / "run") == wanted
