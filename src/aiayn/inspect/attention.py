"""Attention heatmaps: which source pieces each output piece attended to (Section 3.2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import beam_search
from aiayn.errors import AiaynError
from aiayn.model.transformer import Transformer


@dataclass
class AttentionMap:
    source: list[str]  # source pieces (columns)
    target: list[str]  # generated pieces, EOS last (rows)
    weights: dict[str, list[Tensor]]  # per layer [h, rows, cols] for "encoder", "cross", ...


def attention_map(
    model: Transformer, tokenizer: Tokenizer, sentence: str, beam: int = 4
) -> AttentionMap:
    """Translate ``sentence`` and return every layer's attention weights for the result."""
    cfg = model.cfg
    ids = tokenizer.encode(sentence)[: cfg.max_len - 1]
    if not ids:
        raise AiaynError("attention: the sentence is empty")
    src = torch.tensor([ids], device=next(model.parameters()).device)
    best = beam_search(model, src, beam_size=beam)[0][0].tokens
    tgt_in = torch.tensor([[cfg.bos_id, *best]], device=src.device)
    model.eval()
    with torch.no_grad():
        _, weights = model.forward_with_attention(src, tgt_in)
    pieces = tokenizer.id_to_piece
    return AttentionMap(
        source=[pieces(i) for i in ids],
        target=[pieces(i) for i in best] + ["</s>"],
        weights={k: [w[0].float().cpu() for w in v] for k, v in weights.items()},
    )


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


def plot_cross_attention(amap: AttentionMap, path: str | Path, layer: int = -1) -> Path:
    """Save a PNG with one heatmap per head of encoder-decoder attention in ``layer``
    plus their mean; rows are output pieces, columns source pieces."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    heads = amap.weights["cross"][layer]  # [h, T, S]
    panels = [*heads, heads.mean(0)]
    titles = [f"head {i + 1}" for i in range(len(heads))] + ["mean of heads"]
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    size = 0.32 * max(len(amap.source), len(amap.target)) + 2
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, data, title in zip(axes.flat, panels, titles):
        ax.imshow(data.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(amap.source)), amap.source, rotation=90, fontsize=7)
        ax.set_yticks(range(len(amap.target)), amap.target, fontsize=7)
    layer_no = layer if layer >= 0 else len(amap.weights["cross"]) + layer
    fig.suptitle(f"encoder-decoder attention, layer {layer_no + 1}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def text_heatmap(amap: AttentionMap, layer: int = -1) -> str:
    """Mean-over-heads cross-attention as text: each output piece with the source pieces
    it attended to most."""
    mean = amap.weights["cross"][layer].mean(0)  # [T, S]
    lines = []
    for row, piece in zip(mean, amap.target):
        top = row.topk(min(3, row.numel()))
        focus = ", ".join(
            f"{amap.source[j]} {w:.2f}" for w, j in zip(top.values.tolist(), top.indices.tolist())
        )
        lines.append(f"{piece:>15} <- {focus}")
    return "\n".join(lines)
