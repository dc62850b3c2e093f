"""Data-parallel training on torch.distributed, tested on the CPU with gloo: W processes
equal one process fed the union of their batches; rank 0 alone writes; resume across world
sizes; uneven batch counts; elastic restarts after SIGKILL; two nodes on loopback.

Every launch is a real ``torchrun`` (``python -m torch.distributed.run``) of the CLI, with
one thread per process, under a timeout so a hang fails instead of blocking.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed import TCPStore

from aiayn.checkpoint import LAST, load_checkpoint, load_model
from aiayn.cli import main
from aiayn.data.shards import PreparedData
from cli_util import with_settings
from conftest import small_corpus
from serve_util import wait_for

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.multi30k, pytest.mark.slow, pytest.mark.timeout(600)]

# A model of 0.03M parameters; dropout 0 so no random stream differs between the runs.
RECIPE = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=64",
    "model.max_len=160",
    "model.dropout=0.0",
    "warmup=10",
    "lr_scale=2.0",
    "save_every_steps=4",
    "log_every=5",
    "threads=1",
    "max_epochs=1",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    corpus = small_corpus(tmp_path_factory.mktemp("corpus"))
    out = tmp_path_factory.mktemp("prepared") / "data"
    argv = ["prepare", "--out", str(out), "--vocab-size", "400", "--no-progress"]
    argv += ["--train-src", str(corpus["train.de"]), "--train-tgt", str(corpus["train.en"])]
    argv += ["--valid-src", str(corpus["val.de"]), "--valid-tgt", str(corpus["val.en"])]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def max_tokens(data) -> int:
    """A batch budget whose epoch plan has an odd number of batches that 4 does not divide:
    the last update of 2 ranks (and of 2 ranks x update_freq 2) is short, and some rank
    must run zero-weight dummy batches there."""
    train = PreparedData(data).train
    for budget in [*range(400, 900, 20), *range(40, 400, 10)]:  # Multi30k; the sample
        n = len(train.plan(budget, 1, 0, 160))
        if n % 2 == 1 and n >= 9:
            return budget
    raise AssertionError("no budget gives an odd number of batches")


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def torchrun_command(*launcher: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "aiayn", "train"]


def train_args(data: Path, out: Path, max_tokens: int, *overrides: str) -> list[str]:
    return [
        "--data", str(data), "--out", str(out), "--no-progress",
        "--set", *with_settings(RECIPE, f"max_tokens={max_tokens}", *overrides),
    ]  # fmt: skip


def torchrun(nproc: int, args: list[str], *launcher: str) -> subprocess.CompletedProcess:
    command = torchrun_command("--standalone", "--nproc-per-node", str(nproc), *launcher)
    done = subprocess.run([*command, *args], env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def params(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out / LAST)["model"]


def max_difference(a: Path, b: Path) -> float:
    """The largest parameter difference between two runs' checkpoint_last.pt, leaving out
    the attention's key biases: softmax ignores what adds the same score to every key, so
    their true gradient is 0 and what they get is rounding noise (1e-10), which Adam
    divides by its own size into lr-sized steps that differ with the summation order of an
    all-reduce. They change no output: compared separately in :func:`same_outputs`."""
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    worst = 0.0
    for name, x in pa.items():
        y = pb[name]
        if name.endswith("attn.in_proj.bias"):
            d = x.numel() // 3
            x, y = torch.cat([x[:d], x[2 * d :]]), torch.cat([y[:d], y[2 * d :]])
        worst = max(worst, (x.double() - y.double()).abs().max().item())
    return worst


def same_outputs(a: Path, b: Path, data: Path) -> None:
    """Both runs' models give the same logits (to 1e-4) on a validation batch."""
    train = PreparedData(data).valid
    batch = train.batch(train.plan(400, 0, 0, 160)[0])
    logits = []
    for out in (a, b):
        model, _ = load_model(out / LAST)
        with torch.no_grad():
            logits.append(model(batch.src, batch.tgt_in))
    assert (logits[0] - logits[1]).abs().max().item() <= 1e-4


