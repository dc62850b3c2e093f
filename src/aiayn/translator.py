"""A trained model as a text-to-text function: tokenize, decode, detokenize."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.data.batching import sorted_batches
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import generate
from aiayn.model.transformer import Transformer


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
        """``checkpoint``: auto, best, last, averaged or a file; ``quantize``: int8 dynamic
        quantization, CPU only; ``precision``: fp32 or bf16 weights (see
        :func:`aiayn.checkpoint.load_model`)."""
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
        max_len_a: float = 1.0,
    ) -> list[list[str]]:
        """``n_best`` translations (best first) for each line; beam 1 is greedy decoding.
        Each output has at most ``max_len_a * source tokens + max_len_b`` tokens."""
        limit = self.model.cfg.max_len - 1  # keep one position free
        ids = [self.tokenizer.encode(line)[:limit] if line.strip() else [] for line in lines]
        results: list[list[str]] = [[""] * n_best for _ in lines]
        for index, src in sorted_batches(ids, batch_size, self.model.cfg.pad_id):
            nbest = generate(
                self.model,
                src.to(self.device),
                beam,
                alpha,
                n_best,
                max_len_a=max_len_a,
                max_len_b=max_len_b,
            )
            for i, outputs in zip(index, nbest):
                texts = [self.tokenizer.decode(tokens) for tokens in outputs]
                results[i] = texts + [""] * (n_best - len(texts))
            if on_batch is not None:
                on_batch(len(index))
        return results
