"""A trained model as a text-to-text function: tokenize, decode, detokenize; and the
attention weights behind one translation (shared by ``aiayn.inspect`` and ``aiayn.serve``,
which sit on one layer above this one and may not import each other)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.checkpoint import load_inference, resolve_checkpoint
from aiayn.data.batching import pad, shift_target, sorted_batches
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import BeamEngine, DecodeOptions, Hypothesis, search
from aiayn.decode.alignment import (
    DEFAULT_LAYER,
    cross_attention,
    hard_alignment,
    word_alignment,
    word_starts,
)
from aiayn.decode.core import as_list
from aiayn.decode.options import resolve
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


@dataclass
class Translation:
    """One output for one input line: its ``text``, the output ``pieces`` and ``ids`` (no
    BOS or EOS), ``log_prob`` (total log-probability under the model, EOS and any forced
    prefix included), ``score`` (the log-prob over the length penalty, what the search
    ranks by) and, when asked for, the ``alignment``: (source word, output word) pairs."""

    text: str
    pieces: list[str]
    ids: list[int]
    log_prob: float
    score: float
    alignment: list[tuple[int, int]] | None = None


class Translator:
    """Translates lists of sentences, keeping line alignment.

    Sentences are decoded in length-sorted batches (little padding) and returned in input
    order; an empty (or blank) input line gives an empty output line. Several models (one
    tokenizer, one target vocabulary) decode as an ensemble that averages their next-token
    probabilities; ``model`` is the first of them.
    """

    def __init__(
        self,
        model: Transformer | Sequence[Transformer],
        tokenizer: Tokenizer,
        generation: dict[str, Any] | None = None,
    ):
        self.models = [m.eval() for m in as_list(model)]
        self.model, self.tokenizer = self.models[0], tokenizer
        self.device = next(self.model.parameters()).device
        # What options=None means: the paper's beam 4 and alpha 0.6, or for an imported
        # model the generation settings it was published with (decoding as generate() does).
        self.defaults = DecodeOptions.from_generation(generation) if generation else DecodeOptions()

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path | Sequence[str | Path],
        checkpoint: str | Sequence[str] = "auto",
        device: str = "cpu",
        quantize: bool = False,
        precision: str = "fp32",
    ) -> Translator:
        """``checkpoint``: auto, best, last, averaged or a file; ``quantize``: int8 dynamic
        quantization, CPU only; ``precision``: fp32 or bf16 weights (see
        :func:`aiayn.checkpoint.load_model`). Several directories, or several checkpoints
        of one, make an ensemble; their tokenizers must be the same. An imported model's
        generation settings become :attr:`defaults` (those of the first model)."""
        dirs = [model_dir] if isinstance(model_dir, (str, Path)) else list(model_dir)
        names = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
        paths = [resolve_checkpoint(d, n) for d, n in _members(dirs, names)]
        models, tokenizer, generation = [], None, None
        for path in paths:
            model, tok, settings = load_inference(path, device, quantize, precision)
            generation = settings if generation is None else generation
            if tokenizer is not None and tok.to_bytes() != tokenizer.to_bytes():
                raise AiaynError(
                    f"ensemble: {path} has another tokenizer than {paths[0]}; ensembled "
                    "models must share one vocabulary"
                )
            models.append(model)
            tokenizer = tok
        if tokenizer is None:
            raise AiaynError("no model to load: no model directory or no checkpoint given")
        try:
            return cls(models, tokenizer, generation)
        except AiaynError as e:
            raise AiaynError(f"{', '.join(map(str, paths))}: {e}") from None

    @property
    def max_source_tokens(self) -> int:
        """The longest source the model takes whole (one position is kept free)."""
        return min(m.cfg.max_len for m in self.models) - 1

    def encode(self, line: str) -> list[int]:
        """Source ids of ``line`` (as the tokenizer makes them, EOS last for Marian models),
        cut to :attr:`max_source_tokens`; [] for a blank line."""
        return self.tokenizer.encode(line, self.max_source_tokens) if line.strip() else []

    def translate(
        self,
        lines: Sequence[str],
        options: DecodeOptions | None = None,
        prefixes: Sequence[str] | None = None,
        *,
        first_line: int = 0,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
        **settings: Any,
    ) -> list[list[str]]:
        """The texts of :meth:`translations` (same arguments): ``n_best`` per line, best
        first (samples in the order drawn), padded with "" where a search finished fewer
        (a blank line gets only "")."""
        options = self.options(options, settings)
        found = self._translations(
            lines, options, prefixes, first_line, batch_size, on_batch, None, scores=False
        )
        return [[t.text for t in out] + [""] * (options.n_best - len(out)) for out in found]

    def translations(
        self,
        lines: Sequence[str],
        options: DecodeOptions | None = None,
        prefixes: Sequence[str] | None = None,
        *,
        first_line: int = 0,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
        alignment_layer: int | None = None,
        scores: bool = True,
        **settings: Any,
    ) -> list[list[Translation]]:
        """For each line its outputs as :class:`Translation` objects (texts, pieces,
        log-probs, scores; word alignments too when ``alignment_layer`` is given: the
        decoder layer, from 1, -1 the last). ``options``: a :class:`DecodeOptions`
        (default :attr:`defaults`: beam 4 and alpha 0.6, or an imported model's generation
        settings; beam 1 is greedy decoding), with the keyword ``settings`` given (beam,
        alpha, n_best, ...) applied. ``prefixes[i]`` (text) is forced as the start of line
        i's outputs (default: ``options.prefix`` for every line). Line i is line
        ``first_line + i`` of the whole input, which seeds its samples. ``scores=False``
        lets greedy decoding skip the log-probs (then 0)."""
        options = self.options(options, settings)
        return self._translations(
            lines, options, prefixes, first_line, batch_size, on_batch, alignment_layer, scores
        )

    def _translations(
        self,
        lines: Sequence[str],
        options: DecodeOptions,
        prefixes: Sequence[str] | None,
        first_line: int,
        batch_size: int,
        on_batch: Callable[[int], object] | None,
        alignment_layer: int | None,
        scores: bool,
    ) -> list[list[Translation]]:
        if prefixes is not None and len(prefixes) != len(lines):
            raise AiaynError(f"{len(prefixes)} prefixes for {len(lines)} input lines")
        ids = [self.encode(line) for line in lines]
        texts = prefixes if prefixes is not None else [options.prefix] * len(lines)
        forced = [self.tokenizer.encode_target(p) if p else [] for p in texts]
        lines_at = range(first_line, first_line + len(lines))
        hyps = self.hypotheses(ids, options, forced, lines_at, batch_size, on_batch, scores)
        out = [[self._translation(h) for h in candidates] for candidates in hyps]
        if alignment_layer is not None:
            for src_ids, found in zip(ids, out):
                links = self.align([src_ids] * len(found), [t.ids for t in found], alignment_layer)
                for t, pairs in zip(found, links):
                    t.alignment = pairs
        return out

    def options(
        self, options: DecodeOptions | None = None, settings: dict[str, Any] | None = None
    ) -> DecodeOptions:
        """``options`` (default: :attr:`defaults`) with the keyword ``settings`` of the
        methods above that are not None applied; an unknown setting is an error."""
        settings = settings or {}
        unknown = sorted(set(settings) - set(DecodeOptions.__dataclass_fields__))
        if unknown:
            raise AiaynError(f"unknown decoding setting(s): {', '.join(unknown)}")
        return resolve(self.defaults if options is None else options, **settings)

    def _translation(self, h: Hypothesis) -> Translation:
        piece = self.tokenizer.id_to_piece
        text = self.tokenizer.decode(h.tokens)
        return Translation(text, [piece(i) for i in h.tokens], h.tokens, h.log_prob, h.score)

    def hypotheses(
        self,
        ids: Sequence[Sequence[int]],
        options: DecodeOptions,
        prefixes: Sequence[Sequence[int]] | None = None,
        lines: Sequence[int] | None = None,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
        scores: bool = True,
    ) -> list[list[Hypothesis]]:
        """The searches' hypotheses for each row of source ``ids`` (none for an empty row),
        with ``prefixes[i]`` forced and ``lines[i]`` (default i) seeding row i's samples
        (``scores=False``: see :func:`aiayn.decode.search`)."""
        results: list[list[Hypothesis]] = [[] for _ in ids]
        lines = range(len(ids)) if lines is None else lines
        for index, src in sorted_batches(ids, batch_size, self.model.cfg.pad_id):
            found = search(
                self.models if len(self.models) > 1 else self.model,
                src.to(self.device),
                options,
                prefix=[prefixes[i] for i in index] if prefixes is not None else None,
                lines=[lines[i] for i in index],
                scores=scores,
            )
            for i, candidates in zip(index, found):
                results[i] = candidates
            if on_batch is not None:
                on_batch(len(index))
        return results

    def align(
        self,
        src_ids: Sequence[Sequence[int]],
        out_ids: Sequence[Sequence[int]],
        layer: int = DEFAULT_LAYER,
        batch_size: int = 64,
    ) -> list[list[tuple[int, int]]]:
        """Hard word alignments (source word, output word) of ``out_ids[i]`` to ``src_ids[i]``
        from the first model's encoder-decoder attention at ``layer``, heads averaged
        (:mod:`aiayn.decode.alignment`)."""
        cfg, piece = self.model.cfg, self.tokenizer.id_to_piece
        out: list[list[tuple[int, int]]] = [[] for _ in src_ids]
        pairs = [i for i in range(len(src_ids)) if src_ids[i] and out_ids[i]]
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            src = pad([src_ids[i] for i in chunk], cfg.pad_id).to(self.device)
            dec_in, _ = shift_target([out_ids[i] for i in chunk], cfg.bos_id, cfg.eos_id)
            weights = cross_attention(
                self.model, src, pad(dec_in, cfg.pad_id).to(self.device), layer
            )
            for b, i in enumerate(chunk):
                S, T = len(src_ids[i]), len(out_ids[i])
                links = hard_alignment(weights[b, :T, :S].cpu())
                src_words = word_starts([piece(t, source=True) for t in src_ids[i]])
                tgt_words = word_starts([piece(t) for t in out_ids[i]])
                out[i] = word_alignment(links, src_words, tgt_words)
        return out

    def continuous_search(self, options: DecodeOptions) -> BeamEngine:
        """The beam engine of these models (an ensemble too) that sentences join and leave
        between decoding steps (``aiayn serve``'s continuous batching): feed it
        right-padded source ids, with forced prefixes and their own ``alpha`` per add.
        Each sentence's hypotheses are those :meth:`hypotheses` gives it with ``options``
        (``beam >= 2``; beam 1 there is greedy decoding, which this is not)."""
        return BeamEngine(self.models, options)

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

    def attention(
        self, sentence: str, beam: int | None = None, alpha: float | None = None
    ) -> AttentionMap:
        """Translate ``sentence`` (:attr:`defaults`, with ``beam`` and ``alpha`` when given)
        and return every layer's attention weights for the best translation."""
        ids = self.encode(sentence)
        if not ids:
            raise AiaynError("attention: the sentence is empty")
        options = self.options(None, {"beam": beam, "alpha": alpha}).replace(n_best=1)
        best = self.hypotheses([ids], options)[0]
        return self.attention_maps([ids], [best[0].tokens if best else []])[0]


def _members(dirs: list, names: list) -> list[tuple]:
    """(model directory, checkpoint) of each ensemble member: one checkpoint name for every
    directory, several checkpoints of one directory, or one per directory."""
    if len(names) == 1:
        return [(d, names[0]) for d in dirs]
    if len(dirs) == 1:
        return [(dirs[0], n) for n in names]
    if len(dirs) != len(names):
        raise AiaynError(
            f"ensemble: {len(dirs)} model directories but {len(names)} checkpoints "
            "(give one checkpoint for all, one per directory, or several of one directory)"
        )
    return list(zip(dirs, names))