def records(out: Path, kind: str = "train") -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def single(tmp_path_factory, data, max_tokens):
    """One process, update_freq 2 and 4: the unions of 2 ranks' batches at update_freq 1
    and 2. Trained once, compared with by several tests."""
    runs = {}
    for update_freq in (2, 4):
        out = tmp_path_factory.mktemp(f"single{update_freq}")
        argv = ["train", *train_args(data, out, max_tokens, f"update_freq={update_freq}")]
        assert main(argv) == 0
        runs[update_freq] = out
    return runs


@pytest.mark.parametrize("update_freq", [1, 2])
def test_two_processes_equal_one_on_the_union(tmp_path, data, max_tokens, single, update_freq):
    out = tmp_path / "two"
    done = torchrun(2, train_args(data, out, max_tokens, f"update_freq={update_freq}"))
    one = single[2 * update_freq]
    assert max_difference(out, one) <= 1e-5
    same_outputs(out, one, data)
    # The same updates (tokens per update), the same losses, and the whole epoch: the short
    # last update (dummy batches on some rank) finished without hanging.
    mine, theirs = records(out), records(one)
    assert [r["tokens"] for r in mine] == [r["tokens"] for r in theirs]
    assert [r["loss"] for r in mine] == pytest.approx([r["loss"] for r in theirs], abs=1e-5)
    n_plan = len(PreparedData(data).train.plan(max_tokens, 1, 0, 160))
    assert n_plan % (2 * update_freq)  # the tail is uneven
    assert sum(r["batches"] for r in mine) == n_plan
    assert load_checkpoint(out / LAST)["epoch"] == 1
    # Rank 0 alone printed and wrote: one log, one line per update, one model line.
    assert done.stdout.count("model: ") == 1 and "2 processes" in done.stdout
    steps = [r["step"] for r in mine]
    assert steps == sorted(set(steps)) == list(range(1, len(mine) + 1))
    assert len(records(out, "valid")) == 1
    files = {p.name for p in out.iterdir()} - {"tensorboard"}
    expected = {LAST, "checkpoint_best.pt", "checkpoint_epoch001.pt", "metrics.jsonl"}
    assert files == expected | {"recipe.yaml", "spm.model"}


def test_resume_with_another_world_size_continues_the_plan(tmp_path, data, max_tokens):
    first = tmp_path / "first"
    torchrun(2, train_args(data, first, max_tokens, "max_steps=3"))
    saved = load_checkpoint(first / LAST)
    assert saved["step"] == 3 and saved["batch_in_epoch"] == 6
    n_plan = len(PreparedData(data).train.plan(max_tokens, 1, 0, 160))
    for nproc in (1, 3):
        out = tmp_path / f"resumed{nproc}"
        shutil.copytree(first, out)
        args = [*train_args(data, out, max_tokens), "--resume"]
        if nproc == 1:
            assert main(["train", *args]) == 0
        else:
            torchrun(nproc, args)
        # Positions in the epoch's plan: contiguous from 0 to its end, each batch once.
        covered = []
        for r in records(out):
            covered += range(r["first_batch"], r["first_batch"] + r["batches"])
        assert covered == list(range(n_plan))
        after = [r for r in records(out) if r["step"] > 3]
        assert after[0]["first_batch"] == 6
        assert all(r["batches"] == nproc for r in after[:-1])  # nproc batches per update
        state = load_checkpoint(out / LAST)
        assert state["epoch"] == 1 and state["step"] == 3 + len(after)


