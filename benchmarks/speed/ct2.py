"""CTranslate2 helpers: our model exported (float32, int8), its vocabularies, the compute
types used on each device."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from aiayn.data import Tokenizer

from .context import RunContext
from .data import Setup


def ct2_vocabulary(model_dir: Path, tokenizer: Tokenizer) -> tuple[list[str], list[str]]:
    """Source and target token lists of an exported CTranslate2 model (id order)."""

    def read(name: str) -> list[str] | None:
        if (model_dir / f"{name}.json").is_file():
            return json.loads((model_dir / f"{name}.json").read_text(encoding="utf-8"))
        if (model_dir / f"{name}.txt").is_file():
            return (model_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        return None

    shared = read("shared_vocabulary")
    src, tgt = read("source_vocabulary") or shared, read("target_vocabulary") or shared
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    return src or pieces, tgt or pieces


def export_ct2(setup: Setup, ctx: RunContext) -> dict[str, Path]:
    """Our model exported for CTranslate2, float32 and int8; {} where that is not possible."""
    try:
        from aiayn.export import export_ctranslate2
    except ImportError:
        ctx.log("CTranslate2 export not available (aiayn.export); skipping the CTranslate2 rows")
        return {}
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        ctx.log("ctranslate2 is not installed; skipping the CTranslate2 rows")
        return {}
    exported = {}
    for name in ("float32", "int8"):
        try:
            exported[name] = export_ctranslate2(
                setup.checkpoint.parent,
                ctx.work / f"ct2-{name}",
                checkpoint=str(setup.checkpoint),
                quantization=name,
                force=True,
            )
        except Exception as e:
            ctx.log(f"CTranslate2 export ({name}) failed: {type(e).__name__}: {e}; skipping it")
    return exported


def ct2_compute_type(name: str, device: torch.device) -> str:
    if device.type == "cuda":
        return "bfloat16" if name == "float32" else "int8_bfloat16"
    return name
