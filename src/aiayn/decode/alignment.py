"""Word alignments from encoder-decoder attention, as fairseq's ``--print-alignment``:
each output piece is aligned to the source piece its step attended to most (one layer,
heads averaged), and pieces are merged into words for the Pharaoh ``i-j`` pairs.

The attention is not an alignment model (Section 3.2.3 only says every decoder position
can attend over the whole input), but one layer's mean often tracks the source words a
target word translates; which layer is measured on the demo task (BENCHMARKS.md), where
the true alignment is known, and that choice is the default.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from torch import Tensor

from aiayn.decode.core import inference
from aiayn.errors import DecodeError
from aiayn.model.transformer import Transformer

# The default layer, counted from 1 (negative: from the last): chosen on the demo task.
DEFAULT_LAYER = -1


def cross_attention(model: Transformer, src: Tensor, tgt_in: Tensor, layer: int) -> Tensor:
    """Encoder-decoder attention of ``layer`` (from 1; -1 is the last) averaged over the
    heads, from one teacher-forced pass over ``src [B, S]`` and ``tgt_in [B, T]`` (BOS +
    output): ``[B, T, S]``, row t the step that produced output token t."""
    index = layer_index(layer, model.cfg.decoder_layers)
    with inference(model):
        _, weights = model.forward_with_attention(src, tgt_in)
    return weights["cross"][index].float().mean(dim=1)


def layer_index(layer: int, n: int, what: str = "decoder layers") -> int:
    """The 0-based index of ``layer`` (from 1; negative: from the last) of ``n`` ``what``;
    DecodeError naming ``layer`` unless it is an integer (not a bool) in that range."""
    try:  # 1.0 or "1" would fail later as a list index, and True would read as layer 1
        if isinstance(layer, bool):
            raise TypeError
        layer = operator.index(layer)
    except TypeError:
        raise DecodeError(f"layer {layer!r}: not an integer; {_layers(n, what)}") from None
    index = layer - 1 if layer > 0 else n + layer
    if not 0 <= index < n or layer == 0:
        raise DecodeError(f"layer {layer}: {_layers(n, what)}")
    return index


def _layers(n: int, what: str) -> str:
    return f"the model has {n} {what} (1..{n}, or -{n}..-1 from the last)"


def hard_alignment(weights: Tensor, skip_src: Sequence[int] = ()) -> list[int]:
    """``weights [T, S]`` (one sentence's rows for its output pieces, EOS row excluded) ->
    for each output piece the source piece it attends to most; ``skip_src`` are source
    positions never to align to (an appended source EOS)."""
    if weights.numel() == 0:
        return []
    if skip_src:
        weights = weights.clone()
        weights[:, list(skip_src)] = float("-inf")
    return weights.argmax(dim=-1).tolist()


def word_starts(pieces: Sequence[str]) -> list[int]:
    """The word index of each SentencePiece piece, counted as the words of the text (its
    whitespace-separated ones): a piece starting with U+2581 (the word-boundary mark)
    starts a new word, any other continues the word before it; a piece of marks alone is
    space, which a word follows (the last word, at the end), so it makes no word of its own."""
    words, index, boundary = [], -1, True
    for piece in pieces:
        boundary |= piece.startswith("\u2581")
        if not piece.strip("\u2581"):  # marks alone: counted with the word after them
            words.append(index + 1)
            continue
        if boundary:
            index, boundary = index + 1, False
        words.append(index)
    return [min(w, max(index, 0)) for w in words]


def word_alignment(
    links: Sequence[int], src_words: Sequence[int], tgt_words: Sequence[int]
) -> list[tuple[int, int]]:
    """Piece links (output piece j -> source piece ``links[j]``) as word pairs ``(source
    word, target word)``, each once, sorted: the Pharaoh ``i-j`` pairs."""
    if len(links) != len(tgt_words):
        raise DecodeError(f"{len(links)} links for {len(tgt_words)} output pieces")
    return sorted({(src_words[i], tgt_words[j]) for j, i in enumerate(links)})


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """``[(0, 0), (1, 2)]`` -> ``"0-0 1-2"``."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
