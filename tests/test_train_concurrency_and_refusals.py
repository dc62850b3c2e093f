"""Training runs against what a sweep of broken recipes, interruptions and concurrent runs
found: a second run into a directory in use is refused (it interleaved its metrics and
checkpoints with the first's), a run's own checkpoint is not replaced by an average (its
resume state was lost), a recipe that trains nothing is refused, and recipe values that
met a traceback (huge numbers, keys that are not names) or were silently ignored (ids the
tokenizer sets) are one line naming the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from aiayn.config import TransformerConfig
from aiayn.errors import AiaynError
from aiayn.model.transformer import Transformer
from aiayn.train import model_checks
from aiayn.train.model_checks import (
    check_fits,
    check_same_recipe,
    job_fields,
    parameter_estimate,
)
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer
from cli_util import with_settings
from conftest import small_corpus
from test_pipeline import TINY, fail, records, train_argv

pytestmark = pytest.mark.multi30k  # small_corpus reads Multi30k where it is


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return small_corpus(tmp_path_factory.mktemp("corpus"))


def recipe(paths: dict, *overrides: str) -> Recipe:
    files = dict(
        train_src=str(paths["train.de"]), train_tgt=str(paths["train.en"]),
        valid_src=str(paths["val.de"]), valid_tgt=str(paths["val.en"]),
    )  # fmt: skip
    return Recipe.from_dict(files).override([*TINY, "max_steps=8", *overrides])


def test_a_second_run_into_a_directory_in_use_is_refused(tmp_path, corpus):
    """The first run holds its directory from its first write until it ends; a second
    one, resumed or new, is refused before it writes anything (two resumed runs wrote
    210 train records for 150 steps, out of order, into one metrics.jsonl)."""
    out = tmp_path / "run"
    first = Trainer(recipe(corpus), out, log=lambda _: None)
    for resume in (True, False):
        with pytest.raises(AiaynError, match="another run is using this run directory"):
            Trainer(recipe(corpus), out, resume=resume, log=lambda _: None)
    first.train(progress=False)
    again = Trainer(recipe(corpus, "max_steps=12"), out, resume=True, log=lambda _: None)
    again.train(progress=False)
    steps = [r["step"] for r in records(out, "train")]
    assert steps == sorted(set(steps)) and steps[-1] == 12  # in order, none twice


def test_an_average_never_replaces_a_runs_own_checkpoint(tmp_path, corpus, capsys):
    """`average --out RUN/checkpoint_last.pt` replaced the resume state with weights
    alone; the next --resume died with KeyError: 'optimizer'. Refused now; and a
    weights-only file put there by hand is named when resuming."""
    out = tmp_path / "run"
    assert main(train_argv(corpus, out, "max_steps=8")) == 0
    last = out / "checkpoint_last.pt"
    before = last.read_bytes()
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_epoch001.pt"):
        if (out / name).exists():
            argv = ["average", "--model", str(out), "--last", "1", "--out", str(out / name)]
            assert "a training run's own checkpoint" in fail(argv, capsys)
    assert last.read_bytes() == before
    # A new file under such a name: later averages took it for one of the run's.
    for name in ("checkpoint_step0000001.pt", "checkpoint_epoch999.pt"):
        argv = ["average", "--model", str(out), "--last", "1", "--out", str(out / name)]
        assert "the name of an epoch or timed checkpoint; choose another" in fail(argv, capsys)
        assert not (out / name).exists()
    assert main(["average", "--model", str(out), "--last", "1"]) == 0  # the default target
    capsys.readouterr()
    shutil.copy(out / "checkpoint_averaged.pt", last)
    assert "optimizer" not in load_checkpoint(last)
    err = fail(train_argv(corpus, out, "max_steps=12", resume=True), capsys)
    assert "checkpoint_last.pt: holds no training state to resume" in err


def test_a_recipe_that_trains_nothing_is_refused(tmp_path, corpus, capsys):
    """model.max_len below every pair's length: it ran 100 epochs of no update, wrote a
    checkpoint each, reported validation loss 0.000 and exited 0."""
    err = fail(train_argv(corpus, tmp_path / "run", "model.max_len=3"), capsys)
    assert "pairs are longer than model.max_len=3 tokens: nothing to train on" in err
    assert not list((tmp_path / "run").glob("checkpoint_*.pt"))


def test_a_model_too_large_for_the_machine_is_refused_before_anything_is_written(
    tmp_path, corpus, capsys, monkeypatch
):
    """n_layers=100000 (a typo's extra zeros) filled all 24 GiB of this machine for three
    minutes until the kernel killed the process, after the run's data was written. The
    machine's memory is fixed at 24 GiB here, so that a larger one refuses too."""
    monkeypatch.setattr(model_checks, "device_memory", lambda device: 24 * 2**30)
    out = tmp_path / "run"
    err = fail(train_argv(corpus, out, "model.n_layers=100000", "device=cpu"), capsys)
    assert "model.n_layers=100000" in err and "100000+100000 layers" in err
    assert "the 24.0 GiB of memory of cpu" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    "cfg",
    [
        TransformerConfig.base(37000),
        TransformerConfig.big(37000),
        TransformerConfig(
            500,
            700,
            d_model=64,
            n_heads=4,
            n_layers=2,
            d_ff=128,
            tie_output=False,
            learned_positions=True,
            norm_first=True,
        ),
    ],
)
def test_the_parameter_estimate_is_the_models_count(cfg):
    n = Transformer(cfg).num_parameters()
    assert parameter_estimate(cfg) == pytest.approx(n, rel=1e-3)
    if cfg.d_model < 100:
        check_fits(cfg, torch.device("cpu"))  # fits any machine: no refusal


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("max_steps=1" + "0" * 400, "field 'max_steps' is out of range"),
        ("lr_scale=1" + "0" * 400, "field 'lr_scale' is out of range"),
        ("model.pad_id=3", "model.pad_id: the tokenizer sets it"),
        ("model.src_vocab_size=abc", "model.src_vocab_size: the tokenizer sets it"),
        ("model.d_model=-3", "recipe field model.d_model: must be a positive int, got -3"),
        ("vocab_size=2", "vocab_size must be more than the 4 special tokens"),
        ("model.n_heads=3", "recipe field model.n_heads: d_model=32 is not divisible"),
    ],
)
def test_recipe_values_that_met_a_traceback_or_were_ignored(
    tmp_path, corpus, capsys, override, message
):
    assert message in fail(train_argv(corpus, tmp_path / "run", override), capsys)


