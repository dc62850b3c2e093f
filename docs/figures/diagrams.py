"""The tour's diagrams, drawn from the library's own tensors (imported by make_figures.py):
Figure 1 with traced shapes, the worked example of page 0, attention with every shape
(page 3) and the head split in memory (page 5)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Circle, FancyBboxPatch, Polygon

from aiayn import Transformer, TransformerConfig
from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.tour import (
    SOURCE_PIECES,
    TARGET_PIECES,
    WORKED_SENTENCE,
    WORKED_VECTORS,
    trace_shapes,
)

COLORS = {
    "embed": "#f6c9c4",
    "attn": "#f9dcae",
    "norm": "#f1f0a8",
    "ffn": "#c4e4f3",
    "linear": "#dcd2f2",
    "softmax": "#cde9c6",
}
SHAPE = dict(family="monospace", fontsize=8.5, color="#1f3f8f")


def _box(ax, x, y, text, color, w=3.0, h=0.55):
    ax.add_patch(
        FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                       facecolor=color, edgecolor="#333", linewidth=1)
    )  # fmt: skip
    ax.text(x, y, text, ha="center", va="center", fontsize=10)


def _arrow(ax, start, end, color="#333"):
    style = dict(arrowstyle="-|>", color=color, lw=1.2, shrinkA=0, shrinkB=0)
    ax.annotate("", xy=end, xytext=start, arrowprops=style)


def _shape(ax, x, y, shape, note=""):
    ax.text(x + 0.12, y, f"{list(shape)}{note}", ha="left", va="center", **SHAPE)


def _residual(ax, x, y_from, y_to):
    """The residual path: around the sub-layer, into the Add & Norm box's left side."""
    left = x - 1.75
    ax.plot([x, left, left], [y_from, y_from, y_to], color="#333", lw=1)
    _arrow(ax, (left, y_to), (x - 1.5, y_to))


