"""Phase 3: decode cost against output length, ours with the KV cache (``DecoderState``) and
with the whole prefix recomputed at every step; plot in OUT/decode_growth.png."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from torch import Tensor

from aiayn.decode import DecodeStep
from aiayn.decode.core import ban, banned_ids
from aiayn.model.transformer import Transformer

from .common import GROWTH_BUDGET_S, load_model, sync
from .context import RunContext
from .data import Setup
from .results import GrowthResult, GrowthRow
from .translate import pad_rows


def fixed_steps(model: Transformer, src: Tensor, steps: int, use_cache: bool) -> Tensor:
    """Exactly ``steps`` greedy steps (EOS does not stop it), with the KV cache or
    recomputing the whole prefix each step."""
    cfg = model.cfg
    step = DecodeStep(model, src, use_cache=use_cache)  # the decoders' own step
    banned = banned_ids(cfg, src.device)
    prefix = torch.full((src.size(0), 1), cfg.bos_id, dtype=torch.long, device=src.device)
    for _ in range(steps):
        token = ban(step.logits(prefix), banned).argmax(dim=-1, keepdim=True)
        prefix = torch.cat([prefix, token], dim=1)
    return prefix


def bench_growth(setup: Setup, ctx: RunContext) -> GrowthResult:
    plan, device, out, log = ctx.plan, ctx.device, ctx.out, ctx.log
    cfg = setup.cfg
    model, _ = load_model(setup.checkpoint, device, precision=ctx.precision)
    ids = [setup.tokenizer.encode(line)[: cfg.max_len - 1] for line in setup.test_src]
    src = pad_rows([i for i in ids if i][: plan.growth_batch], cfg.pad_id, device)
    lengths = [n for n in plan.growth_lengths if n < cfg.max_len]
    times = {"kv_cache": {}, "recompute": {}}
    with torch.inference_mode():
        fixed_steps(model, src, 5, True)  # warm-up
        fixed_steps(model, src, 5, False)
        for L in lengths:
            for name, cache in (("kv_cache", True), ("recompute", False)):
                runs = []
                while len(runs) < plan.growth_repeats and sum(runs) < GROWTH_BUDGET_S:
                    sync(device)
                    t0 = time.perf_counter()
                    fixed_steps(model, src, L, cache)
                    sync(device)
                    runs.append(time.perf_counter() - t0)
                times[name][L] = statistics.median(runs)
            log(
                f"growth L={L}: kv cache {times['kv_cache'][L]:.3f}s, "
                f"recompute {times['recompute'][L]:.3f}s"
            )
    rows = [
        GrowthRow(
            length=L,
            kv_cache_s=round(times["kv_cache"][L], 4),
            recompute_s=round(times["recompute"][L], 4),
            kv_cache_ms_per_step=round(1000 * times["kv_cache"][L] / L, 3),
            recompute_ms_per_step=round(1000 * times["recompute"][L] / L, 3),
            speedup=round(times["recompute"][L] / times["kv_cache"][L], 2),
        )
        for L in lengths
    ]
    plot = plot_growth(rows, src.size(0), out / "decode_growth.png")
    return GrowthResult(
        batch=src.size(0),
        source_length=src.size(1),
        repeats=plan.growth_repeats,
        protocol=(
            "encode once, then exactly L greedy steps (EOS ignored); median of up to "
            f"{plan.growth_repeats} repeats (fewer once a point has taken {GROWTH_BUDGET_S:.0f} s)"
        ),
        rows=rows,
        plot=plot,
    )


def plot_growth(rows: list[GrowthRow], batch: int, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    x = [r.length for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r.kv_cache_s for r in rows], "o-", label="KV cache (DecoderState)")
    ax.plot(x, [r.recompute_s for r in rows], "s--", label="recompute prefix each step")
    ax.set_xlabel("output length L (decoder steps)")
    ax.set_ylabel(f"seconds for a batch of {batch}")
    ax.set_title("aiayn greedy decoding: cost against output length")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name
