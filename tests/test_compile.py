"""The compiled training step (issue 43): no graph break in any configuration the trainer
runs, few shapes over a real epoch, and the fused loss equal to the full-logits one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from aiayn.config import TransformerConfig
from aiayn.data.batching import BUCKETS, bucket_length, collate
from aiayn.data.prepared import prepare
from aiayn.data.shards import PreparedData
from aiayn.distributed import World
from aiayn.model.transformer import Transformer
from aiayn.train import update
from aiayn.train.loss import label_smoothed_cross_entropy, projected_label_smoothed_loss
from aiayn.train.optim import make_optimizer
from aiayn.train.recipe import Recipe
from aiayn.train.schedule import NoamSchedule
from aiayn.train.update import Updater
from sample_data import ROOT, multi30k_dir, write_sample

RECIPE = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml")


def structure(name: str, vocab: int, **overrides) -> TransformerConfig:
    """The structure of the paper's base model (6+6 layers, one shared vocabulary, three-way
    tying, dropout 0.1) or of the Multi30k recipe's model (3+3 layers, dropout 0.2), with
    small widths: tracing sees layers, masks and tying, not widths."""
    layers = {"base": dict(n_layers=6, dropout=0.1), "multi30k": dict(n_layers=3, dropout=0.2)}
    if name == "multi30k":
        assert RECIPE.model["n_layers"] == 3 and RECIPE.model["share_embeddings"]
    kwargs = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=16, n_heads=4, d_ff=32)
    kwargs.update(share_embeddings=True, tie_output=True, max_len=256)
    return TransformerConfig(**{**kwargs, **layers[name], **overrides})


@pytest.fixture
def graphs(monkeypatch):
    """Compile through a backend that counts dynamo's graphs and runs them as traced;
    yields the counts (graphs, and graph breaks by reason) of what ran since."""
    torch._dynamo.reset()
    counters.clear()
    seen = {"graphs": 0}

    def count(gm: torch.fx.GraphModule, _inputs):
        seen["graphs"] += 1
        return gm.forward

    monkeypatch.setattr(update, "COMPILE_BACKEND", count)
    yield lambda: (seen["graphs"], dict(counters["graph_break"]))
    torch._dynamo.reset()


def make_updater(cfg: TransformerConfig, **options) -> Updater:
    torch.manual_seed(0)
    model = Transformer(cfg).train()
    optimizer = make_optimizer(model, weight_decay=0.1)
    return Updater(model, optimizer, NoamSchedule(optimizer, cfg.d_model, 10), World(), **options)


def batch_of(vocab: int, rows: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, length + 1, (2, rows), generator=g)
    src = [torch.randint(4, vocab, (int(k),), generator=g).tolist() for k in lengths[0]]
    tgt = [torch.randint(4, vocab, (int(k),), generator=g).tolist() for k in lengths[1]]
    return collate(src, tgt)


# Every value of every axis with each model (a covering set: the full product would take
# 32 traces of up to 12 layers).
CASES = [
    ("base", 0.1, False, "fp32", False),
    ("base", 0.0, True, "bf16", True),
    ("multi30k", 0.2, True, "fp32", True),
    ("multi30k", 0.0, False, "bf16", False),
]


@pytest.mark.parametrize(("model", "smoothing", "pre_ln", "precision", "ddp"), CASES)
def test_the_training_step_compiles_whole(
    graphs, tmp_path, model, smoothing, pre_ln, precision, ddp
):
    """Updates (forward, backward, AdamW) of the compiled step: no graph break, with label
    smoothing or without, pre- or post-LN, fp32 or bf16 autocast, on one process or under
    DistributedDataParallel on gloo (a world of one, in this process). On one process:
    one graph (DDP's optimizer may cut it at gradient buckets: splits, not breaks), which
    batches of other row counts and lengths reuse."""
    if ddp:
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cfg = structure(model, 40, norm_first=pre_ln)
        updater = make_updater(cfg, label_smoothing=smoothing, precision=precision, compile=True)
        if ddp:  # as Updater wraps it on several processes
            updater.step_module = nn.parallel.DistributedDataParallel(
                updater.step_module, forward_sync_buffers=False
            )
        counts = []
        for rows, length in ((5, 11), (3, 30)):  # the second brings bucket 32 to bucket 12
            # two micro-batches: under DDP no_sync, then the all-reduce
            group = [batch_of(40, rows, length, seed=rows), batch_of(40, rows + 2, 10)]
            result = updater.update(group)
            assert math.isfinite(result.loss) and not result.skipped
            counts.append(graphs()[0])
        n, breaks = graphs()
        assert breaks == {}
        assert n >= 1 if ddp else n == 1
        assert counts[1] == counts[0], counts  # another length and row count: no new graph
    finally:
        if ddp:
            dist.destroy_process_group()


def multi30k_epoch(work: Path) -> PreparedData:
    """The Multi30k training set (the built-in sample without it), prepared with the
    recipe's vocabulary."""
    data = multi30k_dir()
    if data is not None:
        train, valid = (data / "train.de.gz", data / "train.en.gz"), (data / "val.de.gz",)
        valid += (data / "val.en.gz",)
        vocab = RECIPE.vocab_size
    else:
        paths = write_sample(work / "sample")
        train, valid = (paths["train.de"], paths["train.en"]), (paths["val.de"], paths["val.en"])
        vocab = 300
    prepare(train, valid, work / "data", vocab_size=vocab, show_progress=False)
    return PreparedData(work / "data")


@pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without
def test_an_epoch_of_multi30k_compiles_few_graphs(graphs, tmp_path):
    """A full epoch of the Multi30k recipe's plan through the compiled step: one graph
    whatever the length buckets met (lengths and rows are dynamic), and the padding that
    costs stays bounded."""
    data = multi30k_epoch(tmp_path)
    # Graphs follow the shapes, not the ids or the depth: with ids folded into 64 (pads
    # kept) and one layer each side, steps and traces are cheap.
    cfg = structure("multi30k", 64, dropout=0.0, n_layers=1)
    plan = data.train.plan(RECIPE.max_tokens, RECIPE.seed, 0, cfg.max_len)
    updater = make_updater(cfg, compile=True)
    real = planned = padded = 0
    lengths = set()
    for index in plan:
        batch = data.train.batch(index)
        for ids in (batch.src, batch.tgt_in, batch.tgt_out):
            ids.copy_(ids.where(ids == cfg.pad_id, ids % 60 + 3))
        result = updater.update([batch])  # forward, backward and AdamW: the real step
        assert math.isfinite(result.loss)
        length = bucket_length(max(batch.src.size(1), batch.tgt_in.size(1)), cfg.max_len)
        lengths.add(length)
        real += batch.n_src_tokens + batch.n_tgt_tokens
        planned += batch.src.numel() + batch.tgt_in.numel()
        padded += 2 * max(2, batch.src.size(0)) * length
    n, breaks = graphs()
    assert breaks == {}
    assert n == 1, (n, sorted(lengths))  # Multi30k: 8 buckets met
    if len(plan) > 100:  # Multi30k: real / padded tokens 0.942 as planned, 0.786 bucketed
        assert real / padded > 0.8 * real / planned > 0.7, (real / planned, real / padded)


def test_buckets():
    assert [bucket_length(n, 256) for n in (1, 8, 9, 13, 33, 256)] == [8, 8, 12, 16, 40, 256]
    assert bucket_length(300, 1024) == 512 and bucket_length(300, 400) == 400
    assert bucket_length(45, 50) == 48 and bucket_length(49, 50) == 50
    batch = collate([[5, 6, 7]], [[8, 9]]).padded_to_bucket(64)
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (2, 8)
    assert batch.tgt_out[1].eq(0).all()  # the added row has no target: it weighs nothing
    assert list(BUCKETS) == sorted(BUCKETS)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunks", [None, 1, 3, 7])
def test_the_fused_loss_equals_the_full_logits_one(bias, chunks):
    """Loss, NLL and the gradients of the hidden states, the projection and its bias, in
    any number of chunks, as the unfused loss over ``[N, V]`` logits gives them."""
    torch.manual_seed(0)
    hidden = torch.randn(5, 7, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    b = torch.randn(40, requires_grad=True) if bias else None
    target = torch.randint(0, 40, (5, 7))
    target[0, 3:] = 0  # pads
    params = [hidden, weight] + ([b] if b is not None else [])
    loss, nll = projected_label_smoothed_loss(hidden, weight, b, target, 0.1, 0, chunks)
    fused = torch.autograd.grad(loss, params)
    full_loss, full_nll, _ = label_smoothed_cross_entropy(F.linear(hidden, weight, b), target)
    full = torch.autograd.grad(full_loss, params)
    assert loss.item() == pytest.approx(full_loss.item(), rel=1e-6)
    assert nll.item() == pytest.approx(full_nll.item(), rel=1e-6)
    for a, c in zip(fused, full):
        assert a.dtype == c.dtype and torch.allclose(a, c, atol=1e-5), (a - c).abs().max()


def test_the_fused_loss_under_bf16_autocast():
    """In the autocast dtype with fp32 sums: equal to the unfused loss on bf16 logits."""
    torch.manual_seed(0)
    hidden = torch.randn(4, 9, 32, requires_grad=True)
    weight = torch.randn(50, 32, requires_grad=True)
    target = torch.randint(1, 50, (4, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = projected_label_smoothed_loss(hidden, weight, None, target, 0.1, 0, 3)
        full, _, _ = label_smoothed_cross_entropy(F.linear(hidden, weight), target)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(full.item(), rel=1e-5)
    for a, c in zip(
        torch.autograd.grad(loss, [hidden, weight]), torch.autograd.grad(full, [hidden, weight])
    ):
        assert a.dtype == torch.float32 and torch.allclose(
            a, c, rtol=0.02, atol=0.02 * c.abs().max()
        )


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("tied", [True, False])
def test_the_training_loss_equals_the_full_logits_one(static, tied):
    """TrainingLoss (eager and compiled-path forms) against the model's full logits and
    label-smoothed cross-entropy: same sums, same gradient of every parameter. Untied,
    with an output bias (Marian's) too."""
    cfg = structure("multi30k", 40, dropout=0.0, tie_output=tied, output_bias=not tied)
    torch.manual_seed(0)
    model = Transformer(cfg)
    batch = batch_of(40, 6, 9).padded_to_bucket(cfg.max_len)
    sums = update.TrainingLoss(model, 0.1, static_shapes=static)(
        batch.src, batch.tgt_in, batch.tgt_out
    )
    fused = torch.autograd.grad(sums[0], list(model.parameters()))
    logits = model(batch.src, batch.tgt_in)
    loss, nll, _ = label_smoothed_cross_entropy(logits, batch.tgt_out, 0.1)
    full = torch.autograd.grad(loss, list(model.parameters()))
    assert sums.tolist() == pytest.approx([loss.item(), nll.item()], rel=1e-5)
    for (name, _), a, c in zip(model.named_parameters(), fused, full):
        assert torch.allclose(a, c, atol=1e-5), name