def figure1(out) -> None:
    """Figure 1 of the paper (base model) with the shapes :func:`trace_shapes` observed."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.base(vocab_size=37000))
    src = torch.randint(4, 37000, (1, len(SOURCE_PIECES)))
    tgt_in = torch.randint(4, 37000, (1, 1 + len(TARGET_PIECES)))
    s = {stage.key: stage.shape for stage in trace_shapes(model, src, tgt_in)}
    cfg = model.cfg
    del model

    fig, ax = plt.subplots(figsize=(14, 15))
    ax.set_xlim(0, 14)
    ax.set_ylim(0, 15)
    ax.axis("off")
    for x, top in ((4.0, 8.5), (10.0, 10.9)):  # the two stacks of N layers
        ax.add_patch(
            FancyBboxPatch((x - 1.95, 3.25), 3.9, top - 3.25, boxstyle="round,pad=0.05",
                           facecolor="#f3f3f3", edgecolor="#777")
        )  # fmt: skip
        ax.text(x - 2.05 if x < 7 else x + 2.05, 3.45, f"N = {cfg.n_layers} x",
                ha="right" if x < 7 else "left", fontsize=11)  # fmt: skip

    # Encoder, bottom to top.
    x = 4.0
    ax.text(x, 0.45, "Inputs: " + " ".join(p.replace("\u2581", "") for p in SOURCE_PIECES),
            ha="center", fontsize=10)  # fmt: skip
    _arrow(ax, (x, 0.7), (x, 1.32))
    _shape(ax, x, 1.0, s["src"], "  token ids")
    _box(ax, x, 1.6, "Input Embedding  x sqrt(d_model)", COLORS["embed"], w=3.5)
    _arrow(ax, (x, 1.88), (x, 2.37))
    _shape(ax, x, 2.12, s["src_embed"])
    ax.add_patch(Circle((x, 2.55), 0.18, facecolor="white", edgecolor="#333"))
    ax.text(x, 2.55, "+", ha="center", va="center", fontsize=13)
    ax.text(x - 1.2, 2.55, "Positional\nEncoding", ha="right", va="center", fontsize=9)
    _arrow(ax, (x - 1.15, 2.55), (x - 0.18, 2.55))
    _arrow(ax, (x, 2.73), (x, 3.83))
    _shape(ax, x, 3.05, s["src_pos"])
    _box(ax, x, 4.1, "Multi-Head Attention", COLORS["attn"])
    ax.text(1.95, 4.55, f"per head: Q, K, V\n{list(s['enc_q'])}\nweights\n{list(s['enc_weights'])}",
            ha="right", va="center", **SHAPE)  # fmt: skip
    _residual(ax, x, 3.55, 5.1)
    _arrow(ax, (x, 4.38), (x, 4.83))
    _shape(ax, x, 4.6, s["enc_attn"])
    _box(ax, x, 5.1, "Add & Norm", COLORS["norm"])
    _arrow(ax, (x, 5.38), (x, 6.23))
    _box(ax, x, 6.5, "Feed Forward", COLORS["ffn"])
    ax.text(1.95, 6.5, f"inside: {list(s['enc_ffn_inner'])}", ha="right", va="center", **SHAPE)
    _residual(ax, x, 5.8, 7.5)
    _arrow(ax, (x, 6.78), (x, 7.23))
    _box(ax, x, 7.5, "Add & Norm", COLORS["norm"])
    _arrow(ax, (x, 7.78), (x, 9.1))
    _shape(ax, x, 8.8, s["memory"], "  memory")

    # The memory goes to every decoder layer's encoder-decoder attention, as K and V.
    ax.plot([x, x, 7.1, 7.1], [9.1, 9.3, 9.3, 6.5], color="#333", lw=1.2)
    _arrow(ax, (7.1, 6.5), (8.5, 6.5))
    ax.text(7.2, 6.7, "K, V", fontsize=9)

    # Decoder, bottom to top.
    x = 10.0
    ax.text(x, 0.45, "Outputs (shifted right): <s> " + " ".join(
        p.replace("\u2581", "") for p in TARGET_PIECES), ha="center", fontsize=10)  # fmt: skip
    _arrow(ax, (x, 0.7), (x, 1.32))
    _shape(ax, x, 1.0, s["tgt_in"], "  token ids")
    _box(ax, x, 1.6, "Output Embedding  x sqrt(d_model)", COLORS["embed"], w=3.5)
    _arrow(ax, (x, 1.88), (x, 2.37))
    _shape(ax, x, 2.12, s["tgt_embed"])
    ax.add_patch(Circle((x, 2.55), 0.18, facecolor="white", edgecolor="#333"))
    ax.text(x, 2.55, "+", ha="center", va="center", fontsize=13)
    ax.text(x + 1.2, 2.55, "Positional\nEncoding", ha="left", va="center", fontsize=9)
    _arrow(ax, (x + 1.15, 2.55), (x + 0.18, 2.55))
    _arrow(ax, (x, 2.73), (x, 3.83))
    _shape(ax, x, 3.05, s["tgt_pos"])
    _box(ax, x, 4.1, "Masked Multi-Head Attention", COLORS["attn"])
    ax.text(12.05, 4.4, f"per head: Q, K, V\n{list(s['dec_self_q'])}\nweights (causal)\n"
            f"{list(s['dec_self_weights'])}", ha="left", va="center", **SHAPE)  # fmt: skip
    _residual(ax, x, 3.55, 5.1)
    _arrow(ax, (x, 4.38), (x, 4.83))
    _box(ax, x, 5.1, "Add & Norm", COLORS["norm"])
    _arrow(ax, (x, 5.38), (x, 6.23))
    ax.text(x + 0.12, 5.95, "Q", fontsize=9)
    _box(ax, x, 6.5, "Multi-Head Attention", COLORS["attn"])
    ax.text(12.05, 6.5, f"Q per head {list(s['dec_cross_q'])}\nK, V per head\n"
            f"{list(s['dec_cross_k'])}\nweights (target x source)\n{list(s['dec_cross_weights'])}",
            ha="left", va="center", **SHAPE)  # fmt: skip
    _residual(ax, x, 5.65, 7.5)
    _arrow(ax, (x, 6.78), (x, 7.23))
    _box(ax, x, 7.5, "Add & Norm", COLORS["norm"])
    _arrow(ax, (x, 7.78), (x, 8.63))
    _box(ax, x, 8.9, "Feed Forward", COLORS["ffn"])
    ax.text(12.05, 8.9, f"inside: {list(s['dec_ffn_inner'])}", ha="left", va="center", **SHAPE)
    _residual(ax, x, 8.1, 9.9)
    _arrow(ax, (x, 9.18), (x, 9.63))
    _box(ax, x, 9.9, "Add & Norm", COLORS["norm"])
    _arrow(ax, (x, 10.18), (x, 11.63))
    _shape(ax, x, 11.25, s["dec_layer"])
    _box(ax, x, 11.9, "Linear  (x E^T, tied)", COLORS["linear"])
    _arrow(ax, (x, 12.18), (x, 12.63))
    _shape(ax, x, 12.4, s["logits"], "  logits")
    _box(ax, x, 12.9, "Softmax", COLORS["softmax"])
    _arrow(ax, (x, 13.18), (x, 13.6))
    _shape(ax, x, 13.4, s["logits"], "  probabilities")
    ax.text(x, 13.85, "Output Probabilities: the next piece at each of the 8 positions",
            ha="center", fontsize=10)  # fmt: skip
    ax.text(7.0, 14.6, f"Figure 1 of the paper with shapes: the base model (d_model "
            f"{cfg.d_model}, h {cfg.n_heads}, d_k {cfg.d_k}, d_ff {cfg.d_ff}, vocabulary "
            f"{cfg.src_vocab_size:,}), one sentence pair", ha="center", fontsize=11)  # fmt: skip
    ax.text(7.0, 14.25, "shapes [batch, positions, ...] observed by aiayn.tour.trace_shapes; "
            "only the first of the N layers is shown, all are alike", ha="center",
            fontsize=9, color="#555")  # fmt: skip
    out(fig, "figure1.png")


def worked_example(out) -> None:
    """Page 0's three vectors, their triangle (convex hull) and each query's output."""
    X = torch.tensor([WORKED_VECTORS[w] for w in WORKED_SENTENCE])[None, None]
    result, weights = scaled_dot_product_attention(X, X, X, need_weights=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    hull = [WORKED_VECTORS[w] for w in ("I", "saw", "a")]
    ax.add_patch(Polygon(hull, closed=True, facecolor="#e8eef9", edgecolor="#9ab"))
    for (word, v), color in zip(WORKED_VECTORS.items(), ("C0", "C1", "C2")):
        ax.annotate("", xy=v, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=color, lw=2))
        ax.text(v[0] + 0.05, v[1] + 0.06, f'"{word}" {v}', color=color, fontsize=10)
    o = result[0, 0, 3].tolist()
    w = weights[0, 0, 3].tolist()
    ax.plot(*o, marker="*", markersize=15, color="C3")
    ax.annotate(
        f'output of the query "saw" = ({o[0]:.3f}, {o[1]:.3f})\n'
        f"= {w[0]:.3f} I + {w[1] + w[3]:.3f} saw + {w[2]:.3f} a",
        xy=o,
        xytext=(-0.2, -0.48),
        fontsize=9,
        color="C3",
        ha="left",
        arrowprops=dict(arrowstyle="->", color="C3", lw=1),
    )
    ax.text(
        -1.25,
        1.42,
        "the triangle is the convex hull of the values: every weighted\n"
        "average with positive weights summing to 1 lands inside it",
        fontsize=8.5,
        color="#567",
        va="top",
    )
    ax.axhline(0, color="#ccc", lw=0.8)
    ax.axvline(0, color="#ccc", lw=0.8)
    ax.set_xlim(-1.3, 1.8)
    ax.set_ylim(-0.6, 1.5)
    ax.set_aspect("equal")
    ax.set_title('"I saw a saw": queries = keys = values = the 2-D vectors, d_k = 2', fontsize=10)
    out(fig, "worked_example.png")


def _matrix(ax, m, title, cmap="RdBu_r", vmax=None):
    vmax = vmax or float(m.abs().max())
    ax.imshow(m.numpy(), cmap=cmap, vmin=-vmax if cmap == "RdBu_r" else 0, vmax=vmax)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def attention_shapes(out) -> None:
    """softmax(Q K^T / sqrt(d_k)) V for one head of one sentence, every operand drawn with
    its shape (page 3)."""
    torch.manual_seed(3)
    T_q, T_k, d_k = 4, 6, 8
    q, k, v = torch.randn(T_q, d_k), torch.randn(T_k, d_k), torch.randn(T_k, d_k)
    o, w = scaled_dot_product_attention(q[None, None], k[None, None], v[None, None],
                                        need_weights=True)  # fmt: skip
    scores = q @ k.T / d_k**0.5
    panels = [
        (q, f"Q\n[T_q={T_q}, d_k={d_k}]", "RdBu_r"),
        (k.T, f"K^T\n[d_k={d_k}, T_k={T_k}]", "RdBu_r"),
        (scores, f"scores\n= Q K^T / sqrt(d_k)\n[T_q={T_q}, T_k={T_k}]", "RdBu_r"),
        (w[0, 0], f"weights: each row\nsums to 1\n[T_q={T_q}, T_k={T_k}]", "Greens"),
        (v, f"V\n[T_k={T_k}, d_v={d_k}]", "RdBu_r"),
        (o[0, 0], f"output\n= weights V\n[T_q={T_q}, d_v={d_k}]", "RdBu_r"),
    ]
    ops = ["@", "then\n/ sqrt(d_k)", "softmax\nper row", "@", "="]
    widths = []
    for i, (m, _, _) in enumerate(panels):
        widths.append(m.shape[1])
        if i < len(ops):
            widths.append(2.6 if "\n" in ops[i] else 1.4)
    fig, axes = plt.subplots(1, len(widths), figsize=(18, 4.2),
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    for i, ax in enumerate(axes):
        if i % 2:
            ax.axis("off")
            ax.text(0.5, 0.5, ops[i // 2], ha="center", va="center", fontsize=13)
        else:
            m, title, cmap = panels[i // 2]
            _matrix(ax, m, title, cmap, 1.0 if cmap == "Greens" else None)
            if cmap == "Greens":  # the weights, written out: each row sums to 1
                for (r, c), value in zip(
                    torch.cartesian_prod(torch.arange(T_q), torch.arange(T_k)).tolist(),
                    m.flatten().tolist(),
                ):
                    ax.text(
                        c,
                        r,
                        f"{value:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if value > 0.5 else "black",
                    )
    fig.suptitle("Scaled dot-product attention, one head of one sentence. aiayn's tensors "
                 "carry [batch, heads] in front: Q [B, h, T_q, d_k], weights [B, h, T_q, T_k]",
                 fontsize=10)  # fmt: skip
    out(fig, "attention_shapes.png")


def _cells(ax, values, title, d_k, row_name=None):
    """A grid of (position, feature) labels, coloured by the head that owns the feature;
    ``row_name`` labels the rows (the axis the tensor calls positions)."""
    rows, cols = values.shape
    tints = ["#cfe0f5", "#f8d9b5", "#d5ecd0", "#ecd5ec"]
    for r in range(rows):
        for c in range(cols):
            t, f = divmod(int(values[r, c]), 100)
            ax.add_patch(plt.Rectangle((c, rows - 1 - r), 1, 1, facecolor=tints[f // d_k],
                                       edgecolor="#555", lw=0.8))  # fmt: skip
            ax.text(c + 0.5, rows - 0.5 - r, f"p{t}\nf{f}", ha="center", va="center", fontsize=7.5)
        if row_name:
            ax.text(-0.15, rows - 0.5 - r, f"{row_name}={r}", ha="right", va="center", fontsize=8)
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def head_split(out) -> None:
    """How [B, T, d_model] becomes [B, h, T, d_k], with the library's own _split_heads,
    and what a bare reshape does instead (page 5)."""
    T, d_model, h = 3, 8, 2
    d_k = d_model // h
    x = torch.tensor([[t * 100 + f for f in range(d_model)] for t in range(T)], dtype=torch.float)
    right = MultiHeadAttention(d_model, h)._split_heads(x[None])[0]  # [h, T, d_k]
    wrong = x[None].reshape(1, h, T, d_k)[0]
    merged = right[None].transpose(1, 2).reshape(1, T, d_model)[0]
    assert torch.equal(merged, x)
    fig = plt.figure(figsize=(13, 6.2))
    grid = fig.add_gridspec(3, 3, height_ratios=[3, 3, 1.3], hspace=0.5, wspace=0.25)
    _cells(fig.add_subplot(grid[0:2, 0]), x,
           f"x: [T={T}, d_model={d_model}], one row per position\n(colour: the head that "
           "owns the feature)", d_k, "t")  # fmt: skip
    for i in range(h):
        _cells(fig.add_subplot(grid[i, 1]), right[i],
               f"right: view [T, h, d_k], transpose -> head {i}\nfeatures {i * d_k}.."
               f"{(i + 1) * d_k - 1} of every position", d_k, "t")  # fmt: skip
        _cells(fig.add_subplot(grid[i, 2]), wrong[i],
               f"bug: reshape to [h, T, d_k] -> 'head {i}'\nnumbers {i * T * d_k}.."
               f"{(i + 1) * T * d_k - 1} of memory: row t is not position t", d_k, "t")  # fmt: skip
    strip = fig.add_subplot(grid[2, :])
    _cells(strip, x.reshape(1, -1), "x in memory (row-major): position 0's features, then "
           "position 1's, ...; merging is the same in reverse: transpose back, then reshape",
           d_k)  # fmt: skip
    out(fig, "head_split.png")
