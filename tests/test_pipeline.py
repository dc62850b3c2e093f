"""End to end on small real data: train, resume (also after SIGKILL), translate, evaluate,
average, and the command line's errors for bad input."""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from cli_util import with_settings
from conftest import small_corpus

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without

# A model small enough to train a few dozen updates in seconds on one core.
TINY = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=64",
    "model.max_len=160",
    "vocab_size=400",
    "max_tokens=600",
    "warmup=10",
    "lr_scale=2.0",
    "save_every_steps=4",
    "log_every=5",
    "keep_last=3",
    "threads=1",
]


def train_argv(paths: dict, out: Path, *overrides: str, resume: bool = False) -> list[str]:
    argv = ["train", "--out", str(out), "--no-progress"]
    argv += ["--train-src", str(paths["train.de"]), "--train-tgt", str(paths["train.en"])]
    argv += ["--valid-src", str(paths["val.de"]), "--valid-tgt", str(paths["val.en"])]
    argv += ["--resume"] if resume else []
    return [*argv, "--set", *with_settings(TINY, *overrides)]


def records(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return small_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> Path:
    """A run of 30 updates (more than one epoch), stopped by max_steps."""
    out = tmp_path_factory.mktemp("run") / "model"
    assert main(train_argv(corpus, out, "max_steps=30")) == 0
    return out


def test_training_writes_a_complete_model_directory(trained):
    names = {p.name for p in trained.iterdir()}
    assert {"recipe.yaml", "spm.model", "metrics.jsonl", "tensorboard"} <= names
    assert {"checkpoint_last.pt", "checkpoint_best.pt"} <= names
    epochs = sorted(n for n in names if n.startswith("checkpoint_epoch"))
    assert 2 <= len(epochs) <= 3  # keep_last=3
    train = records(trained, "train")
    assert [r["step"] for r in train] == list(range(1, 31))
    assert train[-1]["loss"] < train[0]["loss"]  # it learns
    assert all(r["lr"] > 0 and r["tokens"] > 0 for r in train)
    valid = records(trained, "valid")
    assert valid and all({"loss", "ppl", "bleu"} <= set(r) for r in valid)
    state = load_checkpoint(trained / "checkpoint_last.pt")
    assert state["step"] == 30 and state["tokenizer"] and "optimizer" in state


def test_resume_continues_exactly_where_it_stopped(tmp_path, corpus):
    """12 updates + resume to 20 gives the same weights as 20 updates in one go."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(train_argv(corpus, straight, "max_steps=20")) == 0
    assert main(train_argv(corpus, split, "max_steps=12")) == 0
    assert main(train_argv(corpus, split, "max_steps=20", resume=True)) == 0
    a = load_checkpoint(straight / "checkpoint_last.pt")
    b = load_checkpoint(split / "checkpoint_last.pt")
    assert a["step"] == b["step"] == 20
    assert [r["step"] for r in records(split, "train")] == list(range(1, 21))
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_translate_keeps_line_alignment(trained, tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n\nZwei Hunde spielen im Schnee.\n   \n")
    out = tmp_path / "out.en"
    argv = ["translate", "--model", str(trained), "--quiet", "--beam", "2"]
    assert main([*argv, str(src), "-o", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[-1] == ""  # 4 lines, each ended by a newline
    assert lines[0] and lines[2] and lines[1] == "" and lines[3] == ""
    assert main([*argv, str(src), "-o", str(out), "--n-best", "2"]) == 0
    nbest = out.read_text(encoding="utf-8").split("\n")
    assert len(nbest) == 5 and nbest[1] == "" and " ||| " in nbest[0]
    # stdin -> stdout, greedy
    stdin = io.TextIOWrapper(io.BytesIO(b"Eine Frau liest ein Buch.\n\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    capsys.readouterr()
    assert main(["translate", "--model", str(trained), "--quiet", "--beam", "1"]) == 0
    printed = capsys.readouterr().out.split("\n")
    assert len(printed) == 3 and printed[0] and printed[1] == ""
    # invalid UTF-8 on stdin stops with the line, as it does in a file
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"gut\n\xc3\x28 kaputt\n")))
    assert main(["translate", "--model", str(trained), "--quiet"]) == 2
    assert "<stdin>, line 2: invalid UTF-8 (byte 0xc3" in capsys.readouterr().err


def test_evaluate_and_average(trained, corpus, capsys):
    assert main(["average", "--model", str(trained), "--last", "2"]) == 0
    averaged = load_checkpoint(trained / "checkpoint_averaged.pt")
    assert len(averaged["averaged_from"]) == 2 and "optimizer" not in averaged
    capsys.readouterr()
    argv = ["evaluate", "--model", str(trained), "--quiet", "--beam", "1"]
    assert main([*argv, "--src", str(corpus["val.de"]), "--ref", str(corpus["val.en"])]) == 0
    out = capsys.readouterr().out
    assert "BLEU = " in out and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in out
    assert "chrF2" in out


def fail(argv: list[str], capsys) -> str:
    """Run the CLI expecting a user error: exit 2 and one line on stderr, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    return err


def test_bad_input_gives_one_clear_line_and_exit_2(tmp_path, corpus, trained, capsys):
    bad = dict(corpus)
    short = tmp_path / "short.en"
    short.write_text("one line only\n")
    bad["train.en"] = short
    err = fail(train_argv(bad, tmp_path / "a"), capsys)
    assert "train.de.gz has 300 lines" in err or "train.de has 50 lines" in err
    assert "short.en has 1;" in err
    bad["train.en"] = tmp_path / "missing.en"
    assert "missing.en: no such file" in fail(train_argv(bad, tmp_path / "b"), capsys)
    broken = tmp_path / "broken.de"
    broken.write_bytes(b"gut\n\xc3\x28 kaputt\n")
    two = tmp_path / "two.en"
    two.write_text("good\nbroken\n")
    bad.update({"train.de": broken, "train.en": two})
    assert "broken.de, line 2: invalid UTF-8" in fail(train_argv(bad, tmp_path / "c"), capsys)
    assert "unknown field 'max_tokns'" in fail(
        train_argv(corpus, tmp_path / "d", "max_tokns=5"), capsys
    )
    assert "nothing to resume" in fail(train_argv(corpus, tmp_path / "e", resume=True), capsys)
    assert "already holds a training run" in fail(train_argv(corpus, trained), capsys)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(random.Random(0).randbytes(3000))  # seeded: the same junk each run
    decode = ["--quiet", "--src", str(corpus["val.de"]), "--ref", str(corpus["val.en"])]
    assert "junk.pt: cannot read checkpoint" in fail(
        ["evaluate", "--model", str(trained), "--checkpoint", str(junk), *decode], capsys
    )
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((trained / "checkpoint_last.pt").read_bytes()[:5000])
    assert "truncated.pt: cannot read checkpoint" in fail(
        ["evaluate", "--model", str(trained), "--checkpoint", str(truncated), *decode], capsys
    )
    assert "no such model directory" in fail(
        ["translate", "--model", str(tmp_path / "nowhere"), str(corpus["val.de"])], capsys
    )


def test_sigkill_mid_epoch_then_resume(tmp_path, corpus):
    """Kill -9 a training run mid-epoch: every checkpoint on disk still loads, and --resume
    continues from the last saved step with the step count going on from there."""
    out = tmp_path / "killed"
    argv = train_argv(corpus, out, "max_steps=100000", "max_tokens=120", "save_every_steps=2")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiayn", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last = out / "checkpoint_last.pt"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # until a mid-epoch save of step >= 6 is on disk
            if last.exists():
                state = torch.load(last, weights_only=True)
                if state["step"] >= 6 and state["batch_in_epoch"] > 0:
                    break
            assert proc.poll() is None, "training ended before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("no mid-epoch checkpoint within 120 s")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    saved = {p.name: load_checkpoint(p) for p in out.glob("checkpoint_*.pt")}  # none corrupt
    step = saved["checkpoint_last.pt"]["step"]
    # The kill came after a mid-epoch save; on a small corpus a later save may have landed
    # on an epoch boundary before the signal did, so only the step is certain.
    assert state["batch_in_epoch"] > 0 and step >= state["step"] >= 6
    assert (
        main(train_argv(corpus, out, f"max_steps={step + 5}", "max_tokens=120", resume=True)) == 0
    )
    after = load_checkpoint(last)
    assert after["step"] == step + 5
    steps = [r["step"] for r in records(out, "train")]
    assert steps[-5:] == list(range(step + 1, step + 6))  # continues, no restart from 1
    assert not list(out.glob(".checkpoint_*.tmp"))  # a save cut short leaves no litter
    for name in saved:
        if name.startswith("checkpoint_epoch"):
            assert (out / name).exists() or len(after["epoch_checkpoints"]) == 3


def test_a_linear_schedule_decays_to_zero_at_max_steps(tmp_path, corpus):
    out = tmp_path / "linear"
    assert main(train_argv(corpus, out, "max_steps=20", "schedule=linear")) == 0
    lr = [r["lr"] for r in records(out, "train")]
    top = lr.index(max(lr))
    # Update k uses peak * min(1, k / 10) * (1 - (k - 1) / 20): 0.55 peak at k = 10, then
    # down to 0.05 peak at the last.
    assert len(lr) == 20 and top == 9
    assert all(a > b for a, b in itertools.pairwise(lr[top:])) and lr[-1] == pytest.approx(
        lr[top] / 11
    )


def test_weight_decay_trains_and_a_changed_one_is_refused_on_resume(tmp_path, corpus, capsys):
    out = tmp_path / "wd"
    assert main(train_argv(corpus, out, "max_steps=6", "weight_decay=0.1")) == 0
    state = load_checkpoint(out / "checkpoint_last.pt")
    assert state["recipe"]["weight_decay"] == 0.1
    assert [g["weight_decay"] for g in state["optimizer"]["param_groups"]] == [0.1, 0.0]
    capsys.readouterr()
    # Resuming under a recipe without it: one clear line naming the field, run kept.
    assert main(train_argv(corpus, out, "max_steps=8", resume=True)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weight_decay" in err[0] and "checkpoint_last.pt" in err[0]
    assert load_checkpoint(out / "checkpoint_last.pt")["step"] == 6


GATED_TRAIN = """\
import sys, threading
from pathlib import Path
import aiayn.train.update as update
from aiayn.cli import main
gate, stop_at = Path(sys.argv[1]), int(sys.argv[2])
calls, original = [0], update.Updater.update
def gated(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == stop_at:  # held here, mid-run, until the test kills the process
        (gate / "entered").touch()
        threading.Event().wait()
    return original(self, *args, **kwargs)
update.Updater.update = gated
sys.exit(main(sys.argv[3:]))
"""


def test_sigkill_mid_epoch_then_resume_gives_the_uninterrupted_weights(tmp_path, corpus):
    """SIGKILL after update 7 (the last save at step 6, mid-epoch), --resume to 12: the
    weights (dropout on: the random streams are restored too) equal those of 12 updates
    in one go, bit for bit. The run is held at update 8 by a hook, so the kill lands
    there and not at a moment a sleep guessed."""
    settings = ["max_steps=12", "max_tokens=60", "save_every_steps=3", "model.dropout=0.1"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(train_argv(corpus, straight, *settings)) == 0
    gate = tmp_path / "gate"
    gate.mkdir()
    argv = [str(gate), "8", *train_argv(corpus, killed, *settings)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", GATED_TRAIN, *argv],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (gate / "entered").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
            assert time.monotonic() < deadline, "training never reached update 8"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    saved = load_checkpoint(killed / "checkpoint_last.pt")
    assert saved["step"] == 6 and saved["batch_in_epoch"] > 0  # mid-epoch
    assert main(train_argv(corpus, killed, *settings, resume=True)) == 0
    a = load_checkpoint(straight / "checkpoint_last.pt")
    b = load_checkpoint(killed / "checkpoint_last.pt")
    assert a["step"] == b["step"] == 12
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
