"""The attention behind translations, read from teacher-forced passes over the outputs
(Section 3.2.3): every layer's weights of the three kinds (:class:`AttentionMap`, for
heatmaps and the server's ``attention`` field) and word alignments from the
encoder-decoder kind (:func:`add_alignments`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from aiayn.data.batching import check_batch_size, pad, shift_target
from aiayn.decode.alignment import (
    DEFAULT_LAYER,
    cross_attention,
    hard_alignment,
    layer_index,
    word_alignment,
    word_starts,
)
from aiayn.decode.core import inference
from aiayn.errors import AiaynError
from aiayn.translator import Translation, Translator

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
    target: list[str]  # output pieces, "</s>" last if it fits max_len (decoder rows)
    target_in: list[str]  # decoder inputs: "<s>" then the output pieces (decoder_self columns)
    weights: dict[str, list[Tensor]]

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of ``kind``'s heatmaps."""
        if kind not in ATTENTION_KINDS:
            raise AiaynError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)}")
        if kind == "encoder":
            return self.source, self.source
        return self.target, self.target_in if kind == "decoder_self" else self.source


def _batches(
    translator: Translator,
    src_ids: Sequence[Sequence[int]],
    out_ids: Sequence[Sequence[int]],
    batch_size: int,
) -> list[tuple[list[int], Tensor, Tensor]]:
    """The pairs with a real source, in batches: (their indices, padded source ``[B, S]``,
    padded decoder input ``[B, T]``, BOS + output, Section 3.1)."""
    if len(src_ids) != len(out_ids):
        raise AiaynError(f"attention: {len(src_ids)} sources for {len(out_ids)} outputs")
    check_batch_size(batch_size)
    cfg, device, max_len = translator.model.cfg, translator.device, translator.max_len
    real = [i for i, s in enumerate(src_ids) if s]
    out = []
    for chunk in (real[a : a + batch_size] for a in range(0, len(real), batch_size)):
        src = pad([src_ids[i] for i in chunk], cfg.pad_id).to(device)
        dec_in, _ = shift_target([out_ids[i] for i in chunk], cfg.bos_id, cfg.eos_id)
        dec_in = [d[: _decoder_rows(len(out_ids[i]), max_len)] for d, i in zip(dec_in, chunk)]
        out.append((chunk, src, pad(dec_in, cfg.pad_id).to(device)))
    return out


def _decoder_rows(n_out: int, max_len: int) -> int:
    """Teacher-forced rows of an output of ``n_out`` tokens: BOS and the output, the last
    row predicting EOS; one fewer for an output that fills all max_len positions, which
    stopped at the limit, not at EOS (that row has no position, and no use)."""
    return n_out if n_out == max_len else n_out + 1


def attention_maps(
    translator: Translator,
    src_ids: Sequence[Sequence[int]],
    out_ids: Sequence[Sequence[int]],
    batch_size: int = 64,
) -> list[AttentionMap | None]:
    """The attention weights of every layer and head that produce ``out_ids[i]`` (no BOS
    or EOS) from ``src_ids[i]`` (None for a blank source), from the translator's first
    model: one teacher-forced pass per batch, each map cut to its own sentence's lengths
    (padding changes no real position's weights)."""
    cfg, piece, max_len = translator.model.cfg, translator.tokenizer.id_to_piece, translator.max_len
    start = piece(cfg.bos_id)  # the decoder's start token: <s>, or <pad> in Marian models
    maps: list[AttentionMap | None] = [None] * len(src_ids)
    for chunk, src, dec_in in _batches(translator, src_ids, out_ids, batch_size):
        with inference(translator.model):
            _, weights = translator.model.forward_with_attention(src, dec_in)
        for b, i in enumerate(chunk):
            S, o_ids = len(src_ids[i]), out_ids[i]
            T = _decoder_rows(len(o_ids), max_len)
            rows = {"encoder": S, "decoder_self": T, "cross": T}
            cols = {"encoder": S, "decoder_self": T, "cross": S}
            maps[i] = AttentionMap(
                source=[piece(t, source=True) for t in src_ids[i]],
                target=([piece(t) for t in o_ids] + [piece(cfg.eos_id)])[:T],
                target_in=([start] + [piece(t) for t in o_ids])[:T],
                weights={
                    k: [w[b, :, : rows[k], : cols[k]].float().cpu() for w in weights[k]]
                    for k in ATTENTION_KINDS
                },
            )
    return maps


def add_alignments(
    translator: Translator,
    src_ids: Sequence[Sequence[int]],
    found: Sequence[Sequence[Translation]],
    layer: int = DEFAULT_LAYER,
    batch_size: int = 64,
) -> None:
    """Set the ``alignment`` of every translation in ``found[i]`` (line i's outputs, from
    source ``src_ids[i]``): its hard word alignment, (source word, output word) pairs, from
    the encoder-decoder attention of decoder ``layer`` (from 1; -1 the last), heads
    averaged (:mod:`aiayn.decode.alignment`). One teacher-forced pass per batch of
    outputs, which keeps only that layer's weights. A source that ends with the EOS the
    tokenizer appends (Marian's, :attr:`add_source_eos`) has nothing aligned to it, as in
    fairseq: it would read as part of the last source word."""
    tokenizer = translator.tokenizer
    model, piece = translator.model, tokenizer.id_to_piece
    appended = getattr(tokenizer, "add_source_eos", False)
    layer_index(layer, model.cfg.decoder_layers)  # a wrong layer fails before any work
    if len(src_ids) != len(found):
        raise AiaynError(f"alignment: {len(src_ids)} sources for {len(found)} lines of outputs")
    pairs = [(src, t) for src, outputs in zip(src_ids, found) for t in outputs]
    sources = [src if t.ids else [] for src, t in pairs]  # an empty output aligns nothing
    for _, t in pairs:
        t.alignment = []
    for chunk, src, dec_in in _batches(translator, sources, [t.ids for _, t in pairs], batch_size):
        weights = cross_attention(model, src, dec_in, layer).cpu()  # [B, T, S]
        for b, i in enumerate(chunk):
            ids, t = pairs[i]
            eos = [len(ids) - 1] if appended and ids and ids[-1] == tokenizer.eos_id else []
            if len(eos) == len(ids):  # EOS alone: no source word to align to
                continue
            src_words = word_starts([piece(p, source=True) for p in ids])
            tgt_words = word_starts([piece(p) for p in t.ids])
            links = hard_alignment(weights[b, : len(t.ids), : len(ids)], skip_src=eos)
            t.alignment = word_alignment(links, src_words, tgt_words)


def attention(
    translator: Translator, sentence: str, beam: int | None = None, alpha: float | None = None
) -> AttentionMap:
    """Translate ``sentence`` (the translator's defaults, with ``beam`` and ``alpha`` when
    given) and return every layer's attention weights for the best translation."""
    if not isinstance(sentence, str):
        raise AiaynError(f"attention: the sentence must be text, not {type(sentence).__name__}")
    ids = translator.encode(sentence)
    if not ids:
        raise AiaynError("attention: the sentence is empty")
    options = translator.options(None, {"beam": beam, "alpha": alpha}).replace(n_best=1)
    best = translator.hypotheses([ids], options)[0]
    found = attention_maps(translator, [ids], [best[0].tokens if best else []])[0]
    assert found is not None  # the source is not blank
    return found