@pytest.mark.parametrize(("text", "name"), [("1: 2\n", "1"), ("true: 3\n", "True"),
                                            ("model:\n  1: 2\n", "1")])  # fmt: skip
def test_recipe_keys_that_are_no_names(tmp_path, text, name):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(AiaynError, match=f"field names are text, got {name}"):
        Recipe.from_yaml(path)


def test_a_huge_number_in_a_file_is_one_line(tmp_path):
    path: Path = tmp_path / "r.yaml"
    path.write_text("warmup: " + "9" * 500 + "\n")
    with pytest.raises(AiaynError, match="field 'warmup' is out of range"):
        Recipe.from_yaml(path)


def test_a_training_text_edited_since_the_run_began_is_named_on_resume(tmp_path, corpus, capsys):
    """A resumed run trains on the data it prepared: a text edited in place since was
    accepted and its edit ignored. The same text moved elsewhere is still the same."""
    paths = {name: tmp_path / Path(path).name for name, path in corpus.items()}
    for name, path in corpus.items():
        shutil.copy(path, paths[name])
    out = tmp_path / "run"
    assert main(train_argv(paths, out, "max_steps=4")) == 0
    moved = dict(paths, **{"train.en": tmp_path / "moved" / paths["train.en"].name})
    moved["train.en"].parent.mkdir()
    shutil.copy(paths["train.en"], moved["train.en"])
    assert main(train_argv(moved, out, "max_steps=6", resume=True)) == 0
    capsys.readouterr()
    with paths["train.en"].open("ab") as f:
        f.write(b"one more line\n")
    err = fail(train_argv(paths, out, "max_steps=8", resume=True), capsys)
    assert "train_tgt=" in err and "was changed since the run being resumed was prepared" in err
    other = dict(paths, **{"train.en": paths["val.en"]})
    err = fail(train_argv(other, out, "max_steps=8", resume=True), capsys)
    assert "is not the file the run being resumed was prepared from (" in err


