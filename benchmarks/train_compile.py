"""Training tokens/s: `compile: true` against eager aiayn and eager torch.nn.Transformer,
on the same batches, interleaved round by round in one process.

    python benchmarks/train_compile.py --work /tmp/bench12 [--threads 2] [--rounds 5]

Data: Multi30k de-en train (../shared/data/multi30k or $AIAYN_MULTI30K; the built-in sample
otherwise), prepared with the Multi30k recipe's vocabulary (8000 joint BPE) into WORK; the
model is the recipe's (d_model 256, 3+3 layers, 7.6M parameters, dropout 0.1). The batches
are the first ones of epoch 1's plan (max_tokens 3300). Each system makes the same updates:
ours through :class:`aiayn.train.update.Updater` (the trainer's step; compiled: inductor,
lengths padded to aiayn.data.batching.BUCKETS, row count and length dynamic),
torch.nn.Transformer
through the speed benchmark's peer (same embeddings, positions, masks, loss, Adam).
Writes WORK/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
sys.path.insert(0, str(ROOT))
from aiayn.config import TransformerConfig  # noqa: E402
from aiayn.data.prepared import prepare  # noqa: E402
from aiayn.data.shards import MANIFEST, PreparedData  # noqa: E402
from aiayn.distributed import World  # noqa: E402
from aiayn.model.transformer import Transformer  # noqa: E402
from aiayn.train.recipe import Recipe  # noqa: E402
from aiayn.train.schedule import NoamSchedule  # noqa: E402
from aiayn.train.update import Updater, compiled_graphs  # noqa: E402
from benchmarks.speed.peers import build_peer, train_step  # noqa: E402
from sample_data import multi30k_dir, write_sample  # noqa: E402

EAGER, COMPILED, TORCH_NN = "aiayn eager", "aiayn compile", "torch.nn.Transformer"


def prepared(work: Path, recipe: Recipe) -> PreparedData:
    out = work / "data"
    if not (out / MANIFEST).is_file():
        data = multi30k_dir()
        if data is not None:
            train = (data / "train.de.gz", data / "train.en.gz")
            valid = (data / "val.de.gz", data / "val.en.gz")
        else:
            paths = write_sample(work / "sample")
            train = (paths["train.de"], paths["train.en"])
            valid = (paths["val.de"], paths["val.en"])
        prepare(train, valid, out, vocab_size=recipe.vocab_size, show_progress=False)
    return PreparedData(out)


def ours(cfg: TransformerConfig, recipe: Recipe, compile: bool) -> Updater:
    torch.manual_seed(1)
    model = Transformer(cfg).train()
    optimizer = torch.optim.Adam(model.parameters(), betas=recipe.adam_betas, eps=recipe.adam_eps)
    schedule = NoamSchedule(optimizer, cfg.d_model, recipe.warmup)
    return Updater(model, optimizer, schedule, World(), compile=compile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--warmup-steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    recipe = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml")
    data = prepared(args.work, recipe)
    V = data.tokenizer.vocab_size
    cfg = TransformerConfig.from_dict({**recipe.model, "src_vocab_size": V, "tgt_vocab_size": V})
    plan = data.train.plan(recipe.max_tokens, recipe.seed, 0, cfg.max_len)
    n = args.warmup_steps + args.rounds * args.steps_per_round
    batches = [data.train.batch(index) for index in plan[:n]]
    warm, timed = batches[: args.warmup_steps], batches[args.warmup_steps :]

    updaters = {EAGER: ours(cfg, recipe, False), COMPILED: ours(cfg, recipe, True)}
    peer, peer_optimizer = build_peer("torch.nn.Transformer", cfg, torch.device("cpu"))

    def step(name: str, batch) -> None:
        if name == TORCH_NN:
            train_step(peer, peer_optimizer, batch, torch.device("cpu"), False)
        else:
            updaters[name].update([batch])

    names = [EAGER, COMPILED, TORCH_NN]
    warmup_s = {}
    for name in names:
        t0 = time.perf_counter()
        for batch in warm:  # the compiled step compiles here (first shapes, then dynamic)
            step(name, batch)
        warmup_s[name] = round(time.perf_counter() - t0, 1)
        print(f"{name}: warm-up {warmup_s[name]} s", flush=True)
    graphs_after_warmup = compiled_graphs()

    rates: dict[str, list[float]] = {name: [] for name in names}
    k = args.steps_per_round
    for r in range(args.rounds):
        chunk = timed[r * k : (r + 1) * k]
        tokens = sum(b.n_tgt_tokens for b in chunk)
        for name in names:  # A, B, C, A, B, C, ...: the machine's noise hits all alike
            t0 = time.perf_counter()
            for batch in chunk:
                step(name, batch)
            rates[name].append(tokens / (time.perf_counter() - t0))
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}" for n in names), flush=True)

    median = {name: statistics.median(rates[name]) for name in names}
    paired = {
        name: statistics.median(a / b for a, b in zip(rates[COMPILED], rates[name]))
        for name in (EAGER, TORCH_NN)
    }
    results = {
        "threads": args.threads,
        "torch": torch.__version__,
        "model": f"{sum(p.numel() for p in updaters[EAGER].model.parameters()) / 1e6:.1f}M",
        "timed_batches": len(timed),
        "tokens_per_s_median": {k: round(v, 1) for k, v in median.items()},
        "tokens_per_s_rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "compiled_over_eager": round(median[COMPILED] / median[EAGER], 3),
        "compiled_over_torch_nn": round(median[COMPILED] / median[TORCH_NN], 3),
        "eager_over_torch_nn": round(median[EAGER] / median[TORCH_NN], 3),
        "paired_median_compiled_over": {k: round(v, 3) for k, v in paired.items()},
        "warmup_seconds": warmup_s,
        "compiled_graphs_after_warmup": graphs_after_warmup,
        "compiled_graphs_total": compiled_graphs(),
        "distinct_batch_shapes": len({(b.src.shape, b.tgt_in.shape) for b in batches}),
    }
    (args.work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
