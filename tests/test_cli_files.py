"""The files a command reads and writes: an input that is missing, a directory, a pipe,
corrupt gzip or not UTF-8 is one line naming it; text arguments must be UTF-8; an output
is written whole or not at all, never over an input, and a full stdout is named."""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.errors import AiaynError
from cli_util import one_line_error

ROOT = Path(__file__).resolve().parents[1]


def _files(tmp_path, **texts: str) -> dict[str, Path]:
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / name.replace("_", ".")
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_evaluate_with_no_lines_is_refused_and_keeps_the_output(sample_model_dir, tmp_path, capsys):
    f = _files(tmp_path, empty_de="", empty_en="", out_en="keep me\n")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "-o", str(f["out_en"])]
    err = one_line_error([*argv, "--src", str(f["empty_de"]), "--ref", str(f["empty_en"])], capsys)
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
        err = one_line_error(argv, capsys)
        assert f"is the same file as {named}" in err and "give another output file" in err
        assert out.read_text(encoding="utf-8") == before


def test_an_output_that_is_a_file_of_the_model_is_refused(sample_model_dir, tmp_path, capsys):
    """-o over the checkpoint that decodes (or the tokenizer, the recipe) replaced the model
    with translations; now refused before any work, by any path or link, there already or
    not yet. Other files in the model directory (earlier outputs) may be written."""
    model_dir = tmp_path / "model"
    shutil.copytree(sample_model_dir(), model_dir)
    f = _files(tmp_path, in_de="Ein Hund.\n", ref_en="A dog.\n")
    (tmp_path / "link.pt").symlink_to(model_dir / "checkpoint_best.pt")
    model = ["--model", str(model_dir), "--quiet"]
    evaluate = ["evaluate", *model, "--src", str(f["in_de"]), "--ref", str(f["ref_en"])]
    translate = ["translate", *model, str(f["in_de"])]
    spm = next(p for p in model_dir.iterdir() if p.suffix in (".model", ".spm"))
    before = {p: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    # Not there yet counts too: a checkpoint_averaged.pt of text is what `auto` loads next.
    (tmp_path / "dangling.en").symlink_to(model_dir / "checkpoint_last.pt")
    not_yet = (model_dir / "checkpoint_averaged.pt", tmp_path / "dangling.en")
    for argv in (translate, evaluate):
        for out in (model_dir / "checkpoint_best.pt", tmp_path / "link.pt", spm, *not_yet):
            err = one_line_error([*argv, "-o", str(out)], capsys)
            assert f"is a file of the model directory {model_dir}" in err, err
            assert "give another output file" in err
    copy = tmp_path / "copy.pt"
    shutil.copy(model_dir / "checkpoint_best.pt", copy)
    err = one_line_error([*translate, "--checkpoint", str(copy), "-o", str(copy)], capsys)
    assert f"is the same file as --checkpoint {copy}" in err
    assert {p: p.read_bytes() for p in model_dir.iterdir() if p.is_file()} == before
    earlier = model_dir / "test.hyp"  # an earlier output beside the model: written again
    earlier.write_text("old\n", encoding="utf-8")
    assert main([*translate, "-o", str(earlier)]) == 0
    assert earlier.read_text(encoding="utf-8") not in ("", "old\n")


def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch
):
    """-o a folder, or in a folder that does not exist, was refused only after the whole
    decoding; now before anything is read (here the model does not even exist). So are a
    dangling link into a missing folder and a folder that takes no file (read-only)."""
    f = _files(tmp_path, in_de="Ein Hund.\n", ref_en="A dog.\n")
    model = ["--model", str(tmp_path / "no_model"), "--quiet"]
    evaluate = ["evaluate", *model, "--src", str(f["in_de"]), "--ref", str(f["ref_en"])]
    translate = ["translate", *model, str(f["in_de"])]
    missing = tmp_path / "no" / "such"
    dangling = tmp_path / "dangling.en"
    dangling.symlink_to(missing / "out.en")
    for argv in (translate, evaluate):
        err = one_line_error([*argv, "-o", str(tmp_path)], capsys)
        assert f"-o {tmp_path}: is a folder; give a file to write" in err
        err = one_line_error([*argv, "-o", str(missing / "out.en")], capsys)
        assert f"-o {missing / 'out.en'}: no folder {missing} to write it in" in err
        err = one_line_error([*argv, "-o", str(dangling)], capsys)
        assert f"-o {dangling}: a link into {missing}, which does not exist" in err
    assert not missing.parent.exists()

    def read_only(*args, **kwargs):  # as root, a chmod would not stop the write
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", read_only)
    err = one_line_error([*translate, "-o", str(tmp_path / "out.en")], capsys)
    assert f"-o {tmp_path / 'out.en'}: cannot write in {tmp_path} (Permission denied)" in err


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
        (["evaluate", *model, "--src", str(f["in_de"]), "--ref", "/dev/null"],
         "/dev/null: not a regular file"),
        (["prepare", "--train-src", str(tmp_path / "pipe"), "--train-tgt", str(f["ref_en"]),
          "--valid-src", str(f["in_de"]), "--valid-tgt", str(f["ref_en"]),
          "--out", str(tmp_path / "prepared")],
         "pipe: a pipe, which can be read only once: give a file"),
    ]:  # fmt: skip
        assert message in one_line_error(argv, capsys)


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
    err = one_line_error(argv, capsys)
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
        assert "stdout: cannot write (No space left on device)" in one_line_error(argv, capsys)
        monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError(errno.EPIPE, "Broken pipe")))
        assert main(argv) == 0  # `aiayn translate ... | head`: the reader left
        assert capsys.readouterr().err == ""


