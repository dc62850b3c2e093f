"""Attention heatmaps (Section 3.2): for one translation, any layer and head of the three
kinds of attention (encoder self-attention, masked decoder self-attention and
encoder-decoder attention), or a compact grid of every head of a layer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from aiayn.data.folders import replace_file
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import alignment
from aiayn.errors import AiaynError
from aiayn.inspect.curves import pyplot
from aiayn.inspect.maps import ATTENTION_KINDS, AttentionMap, attention
from aiayn.model.transformer import Transformer
from aiayn.translator import Translator

TITLES = {
    "encoder": "encoder self-attention",
    "decoder_self": "decoder self-attention",
    "cross": "encoder-decoder attention",
}

__all__ = [
    "ATTENTION_KINDS",
    "AttentionMap",
    "attention_map",
    "mean_attention_distance",
    "offset_attention",
    "plot_attention",
    "text_heatmap",
]


def attention_map(
    model: Transformer, tokenizer: Tokenizer, sentence: str, beam: int = 4
) -> AttentionMap:
    """Translate ``sentence`` and return every layer's attention weights for the result."""
    return attention(Translator(model, tokenizer), sentence, beam=beam)


def offset_attention(weights: Tensor, offset: int = -1) -> Tensor:
    """How much each head attends ``offset`` positions away (-1: the previous token): the
    mean, over the queries that have such a key, of the weight on it.

    ``weights [..., h, T, T]`` (self-attention of one sentence) -> ``[..., h]``; 1.0 for a
    head that always looks exactly there. Helps find the "previous word" heads of the
    paper's Figures 3-5."""
    T = weights.size(-1)
    if abs(offset) >= T:
        raise AiaynError(f"no query has a key {offset} positions away in a length-{T} sentence")
    return weights.diagonal(offset=offset, dim1=-2, dim2=-1).mean(-1)


def mean_attention_distance(weights: Tensor) -> Tensor:
    """The average distance |query - key| in positions, weighted by attention, over all
    queries: ``weights [..., h, T, S]`` -> ``[..., h]``. Large for heads that follow
    long-range dependencies, near 0 for heads that look at their own position."""
    T, S = weights.shape[-2:]
    q = torch.arange(T, dtype=weights.dtype, device=weights.device)[:, None]
    k = torch.arange(S, dtype=weights.dtype, device=weights.device)[None, :]
    return (weights * (q - k).abs()).sum(-1).mean(-1)


def layer_index(amap: AttentionMap, kind: str, layer: int) -> int:
    """0-based index of ``layer``, counted from 1 (negative: from the last, -1 = last)."""
    amap.axes(kind)  # an unknown kind fails here
    return alignment.layer_index(layer, len(amap.weights[kind]), "layers")


def head_index(amap: AttentionMap, kind: str, head: int) -> int:
    """0-based index of ``head``, counted from 1."""
    h = amap.weights[kind][0].size(0)
    if not 1 <= head <= h:
        raise AiaynError(f"head {head}: the model has {h} heads (1..{h})")
    return head - 1


def plot_attention(
    amap: AttentionMap, path: str | Path, kind: str = "cross", layer: int = -1, head: int = 0
) -> Path:
    """Save a PNG of ``kind`` attention in ``layer`` (counted from 1, -1 = last): one
    heatmap of ``head`` (counted from 1), or with ``head=0`` a grid of every head plus
    their mean. Rows are the querying pieces, columns the pieces attended to."""
    plt = pyplot()
    li = layer_index(amap, kind, layer)
    heads = amap.weights[kind][li]  # [h, rows, cols]
    if head:
        hi = head_index(amap, kind, head)
        panels, titles = [heads[hi]], [f"head {hi + 1}"]
    else:
        panels = [*heads, heads.mean(0)]
        titles = [f"head {i + 1}" for i in range(len(heads))] + ["mean of heads"]
    rows_labels, col_labels = amap.axes(kind)
    cols = min(5, len(panels))  # 4 heads + their mean in one row
    rows = (len(panels) + cols - 1) // cols
    size = 0.3 * max(len(rows_labels), len(col_labels)) + 1.6  # inches per panel
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size + 0.6), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, data, title in zip(axes.flat, panels, titles):
        ax.imshow(data.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows_labels)), rows_labels, fontsize=7)
    fig.suptitle(f"{TITLES[kind]}, layer {li + 1}")
    fig.tight_layout()
    path = Path(path)
    path = path if path.suffix else path.with_suffix(".png")  # what savefig writes
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, lambda f: fig.savefig(f, format=path.suffix[1:].lower(), dpi=100))
    except OSError as e:
        raise AiaynError(f"{path}: cannot write ({e.strerror or e})") from None
    except ValueError as e:  # matplotlib: a file type it cannot write (.xyz)
        raise AiaynError(f"{path}: cannot write ({e})") from None
    finally:
        plt.close(fig)
    return path


def plot_cross_attention(amap: AttentionMap, path: str | Path, layer: int = -1) -> Path:
    """Every head of encoder-decoder attention in ``layer`` (kept for older callers)."""
    return plot_attention(amap, path, "cross", layer)


def plot_all(
    amap: AttentionMap,
    out_dir: str | Path,
    kinds: Sequence[str] = ATTENTION_KINDS,
    layer: int | None = None,
    head: int = 0,
) -> list[Path]:
    """Grids of every head for each kind and layer (only ``layer`` when given) into
    ``out_dir`` as ``{kind}_layer{L}.png``, plus ``{kind}_layer{L}_head{H}.png`` when a
    ``head`` (from 1) is chosen."""
    for kind in kinds:
        amap.axes(kind)  # an unknown kind fails before any file is written
    written = []
    for kind in kinds:
        n = len(amap.weights[kind])
        layers = [layer_index(amap, kind, layer) + 1] if layer is not None else range(1, n + 1)
        for number in layers:
            name = Path(out_dir) / f"{kind}_layer{number}"
            written.append(plot_attention(amap, f"{name}.png", kind, number))
            if head:
                written.append(plot_attention(amap, f"{name}_head{head}.png", kind, number, head))
    return written


def text_heatmap(amap: AttentionMap, layer: int = -1, kind: str = "cross", head: int = 0) -> str:
    """``kind`` attention in ``layer`` (from 1, -1 = last) as text, the mean over the heads
    or ``head`` alone (from 1): each querying piece with the pieces it attended to most,
    among those it could see (in decoder self-attention, row t sees the first t + 1)."""
    index = layer_index(amap, kind, layer)  # an unknown kind or layer fails here
    heads = amap.weights[kind][index]  # [h, rows, cols]
    weights = heads[head_index(amap, kind, head)] if head else heads.mean(0)
    queries, keys = amap.axes(kind)
    lines = []
    for t, (row, piece) in enumerate(zip(weights, queries)):
        row = row[: t + 1] if kind == "decoder_self" else row  # the later keys are masked
        top = row.topk(min(3, row.numel()))
        focus = ", ".join(
            f"{keys[j]} {w:.2f}" for w, j in zip(top.values.tolist(), top.indices.tolist())
        )
        lines.append(f"{piece:>15} <- {focus}")
    return "\n".join(lines)
