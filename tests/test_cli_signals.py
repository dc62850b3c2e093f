"""SIGTERM and SIGHUP unwind the commands that write an output whole, as Ctrl-C does: the
temp file or staging folder of a half-written output is removed, the earlier output is
kept, and the command says "terminated" (exit 128 + the signal). Before, such a kill
left the temp file beside the output (translate -o over 10,000 lines, average, export,
import), and no later run removed it. A Ctrl-C while the command still loads (torch takes
about a second) says "interrupted" too, as it does later, instead of a traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aiayn
from aiayn.checkpoint import BEST
from aiayn.cli import main, unwound_on_term

# Kills itself once the checkpoint is written to its temp file, before the rename. The
# signal's default action first, as a terminal's shell gives it: a suite run under `nohup`
# passes SIGHUP on ignored, and aiayn rightly leaves an ignored signal ignored.
CHILD = """
import os, signal, sys, time
signal.signal(signal.{name}, signal.SIG_DFL)
import aiayn.checkpoint as c
real = c.torch.save
def save(obj, f):
    real(obj, f)
    os.kill(os.getpid(), signal.{name})
    time.sleep(60)
c.torch.save = save
from aiayn.cli import main
sys.exit(main(["average", "--model", {run!r}, "--out", {out!r}]))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_kill_mid_save_leaves_the_old_output_and_no_temp_file(sample_model_dir, tmp_path, name):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(sample_model_dir() / BEST, run / "checkpoint_epoch001.pt")
    out = tmp_path / "avg.pt"
    out.write_bytes(b"an earlier output")
    code = CHILD.format(name=name, run=str(run), out=str(out))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 128 + getattr(signal, name), proc.stderr
    *notes, last = proc.stderr.strip().splitlines()
    assert last == "terminated" and all(n.startswith("note: ") for n in notes), proc.stderr
    assert out.read_bytes() == b"an earlier output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg.pt", "run"]


def test_the_handlers_are_put_back_after_a_command(sample_model_dir, tmp_path, capsys):
    before = [signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGHUP)]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(sample_model_dir() / BEST, run / "checkpoint_epoch001.pt")
    assert main(["average", "--model", str(run), "--out", str(tmp_path / "a.pt")]) == 0
    assert [signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGHUP)] == before


def test_a_forked_worker_dies_of_the_signal_and_nohup_still_holds():
    """prepare's pool forks workers, which inherited the handler: the pool's terminate()
    then raised Terminated inside them (a traceback, once a hang). And a SIGHUP that
    `nohup` set to be ignored was caught again, stopping a run the user had protected."""
    with unwound_on_term(True):
        pid = os.fork()
        if pid == 0:  # the child: SIGTERM must end it, not raise here
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with unwound_on_term(True):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_ctrl_c_while_torch_loads_says_interrupted(tmp_path):
    """The `aiayn` script runs ``from aiayn.cli import main; sys.exit(main())``, and both
    aiayn and aiayn.cli imported torch at their top (about a second): a Ctrl-C then printed
    a traceback from inside torch's import. A torch whose import raises KeyboardInterrupt
    stands in for the Ctrl-C, with no race."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    source = Path(aiayn.__file__).parents[1]  # this aiayn, installed or not
    path = [str(tmp_path), str(source), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    script = "import sys; from aiayn.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", script, "translate", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "interrupted\n", "")


def test_the_package_names_load_on_first_use():
    """aiayn.Transformer and aiayn.TransformerConfig are imported when first asked for."""
    from aiayn import Transformer, TransformerConfig, config
    from aiayn.model import transformer

    assert (Transformer, TransformerConfig) == (transformer.Transformer, config.TransformerConfig)
    assert (aiayn.Transformer, aiayn.TransformerConfig) == (Transformer, TransformerConfig)
    assert {"Transformer", "TransformerConfig", "__version__"} <= set(dir(aiayn))
    with pytest.raises(AttributeError, match="no attribute 'Transformers'"):
        aiayn.Transformers  # noqa: B018
    assert not hasattr(aiayn, "no.such") and not hasattr(aiayn, "_private")
    # In a fresh process, as a user script: subpackages are reached from the package alone.
    code = (
        "import aiayn; print(aiayn.config.TransformerConfig.__name__, aiayn.decode.greedy.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["TransformerConfig", "greedy"]


def test_a_closed_stdout_or_stderr_is_one_error_or_silence_not_a_traceback(
    sample_model_dir, tmp_path
):
    """A stream the shell closed (``>&-``) is None in Python: a closed stdout was an
    AttributeError traceback (even with -o, after the file was written), and with stderr
    closed print() fell back to stdout, so notes went into the translations."""
    model = sample_model_dir()
    src = tmp_path / "in.de"
    src.write_text("Ein Hund.\n" + "Hund " * 200 + "\n")  # the second: a note, cut to fit
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    aiayn_cmd = f"{sys.executable} -m aiayn translate --model {model} --beam 1 {src}"

    def shell(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, env=env, timeout=120
        )

    closed = shell(f"exec 3>&2; {aiayn_cmd} 2>&3 >&-")
    assert closed.returncode == 2 and "Traceback" not in closed.stderr, closed.stderr
    assert "aiayn translate: error: stdout: closed" in closed.stderr
    out = tmp_path / "out.en"
    written = shell(f"{aiayn_cmd} -o {out} >&-")
    assert written.returncode == 0 and "Traceback" not in written.stderr, written.stderr
    assert len(out.read_text().splitlines()) == 2
    quiet = shell(f"{aiayn_cmd} 2>&-")
    assert quiet.returncode == 0 and quiet.stdout.splitlines() == out.read_text().splitlines()
