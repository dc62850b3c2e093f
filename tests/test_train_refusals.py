"""`aiayn train` refusing what it cannot do, before it writes anything: recipe fields out
of type or range, outputs that cannot be made, resumes that would change the model, a
finished run resumed, weights that do not fit, and validation pairs that do not fit the
model's max_len."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from aiayn.errors import RecipeError
from aiayn.train.recipe import Recipe
from cli_util import one_line_error, with_settings

# A model that trains an update in milliseconds, on the built-in sample (no Multi30k).
TINY_RUN = [
    *("model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32"),
    *("model.max_len=64", "max_tokens=400", "warmup=2", "threads=1", "device=cpu"),
]


def _alias_bomb(levels: int) -> str:
    text, last = "adam_betas:\n  - &a [" + ", ".join(['"x"'] * 9) + "]\n", "a"
    for name in "bcdefghi"[: levels - 1]:
        text, last = text + f"  - &{name} [" + ", ".join([f"*{last}"] * 9) + "]\n", name
    return text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("adam_betas: [0.9]\n", "'adam_betas' must be two numbers in [0, 1), got [0.9]"),
        ("adam_betas: [0.9, 1.5]\n", "'adam_betas' must be two numbers in [0, 1)"),
        ("update_freq: 0\n", "field 'update_freq' must be >= 1, got 0"),
        ("keep_last: -1\n", "field 'keep_last' must be >= 0, got -1"),
        ("max_tokens: -5\n", "field 'max_tokens' must be >= 1, got -5"),
        ("label_smoothing: 1.5\n", "field 'label_smoothing' must be in [0, 1), got 1.5"),
        ("max_steps: 2.5\n", "field 'max_steps' must be int (a whole number), got 2.5"),
        ("max_steps: true\n", "field 'max_steps' must be int, got True"),
        ("clip_norm: -1\n", "field 'clip_norm' must be >= 0, got -1.0"),
        ("threads: 100000\n", "field 'threads' must be in 0..1024, got 100000"),  # a crash
        ("dataset: nosuch\n", "field dataset: data set 'nosuch': unknown; known: multi30k"),
        ("dataset: multi30k/de\n", "field dataset: data set 'multi30k/de': not a pair"),
        ("lr_scale: .nan\n", "field 'lr_scale' must be a finite number, got nan"),
        ("adam_eps: .inf\n", "field 'adam_eps' must be a finite number, got inf"),
        # it overflowed timedelta (a traceback) or gloo's timeout (every job failed at once)
        ("collective_timeout_minutes: 1e12\n", "'collective_timeout_minutes' must be in (0, 1e6]"),
        ("schedule: linear\n", "schedule 'linear' decays to 0 at the end of the run"),
        ("data:\n", "field 'data' must be a string, got None"),
        ("seed: 1\nmax_steps: 3\nseed: 2\n", ", line 3: key 'seed' given twice (first on line 1)"),
        ("model:\n  d_model: 8\n  d_model: 16\n", ", line 3: key 'd_model' given twice"),
        ("model:\n  dropout: abc\n", ": field 'model.dropout' must be float, got 'abc'"),
        ("model:\n  d_ff: 1e3\n", ": field 'model.d_ff' must be int, got '1e3'"),
        ("model:\n  norm_first: 1\n", ": field 'model.norm_first' must be true or false"),
        ("device: tpu\n", ": field 'device' must name a device (auto, cpu, cuda, cuda:N or mps)"),
        ("device: cpu:1\n", ": field 'device' must name a device"),
        ("device: 'cuda:'\n", ": field 'device' must name a device"),
        ("", ": holds no recipe"),
        ("# all commented out\n", ": holds no recipe"),
        # 237 bytes of nested aliases (9^6 values): a 3 MB error line; 345 bytes took 105 s
        # and 10 GB. Aliases that stay small are read.
        (_alias_bomb(6), ": holds over 10,000 values (YAML aliases nested?)"),
        ("adam_betas: &b [0.9, 0.95]\nseed: *b\n", "field 'seed' must be int, got [0.9, 0.95]"),
    ],
)
def test_a_recipe_out_of_type_or_range_names_its_file_and_field(tmp_path, text, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as raised:
        Recipe.from_yaml(path)
    assert str(raised.value).startswith(str(path)) and message in str(raised.value)


def test_recipe_values_at_their_edges_and_overrides(tmp_path):
    """0 keeps its documented meaning (no clipping, no limit, none kept); a whole float is
    an int; an override names itself; a binary file is not taken for a recipe."""
    path = tmp_path / "ok.yaml"
    path.write_text("clip_norm: 0\nmax_steps: 3.0\nkeep_last: 0\nadam_eps: 1e-8\n")
    recipe = Recipe.from_yaml(path, ["adam_betas=[0, 0.5]", "seed=-3"])
    assert (recipe.clip_norm, recipe.max_steps, recipe.keep_last) == (0.0, 3, 0)
    assert recipe.adam_eps == 1e-8 and recipe.adam_betas == (0.0, 0.5) and recipe.seed == -3
    assert isinstance(recipe.max_steps, int)
    with pytest.raises(RecipeError, match=r"^override 'update_freq=0': field 'update_freq'"):
        Recipe().override(["update_freq=0"])
    with pytest.raises(RecipeError, match="'adam_betas' must be two numbers"):
        Recipe().override(["adam_betas=abc"])
    # model={...} goes onto the recipe's model, as model.KEY=VALUE does: it replaced the
    # file's model with the base model (d_model 512, 6 layers) plus the fields given.
    path.write_text("model: {d_model: 32, n_heads: 2, n_layers: 1}\n")
    recipe = Recipe.from_yaml(path, ["model={dropout: 0.3, d_ff: 64}", "model.n_heads=4"])
    wanted = {"d_model": 32, "n_heads": 4, "n_layers": 1, "dropout": 0.3, "d_ff": 64}
    assert {k: recipe.model[k] for k in wanted} == wanted
    assert recipe.given_model_fields >= {"d_model", "n_heads", "n_layers", "dropout", "d_ff"}
    with pytest.raises(RecipeError, match="'model' must be a mapping"):
        Recipe().override(["model=3"])
    # An unknown model field names the recipe file (it was "recipe field TransformerConfig:
    # unknown field(s) foo", from the model's check, which knows no file).
    path.write_text("model: {foo: 1, d_model: 32}\n")
    with pytest.raises(RecipeError, match=f"^{path}: model: unknown field\\(s\\): foo$"):
        Recipe.from_yaml(path)
    with pytest.raises(RecipeError, match=r"^override 'model={bar: 1}': model: unknown field"):
        Recipe().override(["model={bar: 1}"])
    with pytest.raises(RecipeError, match=f"^{tmp_path}: a folder, not a recipe file$"):
        Recipe.from_yaml(tmp_path)  # was "no such recipe file"
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"PK\x03\x04\xff\xfe\x00binary")
    with pytest.raises(RecipeError, match=r"model\.pt: not UTF-8 text"):
        Recipe.from_yaml(binary)
    recipe.keep_last = -1  # set in code: the trainer checks the recipe again
    with pytest.raises(RecipeError, match=r"^recipe: field 'keep_last' must be >= 0"):
        recipe.check()


def test_a_refused_train_writes_nothing_and_keeps_what_was_there(tmp_path, sample_prepared, capsys):
    """Refused before any update: an existing folder keeps its files (no recipe.yaml or
    spm.model overwritten), a new one is not left behind, an --out that is a file or
    cannot be made is named, and --data with --train-src is refused."""
    keep = tmp_path / "run_keep"
    keep.mkdir()
    (keep / "recipe.yaml").write_text("mine\n")
    run = ["train", "--data", str(sample_prepared), "--no-progress", "--set"]
    bad_settings = ("update_freq=0", "model.n_heads=3", "model.no_such_field=1")
    for bad in (*bad_settings, "model.max_len=2.5", "model.dropout=abc"):
        one_line_error([*run, *with_settings(TINY_RUN, bad), "--out", str(keep)], capsys)
        assert [p.name for p in keep.iterdir()] == ["recipe.yaml"], bad
        assert (keep / "recipe.yaml").read_text() == "mine\n"
    argv = [*run, *TINY_RUN]
    new = tmp_path / "new" / "run"
    err = one_line_error([*argv, "--out", str(new), "--init-from", str(tmp_path / "no")], capsys)
    assert "no such model directory" in err and not (tmp_path / "new").exists()
    plain = tmp_path / "existing.txt"
    plain.write_text("a file\n")
    assert f"{plain}: not a directory" in one_line_error([*argv, "--out", str(plain)], capsys)
    err = one_line_error([*argv, "--out", str(plain / "run")], capsys)
    assert f"{plain / 'run'}: cannot create the run directory" in err
    err = one_line_error([*argv, "--out", str(new), "--train-src", str(plain)], capsys)
    assert "--data and --train-src name two data sets" in err and not new.parent.exists()


def _tiny_train(prepared: Path, out: Path, *settings: str) -> list[str]:
    """The argv of a TINY_RUN training on ``prepared`` into ``out``, with ``settings`` in
    place of TINY_RUN's of the same key; ``max_steps=N`` and more settings of other keys
    may follow (they extend its --set)."""
    argv = ["train", "--data", str(prepared), "--out", str(out), "--no-progress"]
    return [*argv, "--set", *with_settings(TINY_RUN, *settings)]


def test_resume_keeps_the_model_and_a_finished_run_stays_finished(
    tmp_path, sample_prepared, capsys
):
    out = tmp_path / "run"
    argv = _tiny_train(sample_prepared, out)
    assert main([*argv, "max_steps=2"]) == 0
    last = out / "checkpoint_last.pt"
    saved = last.read_bytes()
    capsys.readouterr()
    assert main([*argv, "max_steps=2", "--resume"]) == 0  # nothing more, not step 3
    assert "nothing to do: the run already reached its max_steps" in capsys.readouterr().out
    assert last.read_bytes() == saved
    bigger = _tiny_train(sample_prepared, out, "model.d_model=32")
    err = one_line_error([*bigger, "max_steps=3", "--resume"], capsys)
    assert "model.d_model=32 differs from the run being resumed" in err and "d_model=16" in err
    err = one_line_error([*argv, "max_steps=3", "adam_betas=[0.8,0.98]", "--resume"], capsys)
    assert "adam_betas=[0.8, 0.98] differs from the run being resumed" in err
    assert last.read_bytes() == saved
    same = _tiny_train(sample_prepared, out, "model.n_heads=2")  # the model's own: fine
    assert main([*same, "max_steps=3", "--resume"]) == 0
    assert load_checkpoint(last)["step"] == 3


def test_a_resume_into_a_folder_it_cannot_write_stops_before_training(
    tmp_path, sample_prepared, capsys, monkeypatch
):
    """A resumed run met its read-only folder only at its first save, an epoch (hours) of
    updates later. Root writes anywhere: the refusal is simulated."""
    import tempfile

    out = tmp_path / "run"
    argv = _tiny_train(sample_prepared, out)
    assert main([*argv, "max_steps=2"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    mkstemp = tempfile.mkstemp

    def read_only(*args, **kwargs):
        if str(args[2] if len(args) > 2 else kwargs.get("dir")) == str(out):
            raise PermissionError(13, "Permission denied")
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    err = one_line_error([*argv, "max_steps=4", "--resume"], capsys)
    assert f"{out}: cannot write in it (Permission denied)" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_run_with_checkpoints_but_no_last_is_never_overwritten(tmp_path, sample_prepared, capsys):
    """A run whose checkpoint_last.pt was deleted (or an older aiayn's, stopped before
    its first) keeps its other checkpoints: a new run into that folder, or --resume auto,
    is refused, and nothing there changes."""
    out = tmp_path / "run"
    argv = _tiny_train(sample_prepared, out)
    assert main([*argv, "max_steps=2"]) == 0
    (out / "checkpoint_last.pt").unlink()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert "checkpoint_best.pt" in before
    for extra in ([], ["--resume", "auto"]):
        err = one_line_error([*argv, "max_steps=2", *extra], capsys)
        assert "holds checkpoints of an earlier run (checkpoint_best.pt" in err, extra
        assert "no checkpoint_last.pt to resume from" in err
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    err = one_line_error([*argv, "max_steps=2", "--resume"], capsys)
    assert "nothing to resume" in err
    # A run that saved no checkpoint (killed before its first) is replaced, and its log
    # with it (not appended to).
    failed = tmp_path / "failed"
    assert main([*_tiny_train(sample_prepared, failed), "max_steps=2"]) == 0
    for checkpoint in failed.glob("checkpoint*.pt"):
        checkpoint.unlink()
    (failed / "metrics.jsonl").write_text('{"kind": "train", "step": 7, "loss": 9.0}\n')
    assert main([*_tiny_train(sample_prepared, failed), "max_steps=2"]) == 0
    steps = [json.loads(line)["step"] for line in (failed / "metrics.jsonl").open()]
    assert steps and 7 not in steps


def test_a_run_stopped_before_its_first_periodic_save_can_be_resumed(
    tmp_path, sample_prepared, capsys, monkeypatch
):
    """A job killed after its first validation saved checkpoint_best.pt, before any
    save_every_steps, was refused on every torchrun restart (--resume auto: "no
    checkpoint_last.pt to resume from"), and lost. checkpoint_last.pt now comes first."""
    from aiayn.train.metrics_log import MetricsLog

    write = MetricsLog.write

    def killed_once(self, kind, step, **values):
        if kind == "valid" and not killed:
            killed.append(step)
            raise KeyboardInterrupt  # after the best was saved, before the line is logged
        return write(self, kind, step, **values)

    killed: list[int] = []
    monkeypatch.setattr(MetricsLog, "write", killed_once)
    out = tmp_path / "run"
    argv = [*_tiny_train(sample_prepared, out), "max_steps=3", "valid_every_steps=2"]
    assert main(argv) == 130 and killed == [2]
    assert {"checkpoint_best.pt", "checkpoint_last.pt"} <= {p.name for p in out.iterdir()}
    assert main([*argv, "--resume", "auto"]) == 0
    assert load_checkpoint(out / "checkpoint_last.pt")["step"] == 3
    valid = [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()]
    assert valid.count(2) == 2 and 3 in valid  # step 2's train and valid lines, once each


def test_a_broken_or_folder_checkpoint_last_is_named_as_what_it_is(
    tmp_path, sample_prepared, capsys
):
    """A checkpoint_last.pt that is a broken link was "nothing to resume: ... does not
    exist" (or, with --resume auto, "no checkpoint_last.pt to resume from"); a folder of
    that name was "already holds a training run; resume it"."""
    broken, folder = tmp_path / "broken", tmp_path / "folder"
    broken.mkdir()
    (broken / "checkpoint_last.pt").symlink_to(tmp_path / "gone.pt")
    (folder / "checkpoint_last.pt").mkdir(parents=True)
    for extra in ([], ["--resume"], ["--resume", "auto"]):
        err = one_line_error([*_tiny_train(sample_prepared, broken), "max_steps=1", *extra], capsys)
        assert f"checkpoint_last.pt: a broken link to {tmp_path / 'gone.pt'}" in err, extra
        err = one_line_error([*_tiny_train(sample_prepared, folder), "max_steps=1", *extra], capsys)
        assert "checkpoint_last.pt: a folder, not a checkpoint" in err, extra
    assert (broken / "checkpoint_last.pt").is_symlink() and (folder / "checkpoint_last.pt").is_dir()


def test_validation_shows_its_progress(tmp_path, sample_prepared, capsys):
    """Validation (its loss, then translating every validation sentence: minutes on a
    large set) showed nothing between the epoch's last update and its result."""
    argv = _tiny_train(sample_prepared, tmp_path / "run")
    assert main([a for a in argv if a != "--no-progress"] + ["max_steps=1"]) == 0
    err = capsys.readouterr().err
    assert "valid loss: 1/1 batch (100%)" in err and "valid translate: 10/10 sent (100%)" in err
    assert main([*_tiny_train(sample_prepared, tmp_path / "quiet"), "max_steps=1"]) == 0
    assert "valid translate" not in capsys.readouterr().err


def test_a_folder_that_is_not_a_run_is_refused_and_kept(tmp_path, sample_prepared, capsys):
    """Any folder without checkpoints was taken for a failed run to replace: an --out that
    is prepared data (a slip for --data) had its spm.model written over and checkpoints
    added among its files; a project's own metrics.jsonl was replaced and its tensorboard/
    deleted. Now a folder is taken only when empty or holding what a run leaves (its
    recipe.yaml among it); else one line names it and what it holds, and nothing in it
    changes. An empty folder is still taken."""

    def files(folder: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
        }

    prepared = tmp_path / "prepared"
    shutil.copytree(sample_prepared, prepared)
    project = tmp_path / "project"
    (project / "tensorboard" / "other").mkdir(parents=True)
    (project / "tensorboard" / "other" / "events.out").write_text("mine")
    (project / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    logs_only = tmp_path / "logs_only"  # a run's log, but no recipe.yaml beside it
    logs_only.mkdir()
    (logs_only / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    own_recipe = tmp_path / "own_recipe"  # the user's recipe, which a run writes over
    own_recipe.mkdir()
    (own_recipe / "recipe.yaml").write_text("max_steps: 2\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    (notes / "metrics.jsonl").write_text("mine\n")
    cases = [
        (prepared, f"{prepared}: holds prepared data (manifest.json), not a training run"),
        (project, f"{project}: holds files that are not a training run's (tensorboard/other)"),
        (logs_only, f"{logs_only}: holds metrics.jsonl but no recipe.yaml"),
        (own_recipe, f"{own_recipe / 'recipe.yaml'}: not the recipe.yaml of a training run"),
        (notes, f"{notes}: holds files that are not a training run's (metrics.jsonl)"),
    ]
    for folder, message in cases:
        before = files(folder)
        for resume in ([], ["--resume", "auto"]):
            err = one_line_error(
                [*_tiny_train(sample_prepared, folder), "max_steps=1", *resume], capsys
            )
            assert message in err, err
            assert files(folder) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*_tiny_train(sample_prepared, empty), "max_steps=1"]) == 0
    assert (empty / "checkpoint_last.pt").is_file()
    # Files under names a run never writes or deletes stay, and do not stop it (a log the
    # user tees into the folder, a scheduler's output, a README were refused).
    tee = tmp_path / "tee"
    tee.mkdir()
    for name in ("train.log", ".DS_Store", "README.md"):
        (tee / name).write_text("mine")
    assert main([*_tiny_train(sample_prepared, tee), "max_steps=1"]) == 0
    assert all((tee / name).read_text() == "mine" for name in ("train.log", "README.md"))


def test_a_recipe_is_written_whole_or_not_at_all(tmp_path):
    """A full disk while writing recipe.yaml left half a file, which the next run into the
    folder refused as not a run's recipe: the folder could not be used again. The disk
    fills after 40 bytes here (a file size limit: any way of writing meets it)."""
    script = (
        "import resource, signal, sys\n"
        "from aiayn.train.recipe import Recipe\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (40, resource.RLIM_INFINITY))\n"
        "Recipe().save(sys.argv[1])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "recipe.yaml")],
        capture_output=True,
        text=True,
    )
    assert run.returncode and "File too large" in run.stderr, run.stderr
    assert list(tmp_path.iterdir()) == []  # neither half a recipe nor its temp file
    Recipe().save(tmp_path / "recipe.yaml")
    assert Recipe.from_yaml(tmp_path / "recipe.yaml").to_dict() == Recipe().to_dict()


def test_prepared_data_a_run_did_not_make_is_not_replaced(tmp_path, sample_prepared, capsys):
    """A new run from raw text prepares it into RUN/data/, replacing the data/ of a run
    that stopped before its first checkpoint; a data/ prepared from other text, with no
    run's recipe.yaml beside it (``prepare --out RUN/data`` by hand), is refused and kept.
    From the same files it is what a run that stopped early left, and is prepared again."""
    text = sample_prepared.parent / "text"
    files = [str(text / f"{split}.{lang}") for split in ("train", "val") for lang in ("de", "en")]
    flags = ("--train-src", "--train-tgt", "--valid-src", "--valid-tgt")
    argv = ["train", *(x for pair in zip(flags, files) for x in pair), "--no-progress"]
    argv += ["--set", *TINY_RUN, "vocab_size=120", "max_steps=1"]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(sample_prepared, run / "data")
    manifest = run / "data" / "manifest.json"
    other = json.loads(manifest.read_text())
    other["inputs"]["train_src"]["path"] = str(tmp_path / "other.de")
    manifest.write_text(json.dumps(other))
    err = one_line_error([*argv, "--out", str(run)], capsys)
    assert f"{run / 'data'}: prepared data of other text ({tmp_path / 'other.de'})" in err
    assert json.loads(manifest.read_text()) == other and [p.name for p in run.iterdir()] == ["data"]
    shutil.rmtree(run / "data")
    shutil.copytree(sample_prepared, run / "data")  # prepared from the same files
    assert main([*argv, "--out", str(run)]) == 0
    assert (run / "checkpoint_last.pt").is_file()


def test_init_from_or_resume_with_weights_that_do_not_fit_names_the_file(
    sample_prepared, tmp_path, capsys
):
    from aiayn.checkpoint import save_checkpoint

    out = tmp_path / "run"
    argv = _tiny_train(sample_prepared, out)
    assert main([*argv, "max_steps=1"]) == 0
    last = out / "checkpoint_last.pt"
    state = load_checkpoint(last)
    del state["model"]["src_embed.weight"]
    save_checkpoint(state, last)
    err = one_line_error([*argv, "max_steps=2", "--resume"], capsys)
    assert f"{last}: weights do not fit the model config" in err and "src_embed.weight" in err
    new = ["train", "--data", str(sample_prepared), "--out", str(tmp_path / "tuned")]
    err = one_line_error([*new, "--no-progress", "--init-from", str(last)], capsys)
    assert f"{last}: weights do not fit the model config" in err and "src_embed.weight" in err


def test_data_named_on_the_command_line_replaces_the_recipes(tmp_path, sample_prepared, capsys):
    """--train-src... over a recipe's ``data:`` train on that text (the recipe's prepared
    directory used to win and the text went unread); --data over a recipe's ``dataset:``
    and text trains on --data. Two names for the data in one recipe (its file and --set),
    or a flag and --set for one field, are refused in one line naming both."""
    text = sample_prepared.parent / "text"
    files = [str(text / f"{split}.{lang}") for split in ("train", "val") for lang in ("de", "en")]
    flags = [f"--{flag}" for flag in ("train-src", "train-tgt", "valid-src", "valid-tgt")]
    texts = [part for pair in zip(flags, files) for part in pair]
    recipe = tmp_path / "prepared.yaml"
    recipe.write_text(f"data: {sample_prepared}\nvocab_size: 120\n")
    run = ["train", "--config", str(recipe), "--no-progress"]
    tiny = ["--set", *TINY_RUN, "max_steps=1"]
    assert main([*run, "--out", str(tmp_path / "a"), *texts, *tiny]) == 0
    saved = Recipe.from_yaml(tmp_path / "a" / "recipe.yaml")
    assert saved.data == "" and saved.train_src == files[0]
    assert (tmp_path / "a" / "data" / "manifest.json").is_file()  # the text, prepared
    named = tmp_path / "named.yaml"
    named.write_text(f"dataset: multi30k\ntrain_src: {files[0]}\n")
    argv = ["train", "--config", str(named), "--data", str(sample_prepared), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "b"), *tiny]) == 0  # nothing fetched
    saved = Recipe.from_yaml(tmp_path / "b" / "recipe.yaml")
    assert (saved.data, saved.dataset, saved.train_src) == (str(sample_prepared), "", "")
    capsys.readouterr()
    for argv, message in [
        ([*run, *tiny, f"train_src={files[0]}"],
         "fields data and train_src both name the training data"),
        ([*run, *texts, *tiny, f"data={sample_prepared}"],  # named: it blamed the file
         f"override 'data={sample_prepared}': fields data and train_src, train_tgt, "
         "valid_src, valid_tgt both name the training"),
        ([*run, *tiny, "dataset=nosuch"], "override 'dataset=nosuch': field dataset: data set"),
        ([*run, *texts, *tiny, f"train_src={files[0]}"],
         "--train-src and --set train_src=... both set train_src: give one"),
    ]:  # fmt: skip
        assert message in one_line_error([*argv, "--out", str(tmp_path / "c")], capsys)
    assert not (tmp_path / "c").exists()
    with pytest.raises(RecipeError, match=r"^recipe: fields data and dataset both name"):
        Recipe(data=str(sample_prepared), dataset="multi30k").check()


