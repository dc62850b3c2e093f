"""A trained model as a text-to-text function: tokenize, decode, detokenize; and the
attention weights behind one translation (shared by ``aiayn.inspect`` and ``aiayn.serve``,
which sit on one layer above this one and may not import each other)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.data.batching import pad, shift_target, sorted_batches
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import ContinuousBeamSearch, generate
from aiayn.errors import AiaynError
from aiayn.model.transformer import Transformer

# The three uses of attention (Section 3.2.3), as named by Transformer.forward_with_attention.
ATTENTION_KINDS = ("encoder", "decoder_self", "cross")


@dataclass
class AttentionMap:
    """Every layer's attention weights behind one translation.

    ``weights[kind]`` holds one ``[h, rows, cols]`` tensor per layer: "encoder" is
    ``[h, S, S]`` (source pieces on both axes), "decoder_self" ``[h, T, T]`` and "cross"
    ``[h, T, S]``, where the T rows are the output pieces, EOS last: row t is the step that
    produced ``target[t]``, and it saw the decoder inputs ``target_in[: t + 1]``.
    """

    source: list[str]  # source pieces
    target: list[str]  # output pieces, "</s>" last (rows of the decoder kinds)
    target_in: list[str]  # decoder inputs: "<s>" then the output pieces (decoder_self columns)
    weights: dict[str, list[Tensor]]

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of ``kind``'s heatmaps."""
        if kind not in ATTENTION_KINDS:
            raise AiaynError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)}")
        if kind == "encoder":
            return self.source, self.source
        return self.target, self.target_in if kind == "decoder_self" else self.source


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

    @property
    def max_source_tokens(self) -> int:
        """The longest source the model takes whole (one position is kept free)."""
        return self.model.cfg.max_len - 1

    def encode(self, line: str) -> list[int]:
        """Source ids of ``line`` (as the tokenizer makes them, EOS last for Marian models),
        cut to :attr:`max_source_tokens`; [] for a blank line."""
        return self.tokenizer.encode(line, self.max_source_tokens) if line.strip() else []

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
        ids = [self.encode(line) for line in lines]
        outputs = self.translate_ids(
            ids, beam, alpha, n_best, max_len_b, batch_size, on_batch, max_len_a
        )
        return [self.detokenize(candidates, n_best) for candidates in outputs]

    def detokenize(self, candidates: Sequence[Sequence[int]], n_best: int) -> list[str]:
        """Texts of one line's n-best ids, padded with "" to ``n_best`` entries."""
        texts = [self.tokenizer.decode(tokens) for tokens in candidates]
        return texts + [""] * (n_best - len(texts))

    def translate_ids(
        self,
        ids: Sequence[Sequence[int]],
        beam: int = 4,
        alpha: float = 0.6,
        n_best: int = 1,
        max_len_b: int = 50,
        batch_size: int = 64,
        on_batch: Callable[[int], None] | None = None,
        max_len_a: float = 1.0,
    ) -> list[list[list[int]]]:
        """Like :meth:`translate` on token ids: for each row its n-best output ids (no BOS
        or EOS), best first; an empty row gets no candidates."""
        results: list[list[list[int]]] = [[] for _ in ids]
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
                results[i] = outputs
            if on_batch is not None:
                on_batch(len(index))
        return results

    def continuous_search(
        self, beam: int = 4, alpha: float = 0.6, max_len_b: int = 50, max_len_a: float = 1.0
    ) -> ContinuousBeamSearch:
        """A beam search on this model that sentences join and leave between decoding steps
        (``aiayn serve``'s continuous batching): feed it right-padded source ids (each
        add may set its own ``alpha``). Each sentence's hypotheses are those
        :meth:`translate_ids` gives it with these settings (``beam >= 2``; beam 1 there is
        greedy decoding, which this is not)."""
        return ContinuousBeamSearch(
            self.model, beam, alpha, max_len_a=max_len_a, max_len_b=max_len_b
        )

    def attention_maps(
        self, src_ids: Sequence[Sequence[int]], out_ids: Sequence[Sequence[int]]
    ) -> list[AttentionMap]:
        """The attention weights of every layer and head that produce ``out_ids[i]`` (no BOS
        or EOS) from ``src_ids[i]``: one teacher-forced pass over the whole batch, each map
        cut to its own sentence's lengths (padding changes no real position's weights)."""
        if len(src_ids) != len(out_ids) or any(not s for s in src_ids):
            raise AiaynError("attention: each sentence needs a non-empty source and an output")
        cfg = self.model.cfg
        if not src_ids:
            return []
        src = pad(src_ids, cfg.pad_id).to(self.device)  # [B, S]
        dec_in, _ = shift_target(out_ids, cfg.bos_id, cfg.eos_id)  # BOS + output (3.1)
        tgt_in = pad(dec_in, cfg.pad_id).to(self.device)
        with torch.no_grad():
            _, weights = self.model.forward_with_attention(src, tgt_in)
        piece = self.tokenizer.id_to_piece
        start = piece(cfg.bos_id)  # the decoder's start token: <s>, or <pad> in Marian models
        maps = []
        for b, (s_ids, o_ids) in enumerate(zip(src_ids, out_ids)):
            S, T = len(s_ids), len(o_ids) + 1
            cols = {"encoder": S, "decoder_self": T, "cross": S}
            rows = {"encoder": S, "decoder_self": T, "cross": T}
            maps.append(
                AttentionMap(
                    source=[piece(i, source=True) for i in s_ids],
                    target=[piece(i) for i in o_ids] + [piece(cfg.eos_id)],
                    target_in=[start] + [piece(i) for i in o_ids],
                    weights={
                        k: [w[b, :, : rows[k], : cols[k]].float().cpu() for w in weights[k]]
                        for k in ATTENTION_KINDS
                    },
                )
            )
        return maps

    def attention(self, sentence: str, beam: int = 4, alpha: float = 0.6) -> AttentionMap:
        """Translate ``sentence`` and return every layer's attention weights for the best
        translation."""
        ids = self.encode(sentence)
        if not ids:
            raise AiaynError("attention: the sentence is empty")
        best = self.translate_ids([ids], beam, alpha)[0]
        return self.attention_maps([ids], [best[0] if best else []])[0]
