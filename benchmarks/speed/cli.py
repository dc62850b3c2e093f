"""Command line: ``python -m benchmarks.speed [options]`` runs the phases and writes
OUT/speed.json and OUT/speed.md; ``python -m benchmarks.speed report --out OUT`` rebuilds
OUT/speed.md from OUT/speed.json."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.model.transformer import Transformer

from . import __doc__ as DOC
from .common import cpu_name, git_commit, version
from .context import FULL, PHASES, QUICK, RunContext
from .data import make_setup
from .growth import bench_growth
from .memory import bench_memory
from .report import markdown, regenerate, write
from .results import Meta, ModelInfo, Report, TrainModelInfo
from .train import bench_train
from .translate import bench_translate

SIZE_OVERRIDES = ("max_tokens", "warmup_steps", "rounds", "steps_per_round", "n_sentences")


def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speed",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--checkpoint", help="trained aiayn checkpoint (BLEU is meaningful)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--threads", type=int, default=2, help="torch / CTranslate2 threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--direction", choices=["de-en", "en-de"], default="de-en")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="every system alike: bf16 autocast in training, bf16 weights in translation "
        "(default: bf16 on a GPU, fp32 on the CPU); CTranslate2 keeps its own compute types",
    )
    parser.add_argument(
        "--no-cudnn-attention",
        action="store_true",
        help="GPU: switch cuDNN's fused attention off for every system (ours never uses it: "
        "it builds a plan per new shape); without this the peers use torch's default",
    )
    parser.add_argument(
        "--train-model",
        choices=["recipe", "base", "big"],
        default="recipe",
        help="sizes for the training phase: the recipe's (or the checkpoint's) model, or "
        "Table 3 base / big with the same vocabulary (random weights; for GPUs)",
    )
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset")
    sizes = parser.add_argument_group("override the sizes of --quick or of the full run")
    for name in SIZE_OVERRIDES:
        sizes.add_argument("--" + name.replace("_", "-"), type=int)
    return parser


def report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speed report",
        description="Rebuild OUT/speed.md from OUT/speed.json; nothing is run.",
    )
    parser.add_argument("--out", default="bench_out", help="folder of a run's speed.json")
    return parser


def context_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RunContext:
    """Checks the command line and applies its process-wide settings (threads, cuDNN)."""
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - set(PHASES)
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU")
    plan = QUICK if args.quick else FULL
    overrides = {k: getattr(args, k) for k in SIZE_OVERRIDES if getattr(args, k) is not None}
    plan = dataclasses.replace(plan, **overrides)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    out = Path(args.out)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    return RunContext(
        plan=plan,
        out=out,
        work=out / "work",
        device=device,
        threads=args.threads,
        bf16=(args.precision or ("bf16" if device.type == "cuda" else "fp32")) == "bf16",
        direction=args.direction,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        quick=args.quick,
        train_model=args.train_model,
        no_cudnn_attention=args.no_cudnn_attention,
        phases=tuple(p for p in PHASES if p in phases),
        log=log,
    )


def run(ctx: RunContext) -> Report:
    """Every phase of ``ctx``; writes OUT/speed.json and OUT/speed.md."""
    ctx.work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    setup = make_setup(ctx)
    cfg = setup.cfg
    meta = Meta(
        cpu=cpu_name(),
        threads=ctx.threads,
        device=ctx.device.type,
        precision=ctx.precision,
        cudnn_attention="off for every system" if ctx.no_cudnn_attention else "default",
        gpu=torch.cuda.get_device_name() if ctx.device.type == "cuda" else None,
        torch=torch.__version__,
        transformers=version("transformers"),
        ctranslate2=version("ctranslate2"),
        python=platform.python_version(),
        commit=git_commit(),
        quick=ctx.quick,
        data=setup.data,
        checkpoint=str(ctx.checkpoint) if ctx.checkpoint else None,
        model=ModelInfo.of(cfg, Transformer(cfg).num_parameters()),
    )
    if setup.train_cfg is not None:
        tc = setup.train_cfg
        meta.train_model = TrainModelInfo.of(ctx.train_model, tc, Transformer(tc).num_parameters())
    report = Report(meta=meta)
    if "train" in ctx.phases:
        report.train = bench_train(setup, ctx)
    if "translate" in ctx.phases:
        report.translate = bench_translate(setup, ctx)
    if "growth" in ctx.phases:
        report.growth = bench_growth(setup, ctx)
    if "memory" in ctx.phases:
        report.memory = bench_memory(setup, ctx, report.translate)
    meta.wall_s = round(time.perf_counter() - t_start, 1)
    write(report, ctx.out)
    ctx.log(f"wrote {ctx.out / 'speed.json'} and {ctx.out / 'speed.md'}")
    return report


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        parser = report_parser()
        args = parser.parse_args(argv[1:])
        if not (Path(args.out) / "speed.json").is_file():
            parser.error(f"no speed.json in {args.out}")
        path = regenerate(Path(args.out))
        print(f"wrote {path}")
        return
    parser = run_parser()
    ctx = context_from_args(parser, parser.parse_args(argv))
    report = run(ctx)
    print()
    print(markdown(report))