def test_validation_pairs_longer_than_max_len_are_counted_or_refused(
    tmp_path, sample_prepared, capsys
):
    """The validation loss scores the pairs that fit model.max_len, BLEU translates them
    all. It used to leave the others out without a word, and to report loss 0, perplexity
    1 (and a "best" model) when none fit. Now it says how many it leaves out, and a run of
    which no validation pair fits is refused before it trains, naming the files."""
    out = tmp_path / "run"

    def argv(max_len: int) -> list[str]:
        return [*_tiny_train(sample_prepared, out, f"model.max_len={max_len}"), "max_steps=1"]

    err = one_line_error(argv(13), capsys)  # 5 training pairs fit
    assert "valid: all 10 pairs of " in err and "model.max_len=13 tokens" in err
    assert f"{Path(sample_prepared).parent / 'text' / 'val.de'} and " in err
    assert not out.exists()  # refused before the run writes anything (it left a recipe)
    assert main(argv(17)) == 0
    said = capsys.readouterr().out
    assert said.count("valid: 4 of 10 pairs longer than 17 tokens, left out of the validation") == 1
    valid = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["loss"] > 0 for r in valid if r["kind"] == "valid"] == [True]


def test_a_validation_loss_of_no_pair_is_nan_not_0(sample_prepared):
    """validate() of a model that none of the pairs fits scores none: NaN loss and
    perplexity (it said 0 and 1, a perfect model)."""
    import math

    from aiayn import Transformer, TransformerConfig
    from aiayn.data.shards import PreparedData
    from aiayn.train.validation import validate

    cfg = TransformerConfig(
        src_vocab_size=120, tgt_vocab_size=120, d_model=16, n_heads=2, n_layers=1, d_ff=32,
        max_len=13,
    )  # fmt: skip
    same = ["a dog runs across the green field"]  # BLEU 100: it is still given
    v = validate(Transformer(cfg), PreparedData(sample_prepared).valid, same, same, 400, 0.1)
    assert math.isnan(v["loss"]) and math.isnan(v["ppl"])
    assert v["bleu"] == pytest.approx(100.0)


