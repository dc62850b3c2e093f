"""One optimizer update: gradient accumulation, each rank's share of a group, the guard
against non-finite updates, fp16/bf16 autocast and torch.compile (one process)."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from aiayn.checkpoint import LAST, load_checkpoint
from aiayn.cli import main
from aiayn.data.batching import collate
from aiayn.data.shards import PreparedData
from aiayn.distributed import World
from aiayn.model.transformer import Transformer
from aiayn.train.schedule import NoamSchedule
from aiayn.train.update import TrainingLoss, Updater, rank_share
from conftest import tiny_config
from test_distributed_train import data, max_tokens, records, train_args  # noqa: F401

# The fixtures of test_distributed_train read Multi30k where it is; CI runs it again without.
pytestmark = pytest.mark.multi30k


def make_updater(model: Transformer, **options) -> Updater:
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    schedule = NoamSchedule(optimizer, model.cfg.d_model, warmup=10)
    return Updater(model, optimizer, schedule, World(), **options)


def sentences(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (2, n), generator=g)
    src = [torch.randint(4, 23, (int(k),), generator=g).tolist() for k in lengths[0]]
    tgt = [torch.randint(4, 23, (int(k),), generator=g).tolist() for k in lengths[1]]
    return src, tgt


def test_one_batch_equals_two_accumulated_halves():
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    twin = copy.deepcopy(model)
    src, tgt = sentences(8)
    whole = make_updater(model).update([collate(src, tgt)])
    halves = make_updater(twin).update([collate(src[:4], tgt[:4]), collate(src[4:], tgt[4:])])
    assert whole.n_tokens == halves.n_tokens == sum(map(len, tgt)) + 8
    assert whole.loss == pytest.approx(halves.loss, abs=1e-6)
    # The gradients (kept after the step) are what accumulation must get right; the
    # parameters after Adam are not compared: the key biases' true gradient is 0, and
    # Adam turns their rounding noise into lr-sized steps (see test_distributed_train).
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert a.grad is not None and b.grad is not None, name
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_a_group_without_target_tokens_is_refused_before_any_change():
    """An empty group divided by its 0 tokens: ZeroDivisionError after zeroing grads."""
    from aiayn.errors import TrainingError

    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    before = copy.deepcopy(model.state_dict())
    for group in ([], [collate([], [])]):
        with pytest.raises(TrainingError, match="with no target token"):
            make_updater(model).update(group)
    assert all(torch.equal(p, before[k]) for k, p in model.state_dict().items())


@pytest.mark.parametrize(("n", "size"), [(4, 2), (3, 2), (1, 2), (5, 3), (2, 1)])
def test_rank_shares_cover_the_group_once_with_equal_counts(n, size):
    shares = [rank_share(list(range(n)), World(rank, size)) for rank in range(size)]
    assert len({len(s) for s in shares}) == 1  # every rank runs as many micro-batches
    real = sorted(i for s in shares for i, weight in s if weight)
    assert real == list(range(n))  # each batch once, at full weight
    assert sum(weight == 0.0 for s in shares for _, weight in s) == len(shares[0]) * size - n


def test_static_shape_loss_equals_the_eager_one():
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    batch = collate(*sentences(6)).padded_to_multiple(8)
    assert batch.src.size(1) % 8 == 0 and batch.tgt_in.size(1) % 8 == 0
    eager = TrainingLoss(model, 0.1)(batch.src, batch.tgt_in, batch.tgt_out)
    static = TrainingLoss(model, 0.1, static_shapes=True)(batch.src, batch.tgt_in, batch.tgt_out)
    assert torch.allclose(eager, static, atol=1e-4)


@pytest.fixture
def poison(monkeypatch):
    """Make the losses of the given forward calls (counted from 1) NaN."""
    calls = {"n": 0, "poisoned": set()}
    forward = TrainingLoss.forward

    def poisoned(self, *args):
        calls["n"] += 1
        out = forward(self, *args)
        return out * math.nan if calls["n"] in calls["poisoned"] else out

    monkeypatch.setattr(TrainingLoss, "forward", poisoned)
    return calls["poisoned"]


@pytest.mark.slow
def test_a_poisoned_batch_is_skipped(tmp_path, data, max_tokens, poison, capsys):  # noqa: F811
    poison.add(3)
    out = tmp_path / "run"
    assert main(["train", *train_args(data, out, max_tokens, "max_steps=6")]) == 0
    assert "update after step 2 skipped: loss nan" in capsys.readouterr().out
    skipped = records(out, "skipped")
    assert [(r["step"], r["in_a_row"]) for r in skipped] == [(2, 1)]
    state = load_checkpoint(out / LAST)
    assert state["step"] == 6 and state["skipped"] == 1  # six real updates
    assert all(torch.isfinite(p).all() for p in state["model"].values())
    # The skipped update's batch was consumed: the plan went on past it.
    assert [r["first_batch"] for r in records(out)] == [0, 1, 3, 4, 5, 6]


@pytest.mark.slow
def test_k_poisoned_updates_in_a_row_stop_the_run(tmp_path, data, max_tokens, poison, capsys):  # noqa: F811
    poison.update({6, 7, 8})
    out = tmp_path / "run"
    argv = ["train", *train_args(data, out, max_tokens, "max_skipped_updates=3")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "training stopped: 3 updates in a row had a non-finite loss or gradient" in err
    assert "after step 5" in err and f"the checkpoints in {out} keep the last good" in err
    state = load_checkpoint(out / LAST)  # the last good state, saved at step 4
    assert state["step"] == 4
    assert all(torch.isfinite(p).all() for p in state["model"].values())


def test_a_stop_before_any_checkpoint_says_there_is_none(
    tmp_path,
    data,  # noqa: F811
    max_tokens,  # noqa: F811
    poison,
    capsys,
):
    """It said the checkpoints keep the last good state when there was none."""
    poison.update({1, 2})  # the first two forward calls
    out = tmp_path / "run"
    argv = ["train", *train_args(data, out, max_tokens, "max_skipped_updates=2")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "updates in a row had a non-finite loss" in err and "no checkpoint was saved yet" in err
    assert not (out / LAST).exists()


@pytest.mark.parametrize(("precision", "loss_tol"), [("bf16", 4e-3), ("fp16", 5e-4)])
def test_reduced_precision_updates(precision, loss_tol):
    """Each low-precision update is compared with the fp32 update of the same model. The
    parameters after Adam are not: its first step is lr * sign(grad), blind to a wrong loss
    scale. The gradients are (fp16 unscales them before the step, and keeps them)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    reference = copy.deepcopy(model)
    updater = make_updater(model, precision=precision)
    assert updater.scaler.is_enabled() == (precision == "fp16")
    want = make_updater(reference).update([collate(*sentences(6, 0))])
    got = updater.update([collate(*sentences(6, 0))])
    assert not got.skipped
    # The loss is a mean over ~50 tokens of log-softmaxes computed from low-precision
    # logits: its relative error is about one unit roundoff (bf16 2^-8 = 3.9e-3, fp16
    # 2^-11 = 4.9e-4; measured 5e-4 and 5e-5).
    assert got.loss == pytest.approx(want.loss, rel=loss_tol)
    # The gradient passes back through every layer's low-precision matmuls; measured 2.1%
    # (bf16) and 1.4% (fp16) relative error in the norm of the difference. 5% leaves room
    # and still catches a loss scale that is off by 5% or more (a forgotten unscale is off
    # by 2^16).
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    exact = torch.cat([p.grad.flatten() for p in reference.parameters()])
    assert float((grads - exact).norm() / exact.norm()) < 0.05
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    for seed in (1, 2):
        result = updater.update([collate(*sentences(6, seed))])
        assert math.isfinite(result.loss) and not result.skipped
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("fails", ["forward", "backward"])
def test_a_step_torch_cannot_compile_is_one_line(fails):
    """Without a C++ compiler (or with any other failure of the compiler's backend) the
    first update raised torch's 170-line BackendCompilerFailed traceback."""
    from torch._dynamo.exc import BackendCompilerFailed

    from aiayn.errors import TrainingError

    model = Transformer(tiny_config(dropout=0.0))
    updater = make_updater(model)
    step = updater.step_module
    no_compiler = RuntimeError("No working C++ compiler found in cxx: (None, 'g++')")
    failure = BackendCompilerFailed(lambda: None, no_compiler, None)

    class Backward(torch.autograd.Function):  # a backward graph compiled at its first call
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise failure

    def compiled(*args):
        if fails == "forward":
            raise failure
        return Backward.apply(step(*args))

    updater.step_module = compiled
    with pytest.raises(TrainingError) as caught:
        updater.update([collate(*sentences(6, 0))])
    assert str(caught.value) == (
        "torch.compile could not build the training step (RuntimeError: No working C++ "
        "compiler found in cxx: (None, 'g++')); the recipe's compile: false trains without it"
    )


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16"):
        make_updater(Transformer(tiny_config()), precision="fp8")


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path, data, max_tokens, capsys):  # noqa: F811
    """`compile: true` trains through torch.compile (inductor on the CPU): six updates over
    batches of several shapes give the eager losses to 1e-4, with one
    compiled graphs (lengths padded to buckets, the row count and length dynamic)."""
    runs = {}
    for name, compile in (("eager", "false"), ("compiled", "true")):
        out = tmp_path / name
        argv = train_args(data, out, max_tokens, "max_steps=6", f"compile={compile}")
        assert main(["train", *argv]) == 0
        runs[name] = [r["loss"] for r in records(out)]
    assert len(runs["compiled"]) == 6
    assert runs["compiled"] == pytest.approx(runs["eager"], abs=1e-4)
    shapes = {tuple(b.shape) for b in PreparedData(data).train.plan(max_tokens, 1, 0, 160)[:6]}
    assert len(shapes) >= 3  # batches of different sizes went through the compiled step
    out = capsys.readouterr().out
    graphs = int(re.search(r"torch.compile: (\d+) graphs", out).group(1))
    assert graphs == 1, graphs  # whatever the lengths (tests/test_compile.py)
    assert out.count("compiled step: the first batch compiles it first") == 1