def test_stdout_to_a_file_that_cannot_grow_is_an_error_not_a_cut_output(sample_model_dir, tmp_path):
    """`translate > out` on a full disk (here a file size limit, as `ulimit -f 4`): Python's
    buffered stdout wrote 4,096 bytes of the translations and dropped the rest without an
    error, exit 0. Now the short write is seen: one line naming stdout, exit 2."""
    import resource
    import subprocess

    from sample_data import PAIRS

    src = tmp_path / "in.de"
    src.write_text("".join(de + "\n" for de, _ in PAIRS * 8), encoding="utf-8")
    argv = [sys.executable, "-m", "aiayn", "translate", "--model", str(sample_model_dir())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "out.en"
    with open(out, "wb") as f:
        done = subprocess.run(
            [*argv, "--quiet", "--beam", "1", str(src)],
            stdout=f, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=limit, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "aiayn translate: error: stdout: cannot write (File too large)"
    assert out.stat().st_size == 4096
    # -o: the same limit was a traceback (close() flushed the failed bytes again); now one
    # line, and the file as it was.
    keep = tmp_path / "keep.en"
    keep.write_text("OLD\n")
    done = subprocess.run(
        [*argv, "--quiet", "--beam", "1", str(src), "-o", str(keep)],
        capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip() == (
        f"aiayn translate: error: {keep}: cannot write (File too large)"
    ), done.stderr
    assert keep.read_text() == "OLD\n" and not list(tmp_path.glob(".keep.en.*"))


def test_dash_as_output_is_stdout_not_a_file_named_dash(
    sample_model_dir, tmp_path, capsys, monkeypatch
):
    """Every input takes "-" for stdin; `-o -` wrote a file named "-" (rc 0, nothing on
    stdout). translate writes stdout; evaluate, whose stdout holds the score, refuses it."""
    monkeypatch.chdir(tmp_path)
    src = _files(tmp_path, in_de="Ein Hund.\n", ref_en="A dog.\n")
    model = ["--model", str(sample_model_dir()), "--quiet", "--beam", "1"]
    assert main(["translate", *model, str(src["in_de"])]) == 0
    to_stdout = capsys.readouterr().out
    assert main(["translate", *model, str(src["in_de"]), "-o", "-"]) == 0
    assert capsys.readouterr().out == to_stdout and to_stdout.strip()
    evaluate = ["evaluate", *model, "--src", str(src["in_de"]), "--ref", str(src["ref_en"])]
    with pytest.raises(SystemExit):
        main([*evaluate, "-o", "-"])
    assert "argument -o/--output: - (stdout) holds the score" in capsys.readouterr().err
    assert not (tmp_path / "-").exists()


def test_any_command_whose_printed_output_cannot_be_flushed_names_stdout(
    sample_model_dir, capsys, monkeypatch
):
    class FullOnFlush(_Stdout):  # buffered: print works, the flush finds the disk full
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            raise self.error

    argv = ["summary", "--model", str(sample_model_dir()), "--depth", "1"]
    full = OSError(errno.ENOSPC, "No space left")
    # A small output fails at the flush; a large one (summary's table) inside print itself.
    for stdout in (FullOnFlush(full), _Stdout(full)):
        monkeypatch.setattr(sys, "stdout", stdout)
        assert "stdout: cannot write (No space left)" in one_line_error(argv, capsys)


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


FORMATS = {"ctranslate2": "ctranslate2", "marian": "transformers"}  # format: its package


def _exporter(fmt: str, model_dir: Path):
    pytest.importorskip(FORMATS[fmt])
    return lambda out, *flags: ["export", fmt, "--model", str(model_dir), "--out", out, *flags]


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_never_replaces_the_current_directory(fmt, sample_model_dir, tmp_path, capsys):
    """`cd export && aiayn export --out . --force` emptied the folder (rmtree of '.')."""
    export = _exporter(fmt, sample_model_dir())
    out = tmp_path / "exported"
    assert main(export(str(out))) == 0
    (out / "notes.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    (out / "sub").mkdir()
    os.chdir(out / "sub")  # pytest's monkeypatch.chdir would not be undone before rmdir
    try:
        for path in (".", "..", str(out)):
            err = one_line_error(export(path, "--force"), capsys)
            assert "holds the current directory" in err, err
        assert "the path is empty" in one_line_error(export("", "--force"), capsys)
    finally:
        os.chdir(tmp_path)
    (out / "sub").rmdir()
    assert sorted(p.name for p in out.iterdir()) == before
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_never_replaces_a_model_directory(fmt, sample_model_dir, tmp_path, capsys):
    """A model directory that happens to hold model.bin (or an export's config.json) was
    replaced by --force, losing every checkpoint; so is any folder holding a run."""
    import shutil

    model_dir = shutil.copytree(sample_model_dir(), tmp_path / "small2")
    export = _exporter(fmt, model_dir)
    assert main(export(str(tmp_path / "ok"))) == 0
    for name in ("model.bin", "config.json"):  # what marks an earlier export
        if (tmp_path / "ok" / name).exists():
            shutil.copy(tmp_path / "ok" / name, model_dir)
    before = sorted(p.name for p in model_dir.iterdir())
    err = one_line_error(export(str(model_dir), "--force"), capsys)
    assert "holds the model itself" in err
    err = one_line_error(export(str(tmp_path), "--force"), capsys)  # holds the model
    assert "holds the model itself" in err
    other_run = tmp_path / "ok"  # an earlier export, but also a run's folder now
    (other_run / "recipe.yaml").write_text("model: {}\n")
    err = one_line_error(export(str(other_run), "--force"), capsys)
    assert "holds a training run" in err
    assert sorted(p.name for p in model_dir.iterdir()) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_through_a_link_replaces_its_target(fmt, sample_model_dir, tmp_path, capsys):
    """--out a link to an earlier export: rmtree refused the link (a traceback); the
    target is replaced, the link kept, and the folder is not left private (mkdtemp's 0700).
    A file of an earlier export that the new one does not write goes with it (a model of
    two vocabularies has a second one); a file no export writes is refused, and kept."""
    export = _exporter(fmt, sample_model_dir())
    target, link = tmp_path / "target", tmp_path / "link"
    assert main(export(str(target))) == 0
    link.symlink_to(target)
    files = sorted(p.name for p in target.iterdir())
    (target / "notes.txt").write_text("mine")
    assert main(export(str(link), "--force")) == 2
    assert "holds notes.txt, which this output does not write" in capsys.readouterr().err
    (target / "notes.txt").unlink()
    stale = "target_vocabulary.json" if fmt == "ctranslate2" else "target_vocab.json"
    (target / stale).write_text("only the earlier export has it")
    assert main(export(str(link), "--force")) == 0
    assert link.is_symlink() and link.resolve() == target
    assert sorted(p.name for p in target.iterdir()) == files
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask
    for file in target.iterdir():  # safetensors' weights were private (0600) whatever the umask
        assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]  # no temp left


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_below_a_file_says_not_a_directory(fmt, sample_model_dir, tmp_path, capsys):
    export = _exporter(fmt, sample_model_dir())
    blocker = tmp_path / "junk.bin"
    blocker.write_text("mine")
    for out in (blocker / "sub", blocker / "a" / "b"):
        err = one_line_error(export(str(out)), capsys)
        assert f"{out}: cannot create ({blocker} is not a directory)" in err, err
    assert blocker.read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["junk.bin"]


def test_a_closed_or_unreadable_stdin_is_one_line(tmp_path, monkeypatch, capsys):
    """``aiayn translate <&-``: Python starts with sys.stdin None (was an AttributeError
    traceback); a stdin whose read fails is named too."""
    model = str(tmp_path / "model")  # refused before the model is read
    monkeypatch.setattr(sys, "stdin", None)
    assert "stdin: closed" in one_line_error(["translate", "--model", model], capsys)

    class Unreadable:
        class buffer:  # noqa: N801 - stands in for sys.stdin.buffer
            @staticmethod
            def read(size: int = -1) -> bytes:
                raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sys, "stdin", Unreadable())
    err = one_line_error(["translate", "--model", model, "-"], capsys)
    assert "stdin: cannot read (Input/output error)" in err


def _stdin(text: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8")


class _Zeros(io.RawIOBase):
    """An endless stdin of NUL bytes, as `< /dev/zero`."""

    def readable(self):
        return True

    def readinto(self, buffer):
        buffer[:] = bytes(len(buffer))
        return len(buffer)


def test_endless_binary_stdin_is_refused_without_reading_it_all(
    sample_model_dir, monkeypatch, capsys
):
    """`aiayn translate < /dev/zero` read stdin whole before its NUL check: 24 GB, then
    the kernel killed it."""
    stdin = io.TextIOWrapper(io.BufferedReader(_Zeros()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    argv = ["translate", "--model", str(sample_model_dir()), "--quiet"]
    assert "line 1: a NUL byte at column 1" in one_line_error(argv, capsys)


def test_evaluate_reads_src_or_ref_from_stdin_as_translate_does(
    sample_model_dir, tmp_path, monkeypatch, capsys
):
    """``--src -`` (or ``--ref -``) reads stdin, as translate's input ``-`` does (it was
    taken for a file named "-"); two inputs cannot both read the one stdin."""
    f = _files(tmp_path, in_de="Ein Hund.\nZwei Männer.\n", ref_en="A dog.\nTwo men.\n")
    evaluate = ["evaluate", "--model", str(sample_model_dir()), "--quiet"]
    assert main([*evaluate, "--src", str(f["in_de"]), "--ref", str(f["ref_en"])]) == 0
    from_files = capsys.readouterr().out
    assert from_files.startswith("BLEU = ")
    src_de, ref_en = str(f["in_de"]), str(f["ref_en"])
    for src, ref, piped in [("-", ref_en, f["in_de"]), (src_de, "-", f["ref_en"])]:
        monkeypatch.setattr(sys, "stdin", _stdin(piped.read_text(encoding="utf-8")))
        assert main([*evaluate, "--src", src, "--ref", ref]) == 0
        assert capsys.readouterr().out == from_files
    monkeypatch.setattr(sys, "stdin", _stdin("Ein Hund.\n"))
    err = one_line_error([*evaluate, "--src", "-", "--ref", ref_en], capsys)
    assert err.rstrip().endswith(f"stdin has 1 line(s) but {ref_en} has 2")


def test_evaluate_and_translate_read_a_pipe_as_a_file(sample_model_dir, tmp_path, capsys):
    """``--ref <(command)`` (a pipe) is read as the file would be, gzip too: it was refused
    as "not a regular file". They read each input once."""
    f = _files(tmp_path, in_de="Ein Hund.\nZwei Männer.\n", ref_en="A dog.\nTwo men.\n")
    evaluate = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "--src"]
    assert main([*evaluate, str(f["in_de"]), "--ref", str(f["ref_en"])]) == 0
    from_files = capsys.readouterr().out
    assert from_files.startswith("BLEU = ")
    ref, src = tmp_path / "ref.pipe", tmp_path / "src.pipe"
    os.mkfifo(ref)
    os.mkfifo(src)
    writers = [
        threading.Thread(target=ref.write_bytes, args=(f["ref_en"].read_bytes(),)),
        threading.Thread(target=src.write_bytes, args=(gzip.compress(f["in_de"].read_bytes()),)),
    ]
    for writer in writers:
        writer.start()
    try:
        assert main([*evaluate, str(src), "--ref", str(ref)]) == 0
    finally:
        for writer in writers:
            writer.join(timeout=30)
    assert not any(w.is_alive() for w in writers) and capsys.readouterr().out == from_files


def _binary_stdin(data: bytes) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def test_lines_longer_than_the_model_takes_are_noted(sample_model_dir, tmp_path, capsys):
    """A line of more tokens than the model has positions is translated from its first
    ones only (docs/decoding.md); translate and evaluate said nothing of it."""
    from aiayn.checkpoint import load_model, resolve_checkpoint

    model = str(sample_model_dir())
    positions = load_model(resolve_checkpoint(model))[0].cfg.max_len
    long = " ".join(["Ein Hund rennt über die Wiese."] * positions)
    lines = ["Ein Hund.", long, "", long, "Zwei Männer."]
    f = _files(tmp_path, in_de="".join(x + "\n" for x in lines), ref_en="a\nb\n\nc\nd\n")
    note = (
        f"note: 2 input line(s) longer than the model's {positions} source positions were "
        f"translated from their first {positions} tokens only (line 2, 4)"
    )
    for quiet in ([], ["--quiet"]):
        assert main(["translate", "--model", model, *quiet, str(f["in_de"])]) == 0
        out, err = capsys.readouterr()
        assert len(out.splitlines()) == 5 and err.count(note) == 1, err
    evaluate = ["evaluate", "--model", model, "--src", str(f["in_de"]), "--ref", str(f["ref_en"])]
    assert main([*evaluate, "--quiet"]) == 0
    assert capsys.readouterr().err.count(note) == 1
    f = _files(tmp_path, in_de="Ein Hund.\n\n")
    assert main(["translate", "--model", model, str(f["in_de"])]) == 0
    assert "note:" not in capsys.readouterr().err


def test_stdin_may_be_gzip_as_a_file_may(sample_model_dir, tmp_path, monkeypatch, capsys):
    """Gzip data on stdin is read as a gzip file is (by its magic bytes; it was "invalid
    UTF-8 (byte 0x8b)"); cut short, it is one line naming stdin and the gzip data. Two
    files whose line counts differ because one ends lines with CR alone say so, and a
    prefix file read from stdin is named stdin, not "-"."""
    model = str(sample_model_dir())
    text = "Ein Hund.\nZwei Männer.\n"
    f = _files(tmp_path, in_de=text, ref_en="A dog.\rTwo men.\r")
    assert main(["translate", "--model", model, "--quiet", str(f["in_de"])]) == 0
    want = capsys.readouterr().out
    packed = gzip.compress(text.encode("utf-8"))
    monkeypatch.setattr(sys, "stdin", _binary_stdin(packed))
    assert main(["translate", "--model", model, "--quiet", "-"]) == 0
    assert capsys.readouterr().out == want
    monkeypatch.setattr(sys, "stdin", _binary_stdin(packed[:12]))
    err = one_line_error(["translate", "--model", model, "-"], capsys)
    assert "<stdin>: bad gzip data (" in err
    evaluate = ["evaluate", "--model", model, "--src", str(f["in_de"]), "--ref", str(f["ref_en"])]
    err = one_line_error(evaluate, capsys)
    assert "has 2 line(s) but" in err and "1 line(s) hold a carriage return" in err
    # translate reads such a file as one line, and says why (it said nothing)
    assert main(["translate", "--model", model, str(f["ref_en"])]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1
    assert f"note: {f['ref_en']}: 1 line(s) hold a carriage return (CR alone" in err
    monkeypatch.setattr(sys, "stdin", _stdin("only one\n"))
    err = one_line_error(
        ["translate", "--model", model, "--prefix-file", "-", str(f["in_de"])], capsys
    )
    assert "stdin: 1 prefix line(s) for 2 input line(s)" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["evaluate", "--src", "-", "--ref", "-"], "--src and --ref both read stdin (-)"),
        (["translate", "--prefix-file", "-"], "the input and --prefix-file both read stdin (-)"),
        (["translate", "a.de", "--alignment-layer", "2"],
         "--alignment-layer picks the layer of --alignment: give --alignment too"),
        (["evaluate", "--src", "a.de", "--ref", "a.en", "-o", "o.en", "--alignment-layer", "1"],
         "--alignment-layer picks the layer of --alignment: give --alignment too"),
        (["evaluate", "--src", "a.de", "--ref", "a.en", "--format", "jsonl"],
         "--format shapes the translations written to -o/--output, and none is given"),
        (["evaluate", "--src", "a.de", "--ref", "a.en", "--alignment", "--format", "text"],
         "--format and --alignment shape the translations written to -o/--output"),
    ],
)  # fmt: skip
def test_flags_that_would_take_no_effect_are_refused_before_any_work(
    tmp_path, monkeypatch, capsys, argv, message
):
    """A flag the user gave is never dropped without a word: refused, naming it, before the
    model or any input is read (none of them exists here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", _stdin("Ein Hund.\n"))
    err = one_line_error([*argv, "--model", str(tmp_path / "no-model"), "--quiet"], capsys)
    assert message in err
    assert list(tmp_path.iterdir()) == []  # no -o file either


def test_a_length_rule_that_allows_no_token_is_refused(sample_model_dir, tmp_path, capsys):
    """--max-len-a 0 --max-len-b 0 printed empty lines with log-prob 0 (exit 0)."""
    src = tmp_path / "in.de"
    src.write_text("Ein Hund läuft.\n")
    argv = ["translate", str(src), "--model", str(sample_model_dir()), "--quiet"]
    err = one_line_error([*argv, "--max-len-a", "0", "--max-len-b", "0"], capsys)
    assert "--max-len-a 0 and --max-len-b 0 allow no output token" in err
    assert main([*argv, "--max-len-a", "0", "--max-len-b", "1"]) == 0


def test_a_seed_without_sampling_is_refused_as_the_server_refuses_it(
    sample_model_dir, tmp_path, capsys
):
    """--seed only seeds sampling: with sampling off (the flags and the model's defaults)
    it would change nothing, so it is refused, as the server's 422 does."""
    model = str(sample_model_dir())
    src = tmp_path / "in.de"
    src.write_text("Ein Hund läuft.\n")
    argv = ["translate", str(src), "--model", model, "--quiet"]
    err = one_line_error([*argv, "--seed", "3"], capsys)
    assert "--seed seeds sampling, which is off: give --sampling too" in err
    err = one_line_error([*argv, "--seed", "3", "--beam", "1"], capsys)
    assert "--seed seeds sampling" in err
    assert main([*argv, "--seed", "3", "--sampling"]) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--seed", "3", "--sampling"]) == 0
    assert capsys.readouterr().out == first and first.strip()
    # 100000 samples a line grew to 23 GB, then the kernel killed the run without a word.
    err = one_line_error([*argv, "--sampling", "--n-best", "100000"], capsys)
    assert "--n-best 100000: at most 1024 samples a line" in err


def test_batch_size_changes_no_output_and_is_checked_before_the_model_loads(
    sample_model_dir, tmp_path, capsys
):
    """`--batch-size` (sentences decoded together) gives the same lines at 1, 3 and 64, in
    beam search with n-best, scores and alignments; 0 is refused naming the flag before
    the model (here: one that does not exist) is read."""
    from sample_data import PAIRS

    f = _files(tmp_path, in_de="".join(f"{de}\n" for de, _ in PAIRS[:10]) + "\n")
    argv = ["translate", "--model", str(sample_model_dir()), "--quiet", str(f["in_de"])]
    argv += ["--n-best", "2", "--format", "jsonl", "--alignment"]
    outputs = []
    for size in ("1", "3", "64"):
        assert main([*argv, "--batch-size", size]) == 0
        outputs.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert len(outputs[0]) == 11 and outputs[0][-1]["text"] == ""  # the blank line
    for other in outputs[1:]:  # the texts and alignments; scores to float rounding (padding)
        for mine, theirs in zip(outputs[0], other, strict=True):
            for a, b in zip(mine.get("n_best", [mine]), theirs.get("n_best", [theirs])):
                assert (a["text"], a["alignment"]) == (b["text"], b["alignment"])
                assert a["score"] == pytest.approx(b["score"], abs=1e-4)
    for command in (["translate", str(f["in_de"])], ["evaluate", "--src", "x", "--ref", "y"]):
        err = one_line_error([*command, "--model", "nowhere", "--batch-size", "0"], capsys)
        assert "--batch-size must be >= 1, got 0" in err


def test_long_inputs_are_decoded_and_written_chunk_by_chunk(
    sample_model_dir, tmp_path, capsys, monkeypatch
):
    """An input is decoded CHUNK_LINES lines at a time and each chunk written as it is
    done (bounded memory, output as it comes): the same lines as in one chunk, for n-best
    with scores and alignments, --closest-to and seeded samples (which follow line
    indices, not chunks). A failure in a later chunk keeps the earlier chunks on stdout
    and leaves an -o file as it was, with no temp file beside it."""
    from aiayn.cli import common
    from aiayn.translator import Translator
    from sample_data import PAIRS

    de = [de for de, _ in PAIRS[:10]]
    f = _files(
        tmp_path,
        in_de="".join(f"{line}\n" for line in de[:6]) + "\n" + "".join(f"{x}\n" for x in de[6:]),
        ref_en="".join(f"{en}\n" for _, en in PAIRS[:10]) + "A dog.\n",
        out_en="keep me\n",
    )
    argv = ["translate", "--model", str(sample_model_dir()), "--quiet", str(f["in_de"])]
    runs = {
        "n-best": ["--n-best", "3", "--format", "jsonl", "--alignment"],
        "closest": ["--n-best", "3", "--closest-to", str(f["ref_en"])],
        "samples": ["--sampling", "--seed", "3", "--n-best", "2"],
        "plain": [],
    }
    printed: dict[int, list[str]] = {}
    for name, flags in runs.items():
        for chunk in (10_000, 3):
            monkeypatch.setattr(common, "CHUNK_LINES", chunk)
            assert main([*argv, *flags]) == 0
            printed[chunk] = capsys.readouterr().out.splitlines()
        assert len(printed[3]) == 11, name
        if name != "n-best":
            assert printed[3] == printed[10_000], name
            continue
        for a, b in zip(printed[3], printed[10_000], strict=True):  # scores: padding moves bits
            a, b = json.loads(a), json.loads(b)
            assert [(t["text"], t.get("alignment")) for t in a.get("n_best", [a])] == [
                (t["text"], t.get("alignment")) for t in b.get("n_best", [b])
            ]
            assert a["score"] == pytest.approx(b["score"], abs=1e-4)
    real, calls = Translator.translations, []

    def fails_third(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise AiaynError("the third chunk broke")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Translator, "translations", fails_third)
    assert main(argv) == 2  # chunks of 3 lines: the first two were printed
    out, err = capsys.readouterr()
    assert out.splitlines() == printed[3][:6] and "the third chunk broke" in err
    calls.clear()
    assert main([*argv, "-o", str(f["out_en"])]) == 2
    assert "the third chunk broke" in capsys.readouterr().err
    assert f["out_en"].read_text(encoding="utf-8") == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "out.en", "ref.en"]


def test_evaluate_scores_and_writes_the_same_in_chunks(
    sample_model_dir, tmp_path, capsys, monkeypatch
):
    from aiayn.cli import common
    from sample_data import PAIRS

    f = _files(
        tmp_path,
        src_de="".join(f"{de}\n" for de, _ in PAIRS[:8]),
        ref_en="".join(f"{en}\n" for _, en in PAIRS[:8]),
    )
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "--src", str(f["src_de"])]
    argv += ["--ref", str(f["ref_en"]), "-o", str(tmp_path / "hyp.en")]
    seen = []
    for chunk in (10_000, 3):
        monkeypatch.setattr(common, "CHUNK_LINES", chunk)
        assert main(argv) == 0
        seen.append((capsys.readouterr().out, (tmp_path / "hyp.en").read_text(encoding="utf-8")))
    assert seen[0] == seen[1] and seen[0][1].count("\n") == 8 and "BLEU = " in seen[0][0]


def test_lines_typed_at_a_terminal_are_translated_as_they_are_entered(sample_model_dir):
    """`aiayn translate` reading a terminal answers each line when Enter is pressed, not
    once the input ends (Ctrl-D), with the translation the model gives offline; invalid
    UTF-8 typed is named by its line."""
    import pty
    import select
    import subprocess

    from aiayn.translator import Translator
    from sample_data import PAIRS

    model = sample_model_dir()
    typed = [de for de, _ in PAIRS[:2]]
    want = [t[0] for t in Translator.from_dir(model).translate(typed)]
    master, slave = pty.openpty()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).parents[1] / "src"),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "aiayn", "translate", "--model", str(model), "--quiet"],
        stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    os.close(slave)
    try:
        for line, translation in zip(typed, want):
            os.write(master, line.encode() + b"\n")
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready, "no translation before the input ended"
            assert child.stdout.readline().decode().rstrip("\n") == translation
        os.write(master, b"\xff\n")  # not UTF-8: the third line
        assert child.wait(60) == 2
        err = child.stderr.read().decode()
        assert "Type a sentence" in err and "<stdin>, line 3: invalid UTF-8" in err
    finally:
        child.kill()
        os.close(master)