def test_model_numbers_in_scientific_notation_are_read_as_the_other_fields_are(
    tmp_path, sample_prepared
):
    """PyYAML reads 1e-6 (no dot) as text: top-level fields took it as a number (adam_eps:
    1e-9), model fields were refused where the model was made ("recipe field
    model.layer_norm_eps: must be a finite number, got '1e-6'", naming no file)."""
    from aiayn.train.model_checks import check_new_model

    path = tmp_path / "sci.yaml"
    path.write_text("adam_eps: 1e-9\nmodel:\n  layer_norm_eps: 1e-6\n  n_encoder_layers: null\n")
    recipe = Recipe.from_yaml(path, ["model.dropout=1e-1", "model={attention_dropout: 5e-2}"])
    assert (recipe.adam_eps, recipe.model["layer_norm_eps"]) == (1e-9, 1e-6)
    assert (recipe.model["dropout"], recipe.model["attention_dropout"]) == (0.1, 0.05)
    assert recipe.given_model_fields == {
        "layer_norm_eps", "n_encoder_layers", "dropout", "attention_dropout"
    }  # fmt: skip
    check_new_model(recipe)  # the model takes them
    with pytest.raises(RecipeError, match=r"^override 'model.dropout=x': field 'model.dropout'"):
        Recipe().override(["model.dropout=x"])
    out = tmp_path / "run"
    settings = [*TINY_RUN, "max_steps=1", "model.layer_norm_eps=1e-6", "model.dropout=1e-1"]
    argv = ["train", "--data", str(sample_prepared), "--out", str(out), "--no-progress"]
    assert main([*argv, "--set", *settings]) == 0
    saved = Recipe.from_yaml(out / "recipe.yaml").model
    assert (saved["layer_norm_eps"], saved["dropout"]) == (1e-6, 0.1)