def test_a_resumed_run_of_two_processes_draws_the_dropout_it_would_have(tmp_path, data, max_tokens):
    """Rank 1 seeded its dropout once, at its start: a run resumed at step 2 drew other
    masks there than the run that went on, and trained to other weights (one process was
    exact: rank 0's stream is in the checkpoint). Now rank 1's masks follow the batch."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    dropout = ("model.dropout=0.3", "max_steps=4")
    torchrun(2, train_args(data, straight, max_tokens, *dropout))
    torchrun(2, train_args(data, resumed, max_tokens, "model.dropout=0.3", "max_steps=2"))
    torchrun(2, [*train_args(data, resumed, max_tokens, *dropout), "--resume"])
    assert max_difference(straight, resumed) == 0.0


def test_two_nodes_on_loopback_agree_with_one_node(tmp_path, data, max_tokens, single):
    """The rendezvous store is served here, on a port bound once and held (no free port
    found, closed and reused); both agents join it as clients (is_host=false)."""
    out = tmp_path / "two-nodes"
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    launchers = []
    for node_rank in (0, 1):
        launcher = [
            "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node_rank),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store.port}",
            "--rdzv-id", "aiayn-test", "--rdzv-conf", "is_host=false",
        ]  # fmt: skip
        command = [*torchrun_command(*launcher), *train_args(data, out, max_tokens)]
        launchers.append(
            subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    outputs = [p.communicate(timeout=300) for p in launchers]
    for p, (_, err) in zip(launchers, outputs):
        assert p.returncode == 0, err.decode()[-4000:]
    assert max_difference(out, single[2]) <= 1e-5
    same_outputs(out, single[2], data)
    assert sum(b"model: " in stdout for stdout, _ in outputs) == 1  # one rank 0 of two nodes


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_elastic_restart_after_a_worker_is_killed(tmp_path, data, max_tokens):
    out = tmp_path / "elastic"
    steps = 150
    args = train_args(data, out, max_tokens, f"max_steps={steps}", "max_epochs=100")
    launcher = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2"]
    command = [*torchrun_command(*launcher), *args, "--resume", "auto"]
    agent = subprocess.Popen(
        command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def step() -> int:  # checkpoints are renamed into place whole: safe to read meanwhile
        return load_checkpoint(out / LAST)["step"] if (out / LAST).exists() else 0

    # Mid-run: a checkpoint at step >= 8, more to come.
    wait_for(lambda: step() >= 8 or agent.poll() is not None, "a checkpoint at step 8", 120, 0.05)
    assert agent.poll() is None and step() < steps, agent.communicate()[1][-4000:]
    workers = children(agent.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    stdout, stderr = agent.communicate(timeout=300)
    assert agent.returncode == 0, stderr[-4000:]
    assert "resumed from" in stdout  # the restarted group went on from checkpoint_last
    assert load_checkpoint(out / LAST)["step"] == steps
    steps_logged = [r["step"] for r in records(out)]
    assert steps_logged[-1] == steps and set(steps_logged) == set(range(1, steps + 1))
    for path in out.glob("checkpoint_*.pt"):
        load_model(path)  # every checkpoint on disk loads


def test_resume_auto_starts_or_resumes(tmp_path, data, max_tokens):
    out = tmp_path / "auto"
    argv = ["train", *train_args(data, out, max_tokens, "max_steps=2"), "--resume", "auto"]
    assert main(argv) == 0  # nothing to resume: a new run
    assert load_checkpoint(out / LAST)["step"] == 2
    argv[argv.index("max_steps=2")] = "max_steps=4"
    assert main(argv) == 0  # resumed
    assert [r["step"] for r in records(out)] == [1, 2, 3, 4]


def test_an_error_on_rank_0_during_set_up_ends_every_rank_at_once(tmp_path, data, max_tokens):
    """Rank 0 refuses the run directory (a folder where the recipe goes, which is not a
    run's; it was found when writing the recipe, as a full disk would be): every rank
    exits with rank 0's one-line message within seconds, none waits for the collective
    timeout."""
    out = tmp_path / "run"
    (out / "recipe.yaml").mkdir(parents=True)  # a run would write its recipe there
    logs = tmp_path / "logs"
    args = train_args(data, out, max_tokens, "collective_timeout_minutes=10")
    command = torchrun_command(
        "--standalone", "--nproc-per-node", "2", "--log-dir", str(logs), "--redirects", "3"
    )
    # Time is the contract here: the collective timeout is 10 minutes, and a rank that
    # waited for it would outlive this 5-minute limit (the normal run takes ~10 s).
    try:
        done = subprocess.run(
            [*command, *args], env=env(), capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a rank waited for the collective timeout of one that had failed")
    assert done.returncode != 0
    errs = sorted(logs.rglob("stderr.log"))
    assert len(errs) == 2, errs
    for err in errs:  # both ranks: rank 0's error, with its message
        text = err.read_text()
        message = f"{out}: holds files that are not a training run's (recipe.yaml)"
        assert message in text, text[-2000:]


OWN_OUT = """\
import os, sys
from aiayn.cli import main
out, rest = sys.argv[1] + os.environ["RANK"], sys.argv[2:]
sys.exit(main(["train", "--out", out, *rest]))
"""


def test_a_rank_that_cannot_see_the_run_directory_says_so(tmp_path):
    """Ranks with no shared disk (here: each its own --out) met rank 0's prepared text
    missing as "no such folder (no manifest.json; prepare the data first)"."""
    corpus = small_corpus(tmp_path / "corpus", n_train=60, n_valid=10)
    text = ["--train-src", str(corpus["train.de"]), "--train-tgt", str(corpus["train.en"])]
    text += ["--valid-src", str(corpus["val.de"]), "--valid-tgt", str(corpus["val.en"])]
    script = tmp_path / "own_out.py"
    script.write_text(OWN_OUT)
    logs = tmp_path / "logs"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "--log-dir", str(logs), "--redirects", "3"]
    args = [str(tmp_path / "run"), *text, "--no-progress", "--set", *RECIPE, "vocab_size=200"]
    done = subprocess.run(
        [*command, str(script), *args], env=env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    errs = sorted(logs.rglob("stderr.log"))
    assert len(errs) == 2, errs
    for err in errs:  # rank 1's error, on both ranks
        message = f"{tmp_path / 'run1' / 'data'}: rank 1 cannot see it; on several machines"
        assert message in err.read_text(), err.read_text()[-2000:]
    assert not (tmp_path / "run0" / "data").exists()  # rank 0 removed what it made


VALIDATE = """\
import json, sys
from pathlib import Path
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer

out, dest = Path(sys.argv[1]), Path(sys.argv[2])
recipe = Recipe.from_yaml(out / "recipe.yaml", sys.argv[3:])
trainer = Trainer(recipe, out, resume=True, log=lambda *_: None)
(dest / f"rank{trainer.world.rank}.json").write_text(json.dumps(trainer.validate()))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory, max_tokens) -> Path:
    """A run trained long enough that its validation BLEU is not 0. It is validated on 40
    of the pairs it trained on, so that this holds on any corpus: a 0.03M-parameter model
    trained for 150 updates translates no unseen sentence of the built-in sample (50
    training pairs) well enough to score."""
    from aiayn.data.corpus import read_lines

    root = tmp_path_factory.mktemp("trained")
    corpus = small_corpus(root / "corpus")
    for lang in ("de", "en"):
        seen = read_lines(corpus[f"train.{lang}"])[:40]
        (root / f"seen.{lang}").write_text("".join(f"{line}\n" for line in seen), "utf-8")
    data = root / "data"
    argv = ["prepare", "--out", str(data), "--vocab-size", "400", "--no-progress"]
    argv += ["--train-src", str(corpus["train.de"]), "--train-tgt", str(corpus["train.en"])]
    argv += ["--valid-src", str(root / "seen.de"), "--valid-tgt", str(root / "seen.en")]
    assert main(argv) == 0
    run = root / "run"
    longer = ("max_steps=300", "max_epochs=100", "valid_every_steps=1000", "lr_scale=0.3")
    assert main(["train", *train_args(data, run, max_tokens, *longer)]) == 0
    assert records(run, "valid")[-1]["bleu"] > 0
    return run


