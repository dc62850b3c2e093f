"""Phase 4: peak memory, one spawned child process per (phase, system), VmHWM of that
process over a baseline taken after a tiny-model run of the same code."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from pathlib import Path
from queue import Empty

import torch
from torch import Tensor

from aiayn.config import TransformerConfig
from aiayn.data import PAD_ID, Tokenizer, collate
from aiayn.model.transformer import Transformer

from .common import MARIAN, OURS, TORCH_NN, load_model, peak_rss_mib, rss_mib, sync
from .context import RunContext
from .ct2 import ct2_compute_type, ct2_vocabulary
from .data import Setup
from .peers import build_marian, build_peer, train_step
from .results import MemoryResult, MemoryRow, TranslateResult
from .translate import translate_ct2, translate_marian, translate_ours


def memory_child(job: dict, queue) -> None:
    """Runs in a fresh interpreter (spawn); reports VmHWM after one phase's work. A tiny
    model runs the same code first, so that the baseline already holds the library code
    and kernels that get paged in on first use, and "over baseline" is the work's own."""
    try:
        torch.set_num_threads(job["threads"])
        device = torch.device(job["device"])
        cfg = TransformerConfig.from_dict(job["cfg"])
        tiny = TransformerConfig.from_dict(
            {**job["cfg"], "d_model": 2 * cfg.n_heads, "d_ff": 8, "n_layers": 1}
            | {"n_encoder_layers": None, "n_decoder_layers": None}
        )
        tokenizer = Tokenizer.from_bytes(job["tokenizer"])
        if job["system"] == MARIAN or job.get("ct2_dir"):
            import transformers  # noqa: F401  (same imports as the timed run of that system)
        if job.get("ct2_dir"):
            import ctranslate2
        system, lines, beam = job["system"], job.get("lines"), job.get("beam")
        if job["phase"] == "train":
            batches = [collate(s, t).to(device) for s, t in job["batches"]]
            src, tgt = job["batches"][0]
            for c, work in ((tiny, [collate(src[:2], tgt[:2]).to(device)]), (cfg, batches)):
                if c is cfg:
                    base = rss_mib()
                peer, opt = build_peer(system, c, device)
                for batch in work:
                    # fp32: a spawned child never saw --precision (the script's module-level
                    # flag started False in it), so these rows have always been fp32
                    train_step(peer, opt, batch, device, bf16=False)
                del peer, opt
        elif system == OURS:
            translate_ours(Transformer(tiny).to(device), tokenizer, lines[:2], beam, device)
            base = rss_mib()
            model, _ = load_model(job["checkpoint"], device)
            translate_ours(model, tokenizer, lines, beam, device)
        elif system == MARIAN:
            mt = build_marian(tiny, device).eval()
            translate_marian(mt, tokenizer, tiny, lines[:2], beam, [5], device)
            del mt
            base = rss_mib()
            mt = build_marian(cfg, device).eval()
            translate_marian(mt, tokenizer, cfg, lines, beam, job["steps"], device)
        else:  # CTranslate2: no tiny model to warm up with; loading is part of the work
            base = rss_mib()
            path = Path(job["ct2_dir"])
            translator = ctranslate2.Translator(
                str(path),
                device=device.type,
                compute_type=job["compute_type"],
                intra_threads=job["threads"],
            )
            vocab = ct2_vocabulary(path, tokenizer)
            translate_ct2(translator, vocab, tokenizer, cfg, lines, beam)
        sync(device)
        result = {"baseline_mib": base, "peak_mib": peak_rss_mib()}
        if device.type == "cuda":
            result["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        queue.put(result)
    except Exception as e:  # report, do not hang the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})


def bench_memory(setup: Setup, ctx: RunContext, translate: TranslateResult | None) -> MemoryResult:
    """``translate``: phase 2's result, whose CTranslate2 exports get a row each."""
    plan, log = ctx.plan, ctx.log
    spawn = mp.get_context("spawn")
    base_job = {
        "threads": ctx.threads,
        "device": ctx.device.type,
        "cfg": setup.cfg.to_dict(),
        "tokenizer": setup.tokenizer.to_bytes(),
    }
    # Training: the largest batches of the timed run (peak follows the batch shape).
    by_size = sorted(setup.batches, key=lambda b: b.src.numel() + b.tgt_in.numel())[-2:]
    train_batches = [(unpad(b.src), unpad(b.tgt_in, drop_first=True)) for b in by_size]
    lines = setup.test_src[: plan.memory_sentences]
    device = ctx.device
    model, _ = load_model(setup.checkpoint, device)
    _, steps = translate_ours(model, setup.tokenizer, lines, 4, device)
    del model
    jobs = [
        {"phase": "train", "system": s, "batches": train_batches} for s in (OURS, TORCH_NN, MARIAN)
    ]
    tr = {"lines": lines, "beam": 4}
    jobs += [
        {"phase": "translate (beam 4)", "system": OURS, "checkpoint": str(setup.checkpoint), **tr},
        {"phase": "translate (beam 4)", "system": MARIAN, "steps": steps, **tr},
    ]
    for name, path in (translate.ct2_dirs if translate else {}).items():
        compute = ct2_compute_type(name, device)
        jobs.append(
            {
                "phase": "translate (beam 4)",
                "system": f"CTranslate2 {compute} (our model)",
                "ct2_dir": path,
                "compute_type": compute,
                **tr,
            }
        )
    rows = []
    for job in jobs:
        queue = spawn.Queue()
        proc = spawn.Process(target=memory_child, args=({**base_job, **job}, queue))
        proc.start()
        result = None
        while result is None:
            try:
                result = queue.get(timeout=2)
            except Empty:
                if not proc.is_alive():  # died without a word (killed for memory, say)
                    with contextlib.suppress(Empty):
                        result = queue.get(timeout=2)
                    result = result or {"error": f"child exited with code {proc.exitcode}"}
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        if "error" in result:
            row = MemoryRow(phase=job["phase"], system=job["system"], error=result["error"])
            log(f"memory {job['phase']} / {job['system']}: {result['error']}")
        else:
            row = MemoryRow(
                phase=job["phase"],
                system=job["system"],
                **{k: round(v, 1) for k, v in result.items()},
                work_mib=round(result["peak_mib"] - result["baseline_mib"], 1),
            )
            log(
                f"memory {job['phase']} / {job['system']}: peak {row.peak_mib:.0f} MiB "
                f"({row.work_mib:+.0f} over baseline)"
            )
        rows.append(row)
    return MemoryResult(
        method=(
            "one spawned child process per row; peak = VmHWM (peak RSS) of that process; "
            "baseline = its RSS after imports and a tiny-model run of the same code, before "
            "building the real model (CTranslate2: before loading); training rows run the 2 "
            f"largest batches of the timed set, translation rows {len(lines)} test sentences"
        ),
        rows=rows,
    )


def unpad(ids: Tensor, drop_first: bool = False) -> list[list[int]]:
    """Rows of a padded id tensor back to lists (pad 0 never occurs inside a sentence)."""
    rows = [[t for t in row if t != PAD_ID] for row in ids.tolist()]
    return [r[1:] for r in rows] if drop_first else rows