def test_a_device_name_is_checked_by_its_form_not_by_this_machine(tmp_path, monkeypatch):
    """``device: tpu`` was read without a word, and refused only when the run began, naming
    no file or field. Its form is checked when the recipe is read, without asking torch
    for a GPU: a recipe written for cuda:1 reads on a machine without one."""

    def no_query(*args):
        raise AssertionError("the recipe asked torch about this machine's devices")

    monkeypatch.setattr("torch.cuda.is_available", no_query)
    monkeypatch.setattr("torch.cuda.device_count", no_query)
    path = tmp_path / "device.yaml"
    for name in ("auto", "cpu", "cpu:0", "cuda", "cuda:1", "mps"):
        path.write_text(f"device: {name}\n")
        assert Recipe.from_yaml(path).device == name
    with pytest.raises(RecipeError, match=r"^override 'device=tpu': field 'device' must name"):
        Recipe.from_yaml(path, ["device=tpu"])
    recipe = Recipe()
    recipe.device = "gpu0"  # set in code: checked with the rest
    with pytest.raises(RecipeError, match=r"^recipe: field 'device' must name a device"):
        recipe.check()


def test_every_set_is_applied_and_a_key_given_twice_is_refused(tmp_path, sample_prepared, capsys):
    """A second --set replaced the first: `--set max_steps=3 --set log_every=1` trained the
    whole budget. Every --set is applied now, and a key given twice, in one --set or across
    them (``model={...}`` naming a model field too), is refused as a recipe file's is."""
    out = tmp_path / "run"
    argv = ["train", "--data", str(sample_prepared), "--out", str(out), "--no-progress"]
    assert main([*argv, "--set", "max_steps=1", "--set", *TINY_RUN, "max_epochs=1"]) == 0
    saved = Recipe.from_yaml(out / "recipe.yaml")
    assert (saved.max_steps, saved.max_epochs, saved.model["d_model"]) == (1, 1, 16)
    again = tmp_path / "again"
    argv = ["train", "--data", str(sample_prepared), "--out", str(again), "--no-progress"]
    for more, key in [
        (["max_steps=1", "max_steps=2"], "max_steps"),
        (["max_steps=1", "--set", "max_steps=2"], "max_steps"),
        (["max_steps=1", "model={dropout: 0.2}", "--set", "model.dropout=0.3"], "model.dropout"),
    ]:
        err = one_line_error([*argv, "--set", *TINY_RUN, *more], capsys)
        assert f"--set: key {key!r} given twice" in err, more
        assert not again.exists()


