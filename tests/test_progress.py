"""Progress output: a bar on a terminal, plain occasional lines in a log file."""

from __future__ import annotations

import io
import subprocess
import sys

from tqdm import tqdm

import aiayn.progress as progress_module
from aiayn.progress import PlainProgress, progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_file_gets_plain_lines_not_carriage_returns(monkeypatch):
    now = [100.0]  # a clock of the test's own: the lines do not depend on the machine's speed
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    log = io.StringIO()
    bar = progress(total=1000, desc="epoch 1", unit="upd", file=log)
    assert isinstance(bar, PlainProgress)
    for _ in range(500):
        now[0] += 0.05  # 25 s in all: inside the 30 s interval, nothing printed
        bar.update(1)
    assert log.getvalue() == ""
    now[0] += 6.0  # past the interval: one line
    bar.update(500)
    bar.set_postfix(loss="2.345")
    now[0] += 2.4
    bar.close()
    bar.close()  # closing twice prints once
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [
        "epoch 1: 1000/1000 upd (100%), 31 s",
        "epoch 1: 1000/1000 upd (100%), 33 s, loss=2.345",
    ]


def test_plain_lines_come_every_interval_and_when_iterating():
    log = io.StringIO()
    bar = PlainProgress(range(5), desc="train", unit="step", file=log, interval=0.0)
    assert list(bar) == [0, 1, 2, 3, 4]
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("train: 1/5 step (20%)") and lines[-1].startswith("train: 5/5")
    assert len(lines) == 6  # one per step with a zero interval, and the closing line


def test_a_terminal_gets_tqdm_and_disable_is_silent():
    assert isinstance(progress(total=3, file=FakeTerminal()), tqdm)
    quiet = io.StringIO()
    with progress(total=3, file=quiet, disable=True) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_demo_log_redirected_to_a_file_has_no_carriage_returns(tmp_path):
    log = tmp_path / "demo.log"
    with log.open("w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "aiayn", "demo", "--steps", "30"],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text
    assert "train: 30/30 step (100%)" in text and "exact match on 1000" in text