def test_the_batch_plan_cannot_change_in_the_middle_of_an_epoch(tmp_path, corpus, capsys):
    """A checkpoint in the middle of an epoch holds its position in the batch plan that
    max_tokens and seed make: resumed with others, pairs were skipped or seen twice
    without a word. Refused there; the run's own values resume."""
    out = tmp_path / "run"
    assert main(train_argv(corpus, out, "max_steps=3")) == 0
    last = load_checkpoint(out / "checkpoint_last.pt")
    assert last["batch_in_epoch"] > 0  # mid-epoch
    said = capsys.readouterr().out  # the stop line counted the epoch in progress as none
    where = f"{last['epoch']} full epochs and {last['batch_in_epoch']} batches of the next"
    assert f"stopped (max_steps) after 3 updates, {where}" in said
    for change in ("max_tokens=700", "seed=5"):
        err = fail(train_argv(corpus, out, "max_steps=4", change, resume=True), capsys)
        assert f"recipe field {change}" in err and "middle of an epoch" in err
    assert main(train_argv(corpus, out, "max_steps=4", resume=True)) == 0


def test_the_data_settings_of_a_resumed_run_cannot_change(tmp_path, corpus, capsys):
    """vocab_size, spm_model_type and max_len_words make the run's data and tokenizer,
    which a resumed run keeps: another value was accepted and ignored without a word."""
    out = tmp_path / "run"
    assert main(train_argv(corpus, out, "max_steps=2", "vocab_size=300")) == 0
    changes = {"vocab_size": "400", "spm_model_type": "unigram", "max_len_words": "7"}
    for key, value in changes.items():
        settings = with_settings(["max_steps=3", "vocab_size=300"], f"{key}={value}")
        argv = train_argv(corpus, out, *settings)
        err = fail([*argv, "--resume"], capsys)
        assert f"recipe field {key}=" in err and "prepared with the run's own" in err
    argv = train_argv(corpus, out, "max_steps=3", "vocab_size=300", resume=True)
    assert main(argv) == 0


def test_relative_paths_given_with_set_are_written_absolute(tmp_path, corpus, monkeypatch):
    """recipe.yaml kept `--set train_tgt=FILE` as written, relative to the directory the
    command ran in, while a recipe file's paths are relative to the file: read back from
    the run directory it named another file, and `--config RUN/recipe.yaml --resume`
    failed. The flags (--train-tgt) were always written absolute."""
    work = tmp_path / "work"
    work.mkdir()
    name = Path(corpus["train.en"]).name
    shutil.copy(corpus["train.en"], work / name)
    monkeypatch.chdir(work)
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--no-progress", "--train-src", str(corpus["train.de"])]
    argv += ["--valid-src", str(corpus["val.de"]), "--valid-tgt", str(corpus["val.en"])]
    assert main([*argv, "--set", *TINY, "max_steps=2", f"train_tgt={name}"]) == 0
    assert Recipe.from_yaml(out / "recipe.yaml").train_tgt == str(work / name)
    monkeypatch.chdir(tmp_path)  # elsewhere: the run resumes from its own recipe
    again = ["train", "--config", str(out / "recipe.yaml"), "--out", str(out), "--resume"]
    assert main([*again, "--no-progress", "--set", "max_steps=3"]) == 0


