"""Two ranks under torchrun, and one of them goes wrong: a rank that stalls makes the
other's collective time out (a short collective_timeout_minutes really fires), and a save
that fails on rank 0 (a full disk) ends every rank with that error, none left waiting.
Each fault is put in by a hook around the real code (HOOKED below), not by timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_distributed_train import data, env, max_tokens, train_args  # noqa: F401

pytestmark = [pytest.mark.multi30k, pytest.mark.slow, pytest.mark.timeout(600)]

HOOKED = """\
import errno, os, sys, threading
from pathlib import Path
import aiayn.train.trainer as trainer
import aiayn.train.update as update
from aiayn.cli import main
fault, rank = sys.argv[1], int(os.environ["RANK"])
if fault == "stall" and rank == 1:  # rank 1 stops before its third update, for good
    calls, original = [0], update.Updater.update
    def stalled(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            print("rank 1 stalls", file=sys.stderr, flush=True)
            threading.Event().wait()
        return original(self, *args, **kwargs)
    update.Updater.update = stalled
if fault == "save" and rank == 0:  # rank 0's first checkpoint finds the disk full
    def full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    trainer.save_checkpoint = full
sys.exit(main(sys.argv[2:]))
"""


def run_hooked(tmp_path: Path, fault: str, args: list[str]) -> tuple[int, list[str]]:
    """torchrun, 2 ranks, each running the hooked CLI; (exit code, each rank's stderr)."""
    script = tmp_path / "hooked.py"
    script.write_text(HOOKED)
    logs = tmp_path / "logs"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--log-dir", str(logs), "--redirects", "3", str(script), fault, "train", *args,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{fault}: a rank was left waiting (the run outlived 5 minutes)")
    errs = sorted(logs.rglob("stderr.log"))
    assert len(errs) == 2, errs
    return done.returncode, [e.read_text() for e in errs]


def test_a_stalled_rank_makes_the_collective_time_out(tmp_path, data, max_tokens):  # noqa: F811
    """collective_timeout_minutes 0.2 (12 s): rank 1 stalls before its third update, and
    rank 0, waiting in the gradient all-reduce, fails with the timeout; the run ends."""
    out = tmp_path / "run"
    args = train_args(data, out, max_tokens, "max_steps=6", "collective_timeout_minutes=0.2")
    code, (rank0, rank1) = run_hooked(tmp_path, "stall", args)
    assert code != 0
    assert "rank 1 stalls" in rank1
    assert "rank 1 stalls" not in rank0
    # gloo's own words, with the configured 0.2 minutes: the timeout that fired is ours.
    assert "Timed out waiting 12000ms" in rank0, rank0[-3000:]


def test_a_save_failure_on_rank_0_ends_every_rank(tmp_path, data, max_tokens):  # noqa: F811
    """save_every_steps 4: rank 0's save at step 4 raises ENOSPC; every rank exits with
    that error (the fence shares it), none waits for the 10-minute collective timeout."""
    out = tmp_path / "run"
    args = train_args(data, out, max_tokens, "max_steps=8", "collective_timeout_minutes=10")
    code, errs = run_hooked(tmp_path, "save", args)
    assert code != 0
    for err in errs:  # both ranks: rank 0's error, with its message
        assert "No space left on device" in err, err[-3000:]
    assert not (out / "checkpoint_last.pt").exists()
