"""One error family: what the library raises, what the CLI shows, and inputs that used to
get the wrong answer (alpha nan, invalid UTF-8 on stdin, cuda without CUDA, recipe fields
out of range, a train refused after it had written, a finished run resumed)."""

from __future__ import annotations

import ast
import errno
import gzip
import os
import re
import stat
import sys
from pathlib import Path

import pytest
import torch

from aiayn import errors
from aiayn.checkpoint import load_checkpoint, load_model, resolve_checkpoint, resolve_device
from aiayn.cli import main
from aiayn.errors import AiaynError, RecipeError
from aiayn.train.recipe import Recipe

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "aiayn"
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def test_every_error_class_derives_from_aiayn_error():
    classes = [c for c in vars(errors).values() if isinstance(c, type)]
    assert len(classes) >= 6 and AiaynError in classes
    for cls in classes:
        assert issubclass(cls, AiaynError) and issubclass(cls, ValueError), cls


def _raised_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal inside a ``raise`` statement."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((node.lineno, part.value))
    return found


def test_library_messages_name_no_command_line_flags():
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "cli"  # the CLI may name its own flags
        for line, text in _raised_strings(path)
        if FLAG.search(text)
    ]
    assert offenders == []
    assert FLAG.search("give --force") and not FLAG.search("x-->y, a --")  # the check bites