def test_a_tensorboard_folder_that_cannot_be_written_is_one_line(tmp_path, corpus, capsys):
    """TensorBoard's writer failed with two tracebacks (one from its writer thread) where
    metrics.jsonl's failures were one line naming the file."""
    out = tmp_path / "run"
    assert main(train_argv(corpus, out, "max_steps=2")) == 0
    shutil.rmtree(out / "tensorboard")
    (out / "tensorboard").write_text("a file where the folder goes")
    err = fail(train_argv(corpus, out, "max_steps=3", resume=True), capsys)
    assert f"{out / 'tensorboard'}: cannot write (" in err and "Traceback" not in err
    (out / "tensorboard").unlink()
    assert main(train_argv(corpus, out, "max_steps=3", resume=True)) == 0
    assert [r["step"] for r in records(out, "train")] == [1, 2, 3]


class TwoRanks:
    """Rank 0's view of a job of two processes, rank 1 running ``other``."""

    size = 2

    def __init__(self, other: Recipe):
        self.other = other

    def gather(self, items: list) -> list:
        return [items[0], job_fields(self.other)]

    def broadcast(self, obj: object) -> object:
        return obj


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("max_tokens=1000", "recipe field max_tokens: rank 1 has 1000 where rank 0 has 4096"),
        ("model.d_model=64", "recipe field model.d_model: rank 1 has 64 where rank 0 has 512"),
        ("lr_scale=2", "recipe field lr_scale: rank 1 has 2.0 where rank 0 has 1.0"),
        # One rank fine-tuning or reading prepared data, the other not: other collectives,
        # and the job hung without a word (their paths may differ, not whether there are).
        (
            "init_from=/m",
            "recipe field init_from \\(given\\): rank 1 has True where rank 0 has False",
        ),
        ("data=/prepared", "recipe field data \\(given\\): rank 1 has True"),
        # A data set fills the text files a rank lacks, fetched by rank 0 (a collective):
        # a rank naming another, none, or a text file where rank 0 has none, is refused.
        ("dataset=multi30k/de-en", "recipe field dataset: rank 1 has 'multi30k/de-en'"),
        ("train_src=/t.de", "recipe field train_src \\(given\\): rank 1 has True"),
    ],
)
def test_every_process_of_a_job_runs_one_recipe(override, message):
    """A rank started with another max_tokens hung until the collective timeout, another
    d_model died in DDP with a traceback, another lr_scale trained on without a word (a
    torchrun job whose ranks were given different --set; checked there by hand too)."""
    with pytest.raises(AiaynError, match=message):
        check_same_recipe(Recipe(), TwoRanks(Recipe().override([override])))
    here = Recipe().override(["train_src=/here/train.de"])
    where = Recipe().override(["train_src=/elsewhere/train.de", "threads=1"])
    check_same_recipe(here, TwoRanks(where))  # each machine's own paths and threads
    mine = Recipe().override(["init_from=/here/model", "data=/here/data"])
    theirs = Recipe().override(["init_from=/there/model", "data=/there/data"])
    check_same_recipe(mine, TwoRanks(theirs))


def test_a_run_of_a_prepared_directory_ignores_the_data_settings_on_resume(tmp_path, corpus):
    """vocab_size and the like make no data in a run of a prepared directory (`--data`):
    resuming with another value is no contradiction there, and is not refused."""
    from aiayn.data.prepared import prepare

    data = tmp_path / "data"
    valid = (corpus["val.de"], corpus["val.en"])
    prepare((corpus["train.de"], corpus["train.en"]), valid, data, 300, show_progress=False)
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--data", str(data), "--no-progress", "--set"]
    assert main([*argv, *TINY, "max_steps=2"]) == 0
    assert main([*argv, *with_settings(TINY, "max_steps=3", "vocab_size=123"), "--resume"]) == 0
