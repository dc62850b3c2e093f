"""One command for a lent GPU (issue 43): the training step's MFU, tokens/s and peak memory,
the real training loop's tokens/s, and decoding speed. Prints each figure as it comes and
writes them all as JSON.

    PYTHONPATH=src python benchmarks/gpu_check.py --out gpu_check.json
    PYTHONPATH=src python benchmarks/gpu_check.py --device cpu --tiny   # smoke run, seconds

Runs from a checkout on a machine with no network where aiayn is not installed (it puts
the checkout's src/ on the path itself); it says plainly which module is missing. Parts:

1. ``step``: one training update (forward, backward, AdamW) of Table 3's base and big
   models, one shared 37k vocabulary, on a paper-sized batch (900 sentences of 17-30
   tokens, about 21k target tokens): aiayn eager, aiayn compiled (the trainer's
   ``Updater``: padded to a length bucket, inductor) and torch.nn.Transformer eager with
   the same embeddings, projection and loss. FLOPs of one update by
   ``torch.utils.flop_counter.FlopCounterMode``; MFU against the card's dense bf16 peak.
2. ``train``: ``aiayn train`` on the Multi30k recipe (``--data``, else ../shared/data/
   multi30k, else the built-in sample) for ``--updates`` updates, eager then compiled:
   tokens/s over all updates and over the last third (after the compilations).
3. ``decode``: greedy and beam-4 sentences/s on test2016 with the compiled run's model.

A part that has not begun after ``--budget-s`` seconds (270) is skipped, and named in the
JSON under ``skipped_out_of_time``; a part once begun runs to its end. On an H200 the step
part took about 200 s when each length compiled a graph of its own (84 s base, 71 s big);
one graph for all lengths compiles about 1.8x longer (115 s base), so it may now take
300 s or more: give each part a call of its own on a lent device (``--parts step``, then
``--parts train,decode``), with ``--budget-s`` to match.

The device's defaults apply where the recipe leaves them unset: on CUDA bf16 autocast,
fused AdamW; ``--tiny`` shrinks every model and batch and compiles with dynamo's "eager"
backend (no C++ compiler needed), for the test suite.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NEEDED = {  # module -> what pip calls it
    "torch": "torch",
    "numpy": "numpy",
    "sentencepiece": "sentencepiece",
    "sacrebleu": "sacrebleu",
    "yaml": "pyyaml",
    "tqdm": "tqdm",
}
# Dense bf16 tensor-core peaks (FLOP/s), from the vendors' data sheets (SXM parts).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def missing_modules() -> list[str]:
    """The modules this check needs that cannot be imported, as pip names them."""
    return [pip for module, pip in NEEDED.items() if importlib.util.find_spec(module) is None]


def preflight() -> None:
    """Exit with a plain message unless torch and the rest, and aiayn from this checkout,
    can be imported."""
    missing = missing_modules()
    if missing:
        sys.exit(
            f"gpu_check: missing Python module(s): {', '.join(missing)}. Install them "
            f"(pip install {' '.join(missing)}) or run in the environment that has them."
        )
    if importlib.util.find_spec("aiayn") is None:
        sys.path.insert(0, str(ROOT / "src"))
    if importlib.util.find_spec("aiayn") is None:
        sys.exit(f"gpu_check: aiayn is not importable; run from a checkout ({ROOT}/src missing)")
    sys.path.insert(0, str(ROOT / "tests"))  # the data locator, test support
    sys.path.insert(0, str(ROOT))


def peak_flops(device: Any) -> float | None:
    """The dense bf16 peak of ``device`` when it is a known GPU, else None."""
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


class Timer:
    """Wall time of a block, synchronising the device first and last; peak memory too
    (CUDA: allocated bytes; CPU: the process's resident high-water mark above its start)."""

    def __init__(self, device: Any):
        self.device = device

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __enter__(self) -> Timer:
        import torch

        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        self.sync()
        self.seconds = time.perf_counter() - self.start
        cuda = self.device.type == "cuda"
        self.peak_mib = torch.cuda.max_memory_allocated(self.device) / 2**20 if cuda else None


def paper_batch(vocab: int, rows: int, lengths: tuple[int, int], seed: int = 0):
    """``rows`` random sentence pairs with source and target lengths drawn from
    ``lengths`` (inclusive), collated as the trainer's batches are."""
    import torch

    from aiayn.data.batching import collate

    g = torch.Generator().manual_seed(seed)
    low, high = lengths
    n = torch.randint(low, high + 1, (2, rows), generator=g)
    src = [torch.randint(4, vocab, (int(k),), generator=g).tolist() for k in n[0]]
    tgt = [torch.randint(4, vocab, (int(k),), generator=g).tolist() for k in n[1]]
    return collate(src, tgt)


def step_figures(args: argparse.Namespace, device: Any, log: Callable[[str], None]) -> list[dict]:
    """Part 1: one update of base and big, aiayn eager and compiled, torch.nn.Transformer."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from aiayn.config import TransformerConfig
    from aiayn.distributed import World
    from aiayn.model.transformer import Transformer
    from aiayn.train.optim import make_optimizer
    from aiayn.train.recipe import Recipe, step_settings
    from aiayn.train.schedule import NoamSchedule
    from aiayn.train.update import Updater
    from benchmarks.speed.peers import build_peer, train_step

    vocab, rows, lengths = (64, 8, (5, 12)) if args.tiny else (37000, 900, (17, 30))
    batch = paper_batch(vocab, rows, lengths).to(device)
    precision = step_settings(Recipe(), device.type)["precision"]
    peak = peak_flops(device)
    out = []
    for size in ("base", "big"):
        tiny = dict(d_model=32, n_heads=4, d_ff=64, n_layers=1) if args.tiny else {}
        cfg = getattr(TransformerConfig, size)(vocab, max_len=256, **tiny)

        def updater(compile: bool, cfg: TransformerConfig = cfg) -> Updater:
            torch.manual_seed(1)
            model = Transformer(cfg).to(device).train()
            optimizer = make_optimizer(model)
            schedule = NoamSchedule(optimizer, cfg.d_model, 4000)
            return Updater(
                model, optimizer, schedule, World(), precision=precision, compile=compile
            )

        eager, compiled = updater(False), updater(True)
        peer, peer_optimizer = build_peer("torch.nn.Transformer", cfg, device)
        bf16 = precision == "bf16"
        systems: dict[str, Callable[[], object]] = {
            "aiayn eager": partial(eager.update, [batch]),
            "aiayn compiled": partial(compiled.update, [batch]),
            "torch.nn.Transformer eager": partial(
                train_step, peer, peer_optimizer, batch, device, bf16
            ),
        }
        useful = 0  # FLOPs of one eager update: compiled code runs kernels no mode counts
        for name, step in systems.items():
            with Timer(device) as warm:
                for _ in range(args.warmup):
                    step()  # the compiled step compiles here
            if "eager" in name:  # aiayn's first; the compiled one does the same work
                with FlopCounterMode(display=False) as counter:
                    step()
                useful = counter.get_total_flops()
            with Timer(device) as timed:
                for _ in range(args.steps):
                    step()
            per_step = timed.seconds / args.steps
            achieved = useful / per_step
            row = {
                "model": size,
                "system": name,
                "precision": precision,
                "ms_per_step": round(per_step * 1e3, 2),
                "target_tokens_per_s": round(batch.n_tgt_tokens / per_step, 1),
                "gflop_per_step": round(useful / 1e9, 3),
                "mfu": round(achieved / peak, 4) if peak else None,
                "peak_memory_mib": round(timed.peak_mib, 1) if timed.peak_mib else None,
                "warmup_s": round(warm.seconds, 2),
            }
            out.append(row)
            log(json.dumps(row))
        del systems, eager, compiled, peer, peer_optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def data_files(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """Train, valid and test2016 files: Multi30k where found, else the built-in sample."""
    from sample_data import multi30k_dir, write_sample

    folder = args.data or (None if args.tiny else multi30k_dir())
    if folder is not None:
        split = {"train": "train", "val": "val", "test": "test2016"}
        langs = ("de", "en")
        return {
            f"{k}.{lang}": folder / f"{v}.{lang}.gz" for k, v in split.items() for lang in langs
        }
    return write_sample(work / "sample")


def train_figures(
    args: argparse.Namespace, device: Any, work: Path, log: Callable[[str], None]
) -> tuple[list[dict], Path]:
    """Part 2: the real trainer on the Multi30k recipe, eager then compiled."""
    from aiayn.train.recipe import Recipe
    from aiayn.train.trainer import Trainer
    from aiayn.train.update import compiled_graphs

    files = data_files(args, work)
    if "sample" in files["train.de"].parts and not args.tiny:
        log("gpu_check: no Multi30k (give --data DIR): the built-in sample of 50 pairs trains")
    out, last = [], work
    for compile in (False, True):
        recipe = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml")
        recipe.override(
            [f"{k}={files[v]}" for k, v in (("train_src", "train.de"), ("train_tgt", "train.en"),
                                             ("valid_src", "val.de"), ("valid_tgt", "val.en"))]
            + [f"max_steps={args.updates}", "time_limit_minutes=0", "save_every_minutes=0",
               f"save_every_steps={args.updates}", f"device={device.type}", "threads=0",
               f"compile={str(compile).lower()}", "log_every=1", "schedule=noam"]
        )  # fmt: skip
        if args.tiny:
            small = ["model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.n_layers=1"]
            recipe.override([*small, "max_tokens=200"])
        if "sample" in files["train.de"].parts:  # 50 pairs hold no 8000-piece vocabulary
            recipe.override(["vocab_size=300"])
        run = work / ("train_compiled" if compile else "train_eager")
        start, graphs = time.perf_counter(), compiled_graphs()
        trainer = Trainer(recipe, run, log=lambda _line: None)
        trainer.train(progress=False)
        seconds = time.perf_counter() - start
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r.get("kind") == "train"]
        tail = steps[len(steps) * 2 // 3 :]  # the last third: compilations are behind
        row = {
            "system": "aiayn train, compiled" if compile else "aiayn train, eager",
            "updates": len(steps),
            "tokens_per_s": round(_rate(steps), 1),
            "tokens_per_s_last_third": round(_rate(tail), 1),
            "first_update_s": steps[0]["seconds"] if steps else None,  # compiling, if compiled
            "graphs": compiled_graphs() - graphs,
            "wall_s": round(seconds, 1),
        }
        out.append(row)
        log(json.dumps(row))
        last = run
    return out, last


def _rate(steps: list[dict]) -> float:
    """Target tokens per second over the train records ``steps`` (seconds is cumulative)."""
    if len(steps) < 2:
        return math.nan
    seconds = steps[-1]["seconds"] - steps[0]["seconds"]
    return sum(r["tokens"] for r in steps[1:]) / max(seconds, 1e-9)


def decode_figures(
    args: argparse.Namespace, device: Any, run: Path, work: Path, log: Callable[[str], None]
) -> list[dict]:
    """Part 3: greedy and beam-4 sentences/s on test2016 with the trained model."""
    import gzip

    from aiayn.translator import Translator

    path = data_files(args, work)["test.de"]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    translator = Translator.from_dir(run, "last", device=device.type)
    out = []
    for beam in (1, 4):
        translator.translate(lines[:8], beam=beam)  # warm-up
        with Timer(device) as timed:
            translator.translate(lines, beam=beam)
        row = {
            "decode": "greedy" if beam == 1 else f"beam {beam}",
            "sentences": len(lines),
            "sentences_per_s": round(len(lines) / timed.seconds, 1),
        }
        out.append(row)
        log(json.dumps(row))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--work", type=Path, default=Path("gpu_check_work"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="smoke run: tiny models, seconds")
    parser.add_argument("--data", type=Path, default=None, help="the Multi30k folder")
    parser.add_argument("--updates", type=int, default=None, help="of the train loop (300)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per system (10)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (3)")
    parser.add_argument("--parts", default="step,train,decode")
    parser.add_argument(
        "--budget-s", type=float, default=270.0, help="parts not begun by then are skipped"
    )
    args = parser.parse_args(argv)
    args.updates = args.updates or (4 if args.tiny else 300)
    args.steps = args.steps or (1 if args.tiny else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    preflight()
    import torch

    from aiayn.train import update

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here (torch.cuda.is_available() is False); "
                 "use --device cpu --tiny for a smoke run")  # fmt: skip
    device = torch.device(args.device)
    args.work.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, flush=True)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "tiny": args.tiny,
        "peak_bf16_flops": peak_flops(device),
    }
    log(json.dumps(report))
    parts = args.parts.split(",")
    start = time.perf_counter()
    backend = update.COMPILE_BACKEND
    if args.tiny:  # trace only: the test suite has no time for inductor's C++
        update.COMPILE_BACKEND = "eager"

    def time_left(part: str) -> bool:
        """Whether ``part`` may start: not once the budget is spent (it is then named)."""
        if time.perf_counter() - start < args.budget_s:
            return True
        report.setdefault("skipped_out_of_time", []).append(part)
        log(f"gpu_check: {args.budget_s} s spent; {part} skipped")
        return False

    try:
        if "step" in parts:
            report["step"] = step_figures(args, device, log)
        run = None
        if "train" in parts and time_left("train"):
            report["train"], run = train_figures(args, device, args.work, log)
        if "decode" in parts and run is not None and time_left("decode"):
            report["decode"] = decode_figures(args, device, run, args.work, log)
    finally:
        update.COMPILE_BACKEND = backend
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    log(f"gpu_check: {report['seconds']} s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