@pytest.mark.parametrize("beam", [1, 3])
def test_validation_on_two_processes_equals_one(tmp_path, trained, beam):
    """The same weights validated by 1 process and by 2 (each its share of the batches
    and sentences): the same loss, perplexity and BLEU, on every rank."""
    run = trained  # resumed read-only: validation writes nothing
    script = tmp_path / "validate.py"
    script.write_text(VALIDATE)
    results = {}
    for nproc in (1, 2):
        dest = tmp_path / f"valid{nproc}"
        dest.mkdir()
        argv = [str(script), str(run), str(dest), f"valid_beam={beam}"]
        if nproc == 1:
            command = [sys.executable, *argv]
        else:
            launcher = ["--standalone", "--nproc-per-node", "2"]
            command = [sys.executable, "-m", "torch.distributed.run", *launcher, *argv]
        done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        results[nproc] = [json.loads(p.read_text()) for p in sorted(dest.glob("rank*.json"))]
    (one,), (first, second) = results[1], results[2]
    assert first == second  # every rank has the figures
    assert first["bleu"] == one["bleu"] and one["bleu"] > 0
    assert first["loss"] == pytest.approx(one["loss"], rel=1e-9)
    assert first["ppl"] == pytest.approx(one["ppl"], rel=1e-9)