def test_model_fields_out_of_range_name_the_recipe_file_that_set_them(
    tmp_path, sample_prepared, capsys
):
    """A model field out of range in a recipe file was "recipe field model.d_model: must be a
    positive int, got -1", naming no file, where every other recipe error names it. Now the
    file (or the override) that set the field is named: for n_heads not dividing d_model,
    the one that set either; a field set in code keeps the plain message."""
    from aiayn.config import TransformerConfig
    from aiayn.train.model_checks import check_new_model

    path = tmp_path / "model.yaml"
    out = tmp_path / "run"
    argv = ["train", "--config", str(path), "--data", str(sample_prepared), "--out", str(out)]
    divides = "recipe field model.n_heads: d_model=30 is not divisible by n_heads"
    for text, more, message in [
        ("d_model: -1", [], f"{path}: recipe field model.d_model: must be a positive int, got -1"),
        ("d_model: 30", [], f"{path}: {divides}=8"),  # n_heads is the default; d_model the file's
        ("n_heads: 7", [], f"{path}: recipe field model.n_heads: d_model=512 is not divisible"),
        ("dropout: 1.5", [], f"{path}: recipe field model.dropout: must be in [0, 1), got 1.5"),
        ("d_model: 30", ["model.n_heads=7"], f"override 'model.n_heads=7': {divides}=7"),
    ]:
        path.write_text(f"model:\n  {text}\n")
        err = one_line_error([*argv, "--no-progress", "--set", *more, "max_steps=1"], capsys)
        assert message in err and not out.exists(), (text, err)
    # A model to fine-tune: the fields the recipe may change, out of range, name it too.
    path.write_text("model:\n  dropout: 1.5\n")
    start = TransformerConfig(src_vocab_size=120, tgt_vocab_size=120, d_model=16, n_heads=2)
    init = {"config": start.to_dict(), "path": "start.pt"}
    wanted = f"{path}: recipe field model.dropout: must be in [0, 1), got 1.5"
    with pytest.raises(RecipeError) as raised:
        check_new_model(Recipe.from_yaml(path), init)
    assert str(raised.value) == wanted
    with pytest.raises(RecipeError) as raised:  # set in code: no file to name
        check_new_model(Recipe(model={"d_model": -1}))
    assert str(raised.value) == "recipe field model.d_model: must be a positive int, got -1"


