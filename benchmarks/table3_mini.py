"""Table 3 of the paper in miniature: its variation rows on Multi30k de-en, each trained
for the same FIXED number of updates from a reduced base model, then scored on val.

    python benchmarks/table3_mini.py --out runs/table3-mini            # every row
    python benchmarks/table3_mini.py --out runs/table3-mini --rows base A_h1

The budget is a number of updates (``--steps``, default 300, with ``--max-tokens`` 1500
padded tokens per side per batch), never wall time: the machine is shared, and a time
budget would give a row less training when a neighbour is busy. Each row trains its own
joint BPE (8,000 pieces, as recipes/multi30k.yaml) with one thread, and reports what the
Trainer's validation computes after the last update: val perplexity per BPE token (the
paper's is per word piece on newstest2013) and greedy val BLEU (the paper's is beam 4 on
newstest2013 after checkpoint averaging). Results go to OUT/results.json after every row
and a Markdown table to OUT/table3_mini.md. Data: $AIAYN_MULTI30K, ../shared/data/multi30k
or the cache of `aiayn data get multi30k` (fetched when none has it). This is a benchmark,
not a test.

Mini base: d_model 128, h 8 (d_k = d_v = 16), N 2, d_ff 512, P_drop 0.1, eps_ls 0.1: the
paper's base with every width divided by 4 and N by 3. Rows scale the same way.

(B) needs d_k smaller than d_model / h with d_v unchanged, which TransformerConfig does
not offer (d_k = d_v = d_model / h). The row is run by masking: in every attention layer
the W^Q and W^K rows (and biases) beyond the first ``d_k`` of each head are zeroed and
their gradients dropped, so each head's dot product uses ``d_k`` features. Their scores are
still divided by sqrt(d_model / h), not sqrt(d_k); the kept W^Q rows start scaled by
sqrt((d_model / h) / d_k) so the initial logits have the paper's variance. The masked
weights are not counted in the row's parameters.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from aiayn.data.datasets import pair_files
from aiayn.model.attention import MultiHeadAttention
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
from sample_data import multi30k_dir  # noqa: E402

BASE = {"d_model": 128, "n_heads": 8, "n_layers": 2, "d_ff": 512, "dropout": 0.1}

# name, group, description, model overrides, recipe overrides, d_k (B only),
# the paper's row (its own values of the varied setting), paper PPL, paper BLEU.
ROWS = [
    ("base", "", "base", {}, {}, None, "base", 4.92, 25.8),
    ("A_h1", "(A)", "h=1, d_k=128", {"n_heads": 1}, {}, None, "h=1, d_k=512", 5.29, 24.9),
    ("A_h4", "(A)", "h=4, d_k=32", {"n_heads": 4}, {}, None, "h=4, d_k=128", 5.00, 25.5),
    ("A_h16", "(A)", "h=16, d_k=8", {"n_heads": 16}, {}, None, "h=16, d_k=32", 4.91, 25.8),
    ("B_dk4", "(B)", "d_k=4 (d_v=16)", {}, {}, 4, "d_k=16", 5.16, 25.1),
    ("C_N1", "(C)", "N=1", {"n_layers": 1}, {}, None, "N=2", 6.11, 23.7),
    ("C_N4", "(C)", "N=4", {"n_layers": 4}, {}, None, "N=8", 4.88, 25.5),
    ("C_d64", "(C)", "d_model=64, d_k=8", {"d_model": 64}, {}, None, "d_model=256", 5.75, 24.5),
    ("C_d256", "(C)", "d_model=256, d_k=32", {"d_model": 256}, {}, None, "d_model=1024", 4.66,
     26.0),
    ("C_ff256", "(C)", "d_ff=256", {"d_ff": 256}, {}, None, "d_ff=1024", 5.12, 25.4),
    ("C_ff1024", "(C)", "d_ff=1024", {"d_ff": 1024}, {}, None, "d_ff=4096", 4.75, 26.2),
    ("D_drop0", "(D)", "P_drop=0.0", {"dropout": 0.0}, {}, None, "P_drop=0.0", 5.77, 24.6),
    ("D_ls0", "(D)", "eps_ls=0.0", {}, {"label_smoothing": 0.0}, None, "eps_ls=0.0", 4.67, 25.3),
    ("E_learned", "(E)", "learned positions", {"learned_positions": True}, {}, None,
     "positional embedding", 4.92, 25.7),
]  # fmt: skip
OPTIONAL_ROWS = [
    ("A_h32", "(A)", "h=32, d_k=4", {"n_heads": 32}, {}, None, "h=32, d_k=16", 5.01, 25.4),
    ("B_dk8", "(B)", "d_k=8 (d_v=16)", {}, {}, 8, "d_k=32", 5.01, 25.4),
    ("D_drop02", "(D)", "P_drop=0.2", {"dropout": 0.2}, {}, None, "P_drop=0.2", 4.95, 25.5),
    ("D_ls02", "(D)", "eps_ls=0.2", {}, {"label_smoothing": 0.2}, None, "eps_ls=0.2", 5.47, 25.7),
]  # fmt: skip


def reduce_key_size(model: torch.nn.Module, d_k: int) -> int:
    """Row (B): keep only the first ``d_k`` query/key features of every head (see the
    module docstring). Returns the number of parameters masked away."""
    masked = 0
    for module in model.modules():
        if not isinstance(module, MultiHeadAttention):
            continue
        d, dh = module.d_model, module.d_k
        keep = torch.ones(3 * d)
        for block in (0, 1):  # W^Q, W^K; W^V keeps d_v = d_model / h
            for head in range(module.n_heads):
                start = block * d + head * dh
                keep[start + d_k : start + dh] = 0.0
        weight, bias = module.in_proj.weight, module.in_proj.bias
        with torch.no_grad():
            weight[:d] *= (dh / d_k) ** 0.5  # initial logits as with 1/sqrt(d_k)
            weight.mul_(keep[:, None])
            bias.mul_(keep)
        weight.register_hook(lambda g, k=keep[:, None]: g * k)
        bias.register_hook(lambda g, k=keep: g * k)
        masked += int((keep == 0).sum()) * (d + 1)
    return masked


def run_row(row, args, data: Path) -> dict:
    name, _, _, model_over, recipe_over, d_k, *_ = row
    files = {
        "train_src": data / "train.de.gz",
        "train_tgt": data / "train.en.gz",
        "valid_src": data / "val.de.gz",
        "valid_tgt": data / "val.en.gz",
    }
    settings = {
        **{k: str(v) for k, v in files.items()},
        "max_tokens": args.max_tokens,
        "max_steps": args.steps,
        "warmup": args.warmup,
        "lr_scale": args.lr_scale,
        "valid_every_steps": 10**9,  # validate once, at the stop
        "time_limit_minutes": 0,
        "save_every_steps": 0,
        "keep_last": 1,
        "threads": 1,
        "valid_beam": 1,
        "seed": 1,
        **recipe_over,
    }
    overrides = [f"{k}={v}" for k, v in settings.items()]
    overrides += [f"model.{k}={v}" for k, v in {**BASE, **model_over}.items()]
    recipe = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml", overrides)
    out = Path(args.out) / name
    shutil.rmtree(out, ignore_errors=True)
    trainer = Trainer(recipe, out, log=lambda *a: None)
    params = trainer.model.num_parameters()
    if d_k is not None:
        params -= reduce_key_size(trainer.model, d_k)
    t0 = time.perf_counter()
    trainer.train(progress=False)
    seconds = time.perf_counter() - t0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    valid = [x for x in records if x["kind"] == "valid"][-1]
    train = [x for x in records if x["kind"] == "train"]
    return {
        "row": name,
        "parameters": params,
        "updates": trainer.step,
        "val_ppl": round(valid["ppl"], 2),
        "val_bleu": round(valid["bleu"], 2),
        "train_nll_last10": round(sum(x["nll"] for x in train[-10:]) / len(train[-10:]), 3),
        "seconds": round(seconds, 1),
    }


def table(results: dict, rows) -> str:
    head = (
        "| row | ours | params | val PPL | val BLEU | paper's row | paper PPL | paper BLEU |\n"
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |\n"
    )
    body = []
    for name, group, ours, *_, paper, ppl, bleu in rows:
        if name not in results:
            continue
        r = results[name]
        body.append(
            f"| {group or 'base'} | {ours} | {r['parameters'] / 1e6:.2f}M | {r['val_ppl']:.2f} "
            f"| {r['val_bleu']:.2f} | {paper} | {ppl:.2f} | {bleu:.1f} |"
        )
    return head + "\n".join(body) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/table3-mini")
    parser.add_argument("--rows", nargs="*", help="row names (default: every main row)")
    parser.add_argument("--all", action="store_true", help="also h=32, d_k=8, 0.2 rows")
    parser.add_argument("--steps", type=int, default=300, help="updates per row")
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--lr-scale", type=float, default=0.5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = multi30k_dir() or pair_files("multi30k/de-en")["train_src"].parent
    every = ROWS + OPTIONAL_ROWS
    chosen = [r for r in every if r[0] in args.rows] if args.rows else ROWS
    if args.all and not args.rows:
        chosen = every
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    budget = {k: getattr(args, k) for k in ("steps", "max_tokens", "warmup", "lr_scale")}
    for row in chosen:
        result = run_row(row, args, data)
        results[row[0]] = {**result, "budget": budget}
        print(json.dumps(results[row[0]]), flush=True)
        results_path.write_text(json.dumps(results, indent=2) + "\n")
    (out / "table3_mini.md").write_text(table(results, every))
    print(table(results, every))


if __name__ == "__main__":
    main()
