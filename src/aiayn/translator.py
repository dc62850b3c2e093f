"""A trained model directory as a text-to-text function: tokenize, decode, detokenize."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from aiayn.config import TransformerConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import beam_search, greedy
from aiayn.model.transformer import Transformer
from aiayn.train.checkpoint import CheckpointError, check_vocab, load_checkpoint

CHECKPOINT_NAMES = {
    "best": "checkpoint_best.pt",
    "last": "checkpoint_last.pt",
    "averaged": "checkpoint_averaged.pt",
}


def resolve_checkpoint(model_dir: str | Path, which: str = "auto") -> Path:
    """The checkpoint file of a model directory: ``which`` is best, last, averaged, a file
    path, or auto (averaged if present, else best, else last)."""
    model_dir = Path(model_dir)
    if which not in CHECKPOINT_NAMES and which != "auto":
        return Path(which)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: no such model directory")
    order = [which] if which != "auto" else ["averaged", "best", "last"]
    for name in order:
        path = model_dir / CHECKPOINT_NAMES[name]
        if path.is_file():
            return path
    raise CheckpointError(f"{model_dir}: no {' / '.join(CHECKPOINT_NAMES[n] for n in order)} found")


PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    quantize: bool = False,
    precision: str = "fp32",
) -> tuple[Transformer, Tokenizer]:
    """Model (in eval mode) and tokenizer from one checkpoint file, with clear errors.

    ``quantize`` gives an int8 dynamically quantized model for CPU inference
    (:func:`aiayn.quantize.quantize_dynamic_int8`); it needs ``device="cpu"``.
    ``precision="bf16"`` casts the weights to bfloat16, for inference: faster on GPUs and
    on CPUs with bf16 instructions (AVX512-BF16, AMX), slower on others.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if quantize and torch.device(device).type != "cpu":
        raise ValueError(f"--quantize (int8) runs on the CPU only, not on {device}; use cpu")
    if quantize and precision != "fp32":
        raise ValueError("--quantize (int8) and --precision bf16 exclude each other; pick one")
    state = load_checkpoint(path, map_location=device)
    if "tokenizer" not in state:
        raise CheckpointError(f"{path}: checkpoint holds no tokenizer")
    tokenizer = Tokenizer.from_bytes(state["tokenizer"])
    check_vocab(state, tokenizer.vocab_size, path, "its tokenizer")
    cfg = TransformerConfig.from_dict(state["config"])
    model = Transformer(cfg)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{path}: weights do not fit the model config ({first})") from None
    model = model.to(device=device, dtype=PRECISIONS[precision]).eval()
    if quantize:
        from aiayn.quantize import quantize_dynamic_int8

        model = quantize_dynamic_int8(model)
    return model, tokenizer


class Translator:
    """Translates lists of sentences, keeping line alignment.

    Sentences are decoded in length-sorted batches (little padding) and returned in input
    order; an empty (or blank) input line gives an empty output line.
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.device = next(model.parameters()).device

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        checkpoint: str = "auto",
        device: str = "cpu",
        quantize: bool = False,
        precision: str = "fp32",
    ) -> Translator:
        """``quantize``: int8 dynamic quantization, CPU only; ``precision``: fp32 or bf16
        weights (see :func:`load_model`)."""
        path = resolve_checkpoint(model_dir, checkpoint)
        return cls(*load_model(path, device, quantize, precision))

    def translate(
        self,
        lines: Sequence[str],
        beam: int = 4,
        alpha: float = 0.6,
        n_best: int = 1,
        max_len_b: int = 50,
        batch_size: int = 64,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[list[str]]:
        """``n_best`` translations (best first) for each line; beam 1 is greedy decoding."""
        cfg = self.model.cfg
        limit = cfg.max_len - 1  # keep one position free
        ids = [self.tokenizer.encode(line)[:limit] if line.strip() else [] for line in lines]
        results: list[list[str]] = [[""] * n_best for _ in lines]
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            src = torch.full(
                (len(chunk), max(len(ids[i]) for i in chunk)), cfg.pad_id, dtype=torch.long
            )
            for row, i in enumerate(chunk):
                src[row, : len(ids[i])] = torch.tensor(ids[i])
            src = src.to(self.device)
            if beam == 1 and n_best == 1:
                out = greedy(self.model, src, max_new_tokens=src.size(1) + max_len_b)
                for i, tokens in zip(chunk, out.tolist()):
                    results[i] = [self.tokenizer.decode(tokens)]
            else:
                hyps = beam_search(self.model, src, beam, alpha, max_len_b, n_best)
                for i, sentence in zip(chunk, hyps):
                    texts = [self.tokenizer.decode(h.tokens) for h in sentence]
                    results[i] = texts + [""] * (n_best - len(texts))
            if on_batch is not None:
                on_batch(len(chunk))
        return results