def test_alpha_nan_is_refused_with_a_clear_line(sample_model_dir, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    model = str(sample_model_dir(False))
    for alpha in ("nan", "-1"):
        assert main(["translate", "--model", model, "--quiet", "--alpha", alpha, str(src)]) == 2
        err = capsys.readouterr().err
        assert "alpha must be a finite number >= 0" in err and "Traceback" not in err


def test_cuda_on_a_machine_without_cuda_says_so(sample_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = resolve_checkpoint(sample_model_dir(False))
    with pytest.raises(AiaynError, match="device cuda: this machine has no CUDA GPU"):
        load_model(path, device="cuda")
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    model = str(sample_model_dir(False))
    assert main(["translate", "--model", model, "--quiet", "--device", "cuda", str(src)]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "corrupt" not in err
    with pytest.raises(AiaynError, match="not a device name"):
        resolve_device("gpu0")
    assert resolve_device("auto") == torch.device("cpu")


def test_a_bug_keeps_its_traceback(sample_model_dir, tmp_path, monkeypatch):
    """Only AiaynError becomes a one-line message; anything else propagates."""
    from aiayn import translator

    def broken(*args, **kwargs):
        raise RuntimeError("a bug, not a user error")

    monkeypatch.setattr(translator.Translator, "translations", broken)
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["translate", "--model", str(sample_model_dir(False)), "--quiet", str(src)])


def test_output_that_cannot_be_written_is_a_clear_error(sample_model_dir, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    out = tmp_path / "no" / "such" / "dir" / "out.en"
    model = str(sample_model_dir(False))
    assert main(["translate", "--model", model, "--quiet", str(src), "-o", str(out)]) == 2
    assert "out.en: cannot write" in capsys.readouterr().err


def _one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_evaluate_refuses_files_of_unequal_line_counts(sample_model_dir, tmp_path, capsys):
    src, ref = tmp_path / "in.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nZwei Katzen.\nEin Mann.\n", encoding="utf-8")
    ref.write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet"]
    err = _one_line_error([*argv, "--src", str(src), "--ref", str(ref)], capsys)
    assert f"{src} has 3 lines but {ref} has 2" in err


def test_average_refuses_last_0_and_no_checkpoints(sample_model_dir, tmp_path, capsys):
    model = sample_model_dir()  # a best checkpoint only: no epoch or step checkpoints
    for last in ("0", "-2"):
        err = _one_line_error(["average", "--model", str(model), "--last", last], capsys)
        assert f"--last must be >= 1, got {last}" in err
    err = _one_line_error(["average", "--model", str(model), "--last", "5"], capsys)
    assert f"{model}: no checkpoint_epoch*.pt or checkpoint_step*.pt to average" in err
    assert not (model / "checkpoint_averaged.pt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no checkpoint_epoch" in _one_line_error(["average", "--model", str(empty)], capsys)


def _files(tmp_path, **texts: str) -> dict[str, Path]:
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / name.replace("_", ".")
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_evaluate_with_no_lines_is_refused_and_keeps_the_output(sample_model_dir, tmp_path, capsys):
    f = _files(tmp_path, empty_de="", empty_en="", out_en="keep me\n")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "-o", str(f["out_en"])]
    err = _one_line_error([*argv, "--src", str(f["empty_de"]), "--ref", str(f["empty_en"])], capsys)
    assert "empty.de and" in err and "no lines to score" in err
    assert f["out_en"].read_text(encoding="utf-8") == "keep me\n"


def test_an_output_that_is_an_input_is_refused_before_any_work(sample_model_dir, tmp_path, capsys):
    f = _files(tmp_path, in_de="Ein Hund.\n", ref_en="A dog.\n", prefixes="A\n")
    (tmp_path / "link.en").symlink_to(f["ref_en"])  # the same file by another name
    model = ["--model", str(sample_model_dir()), "--quiet"]
    evaluate = ["evaluate", *model, "--src", str(f["in_de"]), "--ref", str(f["ref_en"])]
    translate = ["translate", *model, str(f["in_de"])]
    for argv, out, named in [
        ([*evaluate, "-o", str(f["in_de"])], f["in_de"], "--src"),
        ([*evaluate, "-o", str(tmp_path / "link.en")], f["ref_en"], "--ref"),
        ([*translate, "-o", str(f["in_de"])], f["in_de"], "the input"),
        ([*translate, "--prefix-file", str(f["prefixes"]), "-o", str(f["prefixes"])],
         f["prefixes"], "--prefix-file"),
    ]:  # fmt: skip
        before = out.read_text(encoding="utf-8")
        err = _one_line_error(argv, capsys)
        assert f"is the same file as {named}" in err and "give another output file" in err
        assert out.read_text(encoding="utf-8") == before


def test_unusable_input_files_are_one_line_errors(sample_model_dir, tmp_path, capsys):
    """A gzip body zlib cannot inflate, a directory, a pipe: named as such, for the input,
    --ref and --prefix-file alike (one reader)."""
    f = _files(tmp_path, in_de="Ein Hund.\n", ref_en="A dog.\n")
    (tmp_path / "bad.de.gz").write_bytes(gzip.compress(b"Ein Hund.\n")[:10] + b"\xff" * 40)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    model = ["--model", str(sample_model_dir()), "--quiet"]
    for argv, message in [
        (["translate", *model, str(tmp_path / "bad.de.gz")], "bad.de.gz: cannot read ("),
        (["translate", *model, "--prefix-file", str(tmp_path / "folder"), str(f["in_de"])],
         "folder: is a directory"),
        (["evaluate", *model, "--src", str(f["in_de"]), "--ref", str(tmp_path / "pipe")],
         "pipe: not a regular file"),
    ]:  # fmt: skip
        assert message in _one_line_error(argv, capsys)


@pytest.mark.parametrize("command", ["translate", "attention"])
def test_text_arguments_that_are_not_utf8_name_the_argument(
    sample_model_dir, tmp_path, capsys, command
):
    """A byte that is not UTF-8 reaches Python's argv as a lone surrogate (0xff: U+DCFF),
    which SentencePiece cannot take: argparse refuses it, naming the argument."""
    model = ["--model", str(sample_model_dir()), "--quiet"]
    src = _files(tmp_path, in_de="Ein Hund.\n")["in_de"]
    argv, named = {
        "translate": (["translate", *model, "--prefix", "A \udcff", str(src)], "--prefix"),
        "attention": (["attention", *model, "Ein \udcff Mann"], "sentence"),
    }[command]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert f"argument {named}: not UTF-8 text (byte 0xff at character " in err


def test_a_too_long_line_of_the_prefix_file_is_named(sample_model_dir, tmp_path, capsys):
    f = _files(tmp_path, in_de="Ein Hund.\nEin Mann.\n", out_en="keep me\n")
    f["prefixes"] = tmp_path / "prefixes.txt"
    f["prefixes"].write_text("A\n" + "A man and a dog " * 40 + "\n", encoding="utf-8")
    argv = ["translate", "--model", str(sample_model_dir()), "--quiet", str(f["in_de"])]
    argv += ["--prefix-file", str(f["prefixes"]), "-o", str(f["out_en"])]
    err = _one_line_error(argv, capsys)
    assert "prefixes.txt, line 2: prefix: " in err and "no room for EOS" in err
    assert f["out_en"].read_text(encoding="utf-8") == "keep me\n"


class _Stdout:
    """A stdout whose writes fail with ``error``."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        pass


def test_a_full_stdout_is_a_clear_error_and_a_closed_pipe_is_quiet(
    sample_model_dir, tmp_path, capsys, monkeypatch
):
    src = _files(tmp_path, in_de="Ein Hund.\n", ref_en="A dog.\n")
    model = ["--model", str(sample_model_dir()), "--quiet"]
    for argv in (
        ["translate", *model, str(src["in_de"])],
        ["evaluate", *model, "--src", str(src["in_de"]), "--ref", str(src["ref_en"])],
    ):
        monkeypatch.setattr(
            sys, "stdout", _Stdout(OSError(errno.ENOSPC, "No space left on device"))
        )
        assert "stdout: cannot write (No space left on device)" in _one_line_error(argv, capsys)
        monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError(errno.EPIPE, "Broken pipe")))
        assert main(argv) == 0  # `aiayn translate ... | head`: the reader left
        assert capsys.readouterr().err == ""


def test_any_command_whose_printed_output_cannot_be_flushed_names_stdout(
    sample_model_dir, capsys, monkeypatch
):
    class FullOnFlush(_Stdout):  # buffered: print works, the flush finds the disk full
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            raise self.error

    monkeypatch.setattr(sys, "stdout", FullOnFlush(OSError(errno.ENOSPC, "No space left")))
    argv = ["summary", "--model", str(sample_model_dir()), "--depth", "1"]
    assert "stdout: cannot write (No space left)" in _one_line_error(argv, capsys)


def test_an_output_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk) leaves the old file as it was and no
    temp file; a good one keeps the file's mode and writes through a link."""
    from aiayn.cli import common

    out = tmp_path / "out.en"
    out.write_text("keep me\n", encoding="utf-8")
    out.chmod(0o640)
    (tmp_path / "link.en").symlink_to(out)

    class Full:
        def __init__(self, fd: int, *args, **kwargs) -> None:
            os.close(fd)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc) -> None:
            pass

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(common.os, "fdopen", Full)
        with pytest.raises(AiaynError, match=r"link\.en: cannot write \(No space left"):
            common.write_text(str(tmp_path / "link.en"), "new text\n" * 1000)
    assert out.read_text(encoding="utf-8") == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.en", "out.en"]
    common.write_text(str(tmp_path / "link.en"), "new\n")
    assert out.read_text(encoding="utf-8") == "new\n" and (tmp_path / "link.en").is_symlink()
    assert out.stat().st_mode & 0o777 == 0o640


def _epochs(sample_model_dir, folder: Path, last: dict) -> Path:
    """A model directory of two epoch checkpoints of the sample model, the second one's
    entries changed by ``last`` (None removes an entry)."""
    from aiayn.checkpoint import BEST, load_checkpoint, save_checkpoint

    state = load_checkpoint(sample_model_dir() / BEST)
    save_checkpoint(state, folder / "checkpoint_epoch001.pt")
    changed = {k: v for k, v in {**state, **last}.items() if v is not None}
    save_checkpoint(changed, folder / "checkpoint_epoch002.pt")
    return folder


def test_average_refuses_another_a_missing_or_a_damaged_tokenizer(
    sample_model_dir, tmp_path, capsys
):
    from aiayn.data.tokenizer import Tokenizer
    from sample_data import PAIRS

    english = Tokenizer.train([en for _, en in PAIRS], tmp_path / "en", 160, num_threads=1)
    weights = torch.load(sample_model_dir() / "checkpoint_best.pt", weights_only=True)["model"]
    other = "checkpoint_epoch002.pt has another tokenizer than "
    cases = [
        (other, {"tokenizer": english.to_bytes()}),
        (other, {"tokenizer": None}),  # none, beside one that has one
        ("checkpoint_epoch002.pt: checkpoint entry 'tokenizer': not a valid", {"tokenizer": b"x"}),
        ("checkpoint_epoch002.pt: checkpoint entry 'model' is malformed (an int", {"model": 5}),
        (
            "checkpoint_epoch002.pt: no weight 'src_embed.weight'",
            {"model": {k: v for k, v in weights.items() if k != "src_embed.weight"}},
        ),
    ]
    for i, (message, last) in enumerate(cases):
        model = _epochs(sample_model_dir, tmp_path / str(i), last)
        err = _one_line_error(["average", "--model", str(model)], capsys)
        assert message in err, err
        if i < 2:  # the message names both files, as translate's ensemble check does
            assert f"than {model / 'checkpoint_epoch001.pt'}; averaged checkpoints" in err
        assert not (model / "checkpoint_averaged.pt").exists()


def test_average_refuses_an_out_that_is_no_regular_file(sample_model_dir, tmp_path, capsys):
    model = _epochs(sample_model_dir, tmp_path / "model", {})
    folder, fifo, file = tmp_path / "adir", tmp_path / "fifo", tmp_path / "file"
    folder.mkdir()
    os.mkfifo(fifo)
    file.write_text("kept")
    argv = ["average", "--model", str(model), "--out"]
    assert f"{folder}: is a directory" in _one_line_error([*argv, str(folder)], capsys)
    assert f"{fifo}: not a regular file" in _one_line_error([*argv, str(fifo)], capsys)
    err = _one_line_error([*argv, str(file / "avg.pt")], capsys)
    assert f"{file / 'avg.pt'}: cannot write (" in err
    assert folder.is_dir() and not any(folder.iterdir()) and stat.S_ISFIFO(fifo.stat().st_mode)
    assert file.read_text() == "kept"
    assert main([*argv, str(tmp_path / "new" / "avg.pt")]) == 0  # the same run, a good --out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "fifo", "file", "model", "new"]


def test_a_damaged_checkpoint_is_one_line_naming_it(sample_model_dir, tmp_path, capsys):
    from aiayn.checkpoint import BEST, load_checkpoint, save_checkpoint

    state = load_checkpoint(sample_model_dir() / BEST)
    nan = {k: torch.full_like(v, float("nan")) for k, v in state["model"].items()}
    cases = {
        "checkpoint entry 'config' is malformed (a str": {"config": "hello"},
        "checkpoint entry 'model' is malformed (an int": {"model": 5},
        "TransformerConfig.n_heads: d_model=64 is not divisible": {
            "config": {**state["config"], "n_heads": 7}
        },
        "TransformerConfig: unknown field(s) wibble": {"config": {**state["config"], "wibble": 3}},
        "weight 'src_embed.weight' holds NaN or infinity": {"model": nan},
    }
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    for message, change in cases.items():
        path = save_checkpoint({**state, **change}, tmp_path / "bad.pt")
        flags = ["--model", str(tmp_path), "--checkpoint", str(path)]
        for argv in (["translate", *flags, "--quiet", str(src)], ["summary", *flags]):
            assert f"{path}: {message}" in _one_line_error(argv, capsys)


def test_train_init_from_a_directory_and_no_checkpoint_name(sample_model_dir, tmp_path, capsys):
    """``--init-from DIR:`` used to say "{'DIR'/ None}: no such checkpoint file"."""
    files = [f"--{k}={tmp_path / k}" for k in ("train-src", "train-tgt", "valid-src", "valid-tgt")]
    model = sample_model_dir()
    argv = ["train", "--out", str(tmp_path / "run"), *files, "--no-progress", "--init-from"]
    err = _one_line_error([*argv, f"{model}:"], capsys)
    assert f"'{model}:' names no checkpoint after ':'" in err and "{" not in err, err


# A model that trains an update in milliseconds, on the built-in sample (no Multi30k).
TINY_RUN = [
    *("model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32"),
    *("model.max_len=64", "max_tokens=400", "warmup=2", "threads=1", "device=cpu"),
]


@pytest.fixture(scope="module")
def sample_prepared(tmp_path_factory) -> Path:
    """The built-in sample pairs, prepared (a 120-token tokenizer)."""
    from aiayn.data.prepared import prepare
    from sample_data import write_sample

    root = tmp_path_factory.mktemp("sample")
    text = write_sample(root / "text")
    train, valid = (text["train.de"], text["train.en"]), (text["val.de"], text["val.en"])
    prepare(train, valid, root / "prepared", vocab_size=120, show_progress=False)
    return root / "prepared"


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
        ("lr_scale: .nan\n", "field 'lr_scale' must be a finite number, got nan"),
        ("adam_eps: .inf\n", "field 'adam_eps' must be a finite number, got inf"),
        ("schedule: linear\n", "schedule 'linear' decays to 0 at the end of the run"),
        ("data:\n", "field 'data' must be a string, got None"),
        ("seed: 1\nmax_steps: 3\nseed: 2\n", ", line 3: key 'seed' given twice (first on line 1)"),
        ("model:\n  d_model: 8\n  d_model: 16\n", ", line 3: key 'd_model' given twice"),
        ("", ": holds no recipe"),
        ("# all commented out\n", ": holds no recipe"),
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
    argv = ["train", "--data", str(sample_prepared), "--no-progress", "--set", *TINY_RUN]
    bad_settings = ("update_freq=0", "model.n_heads=3", "model.no_such_field=1")
    for bad in (*bad_settings, "model.max_len=2.5", "model.dropout=abc"):
        _one_line_error([*argv, bad, "--out", str(keep)], capsys)
        assert [p.name for p in keep.iterdir()] == ["recipe.yaml"], bad
        assert (keep / "recipe.yaml").read_text() == "mine\n"
    new = tmp_path / "new" / "run"
    err = _one_line_error([*argv, "--out", str(new), "--init-from", str(tmp_path / "no")], capsys)
    assert "no such model directory" in err and not (tmp_path / "new").exists()
    plain = tmp_path / "existing.txt"
    plain.write_text("a file\n")
    assert f"{plain}: not a directory" in _one_line_error([*argv, "--out", str(plain)], capsys)
    err = _one_line_error([*argv, "--out", str(plain / "run")], capsys)
    assert f"{plain / 'run'}: cannot create the run directory" in err
    err = _one_line_error([*argv, "--out", str(new), "--train-src", str(plain)], capsys)
    assert "--data and --train-src name two data sets" in err and not new.parent.exists()


def test_resume_keeps_the_model_and_a_finished_run_stays_finished(
    tmp_path, sample_prepared, capsys
):
    out = tmp_path / "run"
    argv = ["train", "--data", str(sample_prepared), "--out", str(out), "--no-progress"]
    argv += ["--set", *TINY_RUN]
    assert main([*argv, "max_steps=2"]) == 0
    last = out / "checkpoint_last.pt"
    saved = last.read_bytes()
    capsys.readouterr()
    assert main([*argv, "max_steps=2", "--resume"]) == 0  # nothing more, not step 3
    assert "nothing to do: the run already reached its max_steps" in capsys.readouterr().out
    assert last.read_bytes() == saved
    err = _one_line_error([*argv, "max_steps=3", "model.d_model=32", "--resume"], capsys)
    assert "model.d_model=32 differs from the run being resumed" in err and "d_model=16" in err
    err = _one_line_error([*argv, "max_steps=3", "adam_betas=[0.8,0.98]", "--resume"], capsys)
    assert "adam_betas=[0.8, 0.98] differs from the run being resumed" in err
    assert last.read_bytes() == saved
    assert main([*argv, "max_steps=3", "model.n_heads=2", "--resume"]) == 0  # the same: fine
    assert load_checkpoint(last)["step"] == 3


def test_init_from_or_resume_with_weights_that_do_not_fit_names_the_file(
    sample_prepared, tmp_path, capsys
):
    from aiayn.checkpoint import save_checkpoint

    out = tmp_path / "run"
    argv = ["train", "--data", str(sample_prepared), "--out", str(out), "--no-progress"]
    argv += ["--set", *TINY_RUN]
    assert main([*argv, "max_steps=1"]) == 0
    last = out / "checkpoint_last.pt"
    state = load_checkpoint(last)
    del state["model"]["src_embed.weight"]
    save_checkpoint(state, last)
    err = _one_line_error([*argv, "max_steps=2", "--resume"], capsys)
    assert f"{last}: weights do not fit the model config" in err and "src_embed.weight" in err
    new = ["train", "--data", str(sample_prepared), "--out", str(tmp_path / "tuned")]
    err = _one_line_error([*new, "--no-progress", "--init-from", str(last)], capsys)
    assert f"{last}: weights do not fit the model config" in err and "src_embed.weight" in err