@pytest.mark.parametrize(
    "argv",
    [
        ["summary", "--model", ""],  # printed the untrained base preset
        ["average", "--model", "m", "--out", ""],
        ["data", "get", "multi30k", "--mirror", ""],
        ["translate", "--model", "m", "-o", "", "in.de"],
        ["evaluate", "--model", "m", "--src", "a", "--ref", "b", ""],
        ["translate", "--model", "m", ""],  # the input: ".: is a directory"
        ["import", "marian", "", "--out", "m"],  # imported the current folder
        ["train", "--config", "r.yaml", "--out", "o", "--train-src", "", "--train-tgt", "t"],
        [
            "prepare",
            "--out",
            "o",
            "--train-src",
            "s",
            "--valid-src",
            "v",
            "--valid-tgt",
            "w",
            "--train-tgt",
            "",
        ],
    ],
)
def test_a_path_flag_given_empty_is_refused(argv, capsys):
    """`--model "$MODEL"` with MODEL unset: some commands took "" for "not given" and did
    something else without a word (train read the recipe's file beside the flag's other
    side; import marian imported the folder it ran in)."""
    before = argv[argv.index("") - 1]
    positional = {"evaluate": "--ref", "import": "folder"}.get(argv[0], "input")
    flag = before if before.startswith("-") else positional
    flag = {"-o": "--output"}.get(flag, flag)
    assert f"{flag}: the path is empty" in one_line_error(argv, capsys)