def test_data_settings_that_prepared_data_leaves_unused_are_noted(
    tmp_path, sample_prepared, capsys
):
    """With prepared data (``data``, `--data`) the run trains on the data as prepared:
    vocab_size, spm_model_type and max_len_words make nothing there. A recipe that set one
    to other than the data's was followed without a word. Now each is a note naming where
    it was set, the field, its value and the data's. A note, not a refusal: one recipe
    serves raw text and prepared data (recipes/multi30k.yaml's max_len_words is 80, where
    prepare's default is 100), and a resumed run of prepared data takes another value
    (test_train_concurrency_and_refusals); values left at their defaults say nothing."""
    from aiayn.train.model_checks import prepared_notes

    data = sample_prepared.resolve()  # prepared with vocab_size 120, bpe, max_len_words 100
    made = f"the prepared data in {data} was made with"
    again = "prepare the text again to change it"
    path = tmp_path / "r.yaml"
    path.write_text("vocab_size: 8000\nspm_model_type: unigram\nmax_len_words: 100\n")
    argv = ["train", "--config", str(path), "--data", str(data), "--out", str(tmp_path / "run")]
    assert main([*argv, "--no-progress", "--set", *TINY_RUN, "max_steps=1", "max_len_words=0"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: {path}: recipe field vocab_size=8000 is unused: {made} 120; {again}",
        f"note: {path}: recipe field spm_model_type='unigram' is unused: {made} 'bpe'; {again}",
        f"note: override 'max_len_words=0': recipe field max_len_words=0 is unused: {made} 100; "
        + again,
    ]
    path.write_text("vocab_size: 120\nspm_model_type: bpe\nmax_len_words: 100\n")  # the data's
    assert prepared_notes(Recipe.from_yaml(path, [f"data={data}"])) == []
    assert prepared_notes(Recipe(data=str(data))) == []  # defaults (vocab_size 8000): not set
    assert prepared_notes(Recipe(data=str(data), max_len_words=80)) == [  # set in code
        f"recipe field max_len_words=80 is unused: {made} 100; {again}"
    ]
    path.write_text("vocab_size: 8000\n")
    assert prepared_notes(Recipe.from_yaml(path)) == []  # raw text: the field is used
