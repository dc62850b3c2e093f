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
    hard_alignment,
    layer_index,
    word_alignment,
    word_starts,
)
from aiayn.decode.core import as_list
from aiayn.decode.options import length_rule, resolve
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
        self.generation = dict(generation or {})  # as imported: what /info and summary show

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
    def length_rule(self) -> str:
        """How long an output may get by default, and where that rule comes from."""
        return length_rule(self.defaults, self.model.cfg.max_len, self.generation)

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
        return [n_best_texts([t.text for t in out], options.n_best) for out in found]

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
        if alignment_layer is None:
            return out
        for src_ids, found in zip(ids, out):
            links = self.align(src_ids, [t.ids for t in found], alignment_layer)
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

    def continuous_search(self, options: DecodeOptions) -> BeamEngine:
        """The beam engine of these models (an ensemble too) that sentences join and leave
        between decoding steps (``aiayn serve``'s continuous batching): feed it
        right-padded source ids, with forced prefixes and their own ``alpha`` per add.
        Each sentence's hypotheses are those :meth:`hypotheses` gives it with ``options``
        (``beam >= 2``; beam 1 there is greedy decoding, which this is not)."""
        return BeamEngine(self.models, options)

    def attention_maps(
        self,
        src_ids: Sequence[Sequence[int]],
        out_ids: Sequence[Sequence[int]],
        batch_size: int = 64,
    ) -> list[AttentionMap | None]:
        """The attention weights of every layer and head that produce ``out_ids[i]`` (no BOS
        or EOS) from ``src_ids[i]`` (None for a blank source), from the first model: one
        teacher-forced pass per batch, each map cut to its own sentence's lengths (padding
        changes no real position's weights). Word alignments are read from these too."""
        if len(src_ids) != len(out_ids):
            raise AiaynError(f"attention: {len(src_ids)} sources for {len(out_ids)} outputs")
        cfg, piece = self.model.cfg, self.tokenizer.id_to_piece
        start = piece(cfg.bos_id)  # the decoder's start token: <s>, or <pad> in Marian models
        maps: list[AttentionMap | None] = [None] * len(src_ids)
        real = [i for i, s in enumerate(src_ids) if s]
        for chunk in (real[a : a + batch_size] for a in range(0, len(real), batch_size)):
            src = pad([src_ids[i] for i in chunk], cfg.pad_id).to(self.device)  # [B, S]
            dec_in, _ = shift_target([out_ids[i] for i in chunk], cfg.bos_id, cfg.eos_id)
            with torch.inference_mode():  # BOS + output (Section 3.1)
                _, weights = self.model.forward_with_attention(
                    src, pad(dec_in, cfg.pad_id).to(self.device)
                )
            for b, i in enumerate(chunk):
                S, T, o_ids = len(src_ids[i]), len(out_ids[i]) + 1, out_ids[i]
                rows = {"encoder": S, "decoder_self": T, "cross": T}
                cols = {"encoder": S, "decoder_self": T, "cross": S}
                maps[i] = AttentionMap(
                    source=[piece(t, source=True) for t in src_ids[i]],
                    target=[piece(t) for t in o_ids] + [piece(cfg.eos_id)],
                    target_in=[start] + [piece(t) for t in o_ids],
                    weights={
                        k: [w[b, :, : rows[k], : cols[k]].float().cpu() for w in weights[k]]
                        for k in ATTENTION_KINDS
                    },
                )
        return maps

    def align(
        self, src_ids: Sequence[int], out_ids: Sequence[Sequence[int]], layer: int = DEFAULT_LAYER
    ) -> list[list[tuple[int, int]]]:
        """Hard word alignments (source word, output word) of each of ``out_ids`` (one
        line's outputs) to ``src_ids``, from :meth:`attention_maps`' encoder-decoder
        attention at ``layer`` (from 1; -1 the last), heads averaged
        (:mod:`aiayn.decode.alignment`)."""
        index = layer_index(layer, self.model.cfg.decoder_layers)
        maps = self.attention_maps([src_ids] * len(out_ids), out_ids)
        src_words = word_starts([self.tokenizer.id_to_piece(t, source=True) for t in src_ids])
        out: list[list[tuple[int, int]]] = []
        for amap, ids in zip(maps, out_ids):
            if amap is None or not ids:
                out.append([])
                continue
            weights = amap.weights["cross"][index].mean(dim=0)[: len(ids)]  # [T, S]
            tgt_words = word_starts(amap.target[: len(ids)])
            out.append(word_alignment(hard_alignment(weights), src_words, tgt_words))
        return out

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
        found = self.attention_maps([ids], [best[0].tokens if best else []])[0]
        assert found is not None  # the source is not blank
        return found


def n_best_texts(texts: list[str], n_best: int) -> list[str]:
    """One line's output texts padded with "" to ``n_best`` (a search may finish fewer;
    a blank line gets none): what the command line and the server print."""
    return texts + [""] * (n_best - len(texts))


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
