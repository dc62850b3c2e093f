"""Train on Multi30k with the shipped recipe, then score test2016 with beam search.

    python benchmarks/multi30k_bleu.py --pair de-en --out runs/bench-de-en

Steps: `aiayn train` (recipe's 55-minute limit), average the last 5 kept checkpoints
(epoch ones, and timed ones where the recipe saves every few minutes), choose the
checkpoint (best / last / averaged) and the length penalty on *val*, then translate
test2016 once with beam 4 and report sacreBLEU (and our own BLEU beside it). With
``--val-only`` (screening recipes) test2016 is not decoded at all. ``--max-len-a`` and
``--max-len-b`` set the length rule of every decode (default the library's, source + 50);
``--skip-train --results NAME`` chooses again for an existing run, under another rule,
without touching its results.json. Writes OUT/results.json (or OUT/NAME).
Data: any Multi30k pair (``--pair fr-en``, ``en-cs``, ...; ``--direction`` is the old
name), from $AIAYN_MULTI30K or ../shared/data/multi30k when they hold it, else from the
cache of `aiayn data get multi30k` (fetched when missing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from aiayn.checkpoint import epoch_checkpoints, load_model, save_checkpoint
from aiayn.data.corpus import read_lines
from aiayn.data.datasets import pair_files
from aiayn.metrics import corpus_bleu
from aiayn.train.averaging import average_checkpoints
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer
from aiayn.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
sys.path.insert(0, str(ROOT))
from benchmarks.speed.common import cpu_name  # noqa: E402
from sample_data import multi30k_dir  # noqa: E402


def multi30k_files(src: str, tgt: str) -> dict[str, Path]:
    """train/valid/test src and tgt files of a Multi30k pair: from the folder the tests
    use ($AIAYN_MULTI30K, ../shared/data/multi30k, the cache) when it has that pair, else
    from the cache of `aiayn data get multi30k`, fetching what it lacks."""
    data = multi30k_dir()
    stems = {"train": "train", "valid": "val", "test": "test2016"}
    files = {
        f"{role}_{side}": (data or Path()) / f"{stem}.{lang}.gz"
        for role, stem in stems.items()
        for side, lang in (("src", src), ("tgt", tgt))
    }
    if data is not None and all(f.is_file() for f in files.values()):
        return files
    return pair_files(f"multi30k/{src}-{tgt}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--pair", "--direction", dest="direction", default="de-en",
        help="SRC-TGT of Multi30k's cs, de, en, fr (de-en, en-de, fr-en, en-cs, ...)",
    )  # fmt: skip
    parser.add_argument("--out", required=True)
    parser.add_argument("--recipe", default=str(ROOT / "recipes/multi30k.yaml"))
    parser.add_argument("--set", nargs="*", default=[], help="recipe overrides")
    parser.add_argument("--skip-train", action="store_true", help="evaluate an existing run")
    parser.add_argument("--alphas", default="0.6,1.0,1.5", help="length penalties tried on val")
    parser.add_argument("--average", type=int, default=5, help="checkpoints averaged")
    parser.add_argument("--val-only", action="store_true", help="choose on val, no test2016")
    parser.add_argument("--max-len-a", type=float, help="outputs <= a * source + b tokens")
    parser.add_argument("--max-len-b", type=int, help="(default: the library's, a=1 b=50)")
    parser.add_argument("--results", default="results.json", help="file name in --out")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    src, tgt = args.direction.split("-")
    files = multi30k_files(src, tgt)
    given = [f"{k}={v}" for k, v in files.items() if not k.startswith("test")]
    recipe = Recipe.from_yaml(args.recipe, given + args.set)
    out = Path(args.out)

    t0 = time.perf_counter()
    if not args.skip_train:
        trainer = Trainer(recipe, out, resume=(out / "checkpoint_last.pt").exists())
        result = trainer.train(progress=False)
        train_minutes = result.seconds / 60
        n_params = trainer.model.num_parameters()
    else:
        train_minutes, n_params = float("nan"), None
    kept = epoch_checkpoints(out)[-args.average :]
    save_checkpoint(average_checkpoints(kept), out / "checkpoint_averaged.pt")
    run = run_figures(out)

    # The length rule of every decode below; None keeps the model's (the Translator's
    # settings ignore None, as DecodeOptions.replace does).
    rule = {"max_len_a": args.max_len_a, "max_len_b": args.max_len_b}
    val_src, val_ref = read_lines(files["valid_src"]), read_lines(files["valid_tgt"])
    choices = []
    for name in ("averaged", "best", "last"):
        model, tok = load_model(out / f"checkpoint_{name}.pt", device)
        n_params = n_params or model.num_parameters()
        translator = Translator(model, tok)
        for alpha in [float(a) for a in args.alphas.split(",")]:
            hyps = [h[0] for h in translator.translate(val_src, beam=4, alpha=alpha, **rule)]
            score = sacrebleu.corpus_bleu(hyps, [val_ref]).score
            print(f"val: checkpoint {name}, beam 4, alpha {alpha}: BLEU {score:.2f}", flush=True)
            choices.append((score, name, alpha))
    val_bleu, name, alpha = max(choices)
    results = {
        "direction": args.direction,
        "recipe": args.recipe,
        "overrides": args.set,
        "parameters": n_params,
        "train_minutes": round(train_minutes, 1),
        "host": host(recipe.threads or torch.get_num_threads()),
        **run,
        "averaged": [p.name for p in kept],
        "val_choices": [{"checkpoint": n, "alpha": a, "bleu": round(b, 2)} for b, n, a in choices],
        "chosen_on_val": {"checkpoint": name, "alpha": alpha, "val_bleu": round(val_bleu, 2)},
        "length_rule": rule,
    }
    if args.val_only:
        (out / args.results).write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(results, indent=2))
        return

    test_src, test_ref = read_lines(files["test_src"]), read_lines(files["test_tgt"])
    translator = Translator(*load_model(out / f"checkpoint_{name}.pt", device))
    t1 = time.perf_counter()
    hyps = [h[0] for h in translator.translate(test_src, beam=4, alpha=alpha, **rule)]
    decode_s = time.perf_counter() - t1
    stem = "" if args.results == "results.json" else f".{Path(args.results).stem}"
    (out / f"test2016{stem}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    metric = sacrebleu.BLEU()
    sacre = metric.corpus_score(hyps, [test_ref])
    ours = corpus_bleu(hyps, test_ref)
    results |= {
        "test2016_sacrebleu": round(sacre.score, 2),
        "test2016_sacrebleu_signature": str(metric.get_signature()),
        "test2016_ours": round(ours.score, 2),
        "test2016_decode_seconds_beam4": round(decode_s, 1),
        "wall_minutes_total": round((time.perf_counter() - t0) / 60, 1),
    }
    (out / args.results).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def host(threads: int) -> dict:
    """What the machine was: a 55-minute budget buys as many updates as its speed allows."""
    return {"cpu": cpu_name(), "threads": threads, "torch": torch.__version__}


def run_figures(out: Path) -> dict:
    """Updates, epochs and target tokens/s of the run, from its metrics.jsonl."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    speed = [r["tokens_per_s"] for r in records if r["kind"] == "speed"]
    valid = [round(r["bleu"], 2) for r in records if r["kind"] == "valid"]
    return {
        "updates": train[-1]["step"] if train else 0,
        "epochs": train[-1]["epoch"] if train else 0,
        "target_tokens_per_s": round(sorted(speed)[len(speed) // 2]) if speed else None,
        "valid_bleu_greedy": valid,
    }


if __name__ == "__main__":
    main()
