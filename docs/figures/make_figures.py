"""Every picture of the guided tour (docs/tour/), generated; none is drawn by hand.

    python docs/figures/make_figures.py --model runs/de-en      # or: make figures MODEL=...

Always: positional_encoding.png, masks.png, warmup.png. With ``--model`` (a directory that
`aiayn train` wrote, e.g. with recipes/multi30k.yaml): training_curves.png from its
metrics.jsonl and the attention heatmaps attention_cross.png and attention_heads.png,
plus attention_heads.txt with the head statistics the tour quotes. Without a model those
are left as they are (the committed ones come from a Multi30k de-en model trained with
recipes/multi30k.yaml for 32 minutes: 7.6M parameters, 928 updates; see tour page 17).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from aiayn.model.embedding import sinusoidal_table
from aiayn.model.masks import causal_mask, decoder_self_mask, padding_mask
from aiayn.train.schedule import noam_rate

HERE = Path(__file__).resolve().parent
# The first six Multi30k val.de sentences: the heads are scored over them, one is drawn.
SENTENCES = [
    "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
    "Ein Mann schläft in einem grünen Raum auf einem Sofa.",
    "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
    "Zwei Männer bauen eine blaue Eisfischerhütte auf einem zugefrorenen See auf",
    "Ein Mann mit beginnender Glatze, der eine rote Rettungsweste trägt, sitzt in einem "
    "kleinen Boot.",
    "Eine Frau in einem rotem Mantel, die eine vermutlich aus Asien stammende Handtasche in "
    "einem blauen Farbton hält, springt für einen Schnappschuss in die Luft.",
]
FIGURE_SENTENCE = 2  # the one drawn


def save(fig, name: str) -> None:
    path = HERE / name
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path.relative_to(HERE.parents[1])}")


def buggy_table(max_len: int, d_model: int) -> torch.Tensor:
    """The halved-exponent bug of tour page 6: exponent i / d_model instead of 2i / d_model."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    i = torch.arange(d_model // 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, i / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table


def positional_encoding() -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [3, 3, 2]})
    for ax, table, title in (
        (axes[0], sinusoidal_table(100, 128), "sinusoidal_table(100, 128) (the library)"),
        (axes[1], buggy_table(100, 128), "halved-exponent bug: 10000^(i/d), not 10000^(2i/d)"),
    ):
        im = ax.imshow(table.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("dimension")
        ax.set_ylabel("position")
    fig.colorbar(im, ax=axes[:2], fraction=0.02)
    table = sinusoidal_table(100, 128)
    for dim in (0, 10, 40, 80):
        axes[2].plot(table[:, dim].numpy(), label=f"dim {dim}")
    axes[2].set_title("single dimensions over positions", fontsize=10)
    axes[2].set_xlabel("position")
    axes[2].legend(fontsize=8, loc="lower left")
    save(fig, "positional_encoding.png")


def masks() -> None:
    pad = 0
    tgt_in = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 5, 6, pad, pad, pad]])
    panels = [
        (padding_mask(tgt_in, pad)[1, 0].expand(6, 6), "padding mask, sentence 2\n(3 pads)"),
        (causal_mask(6)[0, 0], "causal (look-ahead) mask"),
        (decoder_self_mask(tgt_in, pad)[1, 0], "decoder self-attention mask,\nsentence 2"),
        (decoder_self_mask(tgt_in, pad)[0, 0], "decoder self-attention mask,\nsentence 1"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.6))
    labels = ["<s>", "y1", "y2", "y3", "y4", "y5"]
    for ax, (mask, title) in zip(axes, panels):
        ax.imshow(mask.float().numpy(), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(6), labels, fontsize=8)
        ax.set_yticks(range(6), labels, fontsize=8)
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query")
    fig.suptitle("white: may attend; black: masked (-inf before the softmax)", fontsize=10)
    save(fig, "masks.png")


def warmup() -> None:
    steps = range(1, 40001)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for d, w, label in (
        (512, 4000, "base: d_model 512, warmup 4000"),
        (1024, 4000, "big: d_model 1024, warmup 4000"),
        (256, 1000, "recipes/multi30k.yaml: d_model 256, warmup 1000"),
    ):
        ax.plot(steps, [noam_rate(s, d, w) for s in steps], label=label)
    ax.set_xlabel("update")
    ax.set_ylabel("learning rate")
    ax.set_title("lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, "warmup.png")


def training_curves(model_dir: Path) -> None:
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    window = 50
    smooth = [
        sum(r["nll"] for r in train[max(0, i - window + 1) : i + 1]) / min(i + 1, window)
        for i in range(len(train))
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    steps = [r["step"] for r in train]
    axes[0].plot(steps, [r["loss"] for r in train], alpha=0.25, label="train loss (smoothed LS)")
    axes[0].plot(steps, smooth, label=f"train NLL, mean of {window} updates")
    axes[0].plot([r["step"] for r in valid], [r["loss"] for r in valid], "o-", label="val loss")
    axes[0].set_ylabel("loss per target token (nats)")
    axes[0].set_ylim(0, 10)
    axes[0].legend(fontsize=8)
    axes[1].plot([r["step"] for r in valid], [r["bleu"] for r in valid], "o-", color="C2")
    axes[1].set_ylabel("val BLEU (greedy)")
    axes[2].plot(steps, [r["lr"] for r in train], color="C3")
    axes[2].set_ylabel("learning rate")
    for ax in axes:
        ax.set_xlabel("update")
    fig.suptitle(f"training of {model_dir.name} (metrics.jsonl)", fontsize=10)
    save(fig, "training_curves.png")


def attention(model_dir: Path) -> None:
    from aiayn.checkpoint import load_model, resolve_checkpoint
    from aiayn.inspect.attention import (
        attention_map,
        mean_attention_distance,
        offset_attention,
    )

    torch.set_num_threads(1)
    model, tokenizer = load_model(resolve_checkpoint(model_dir))
    maps = [attention_map(model, tokenizer, s) for s in SENTENCES]
    # Score every self-attention head over the sentences: the weight it puts on the previous
    # piece, its mean distance, and its *focused* distance (the weight of its strongest key
    # times that key's distance: large only for heads that look sharply far away).
    stats = {}  # (kind, layer, head) -> (previous, distance, focused)
    for kind in ("encoder", "decoder_self"):
        per_sentence = []
        for m in maps:
            w = torch.stack(m.weights[kind])  # [L, h, T, T]
            top, arg = w.max(-1)
            far = (torch.arange(w.size(-1)) - arg).abs().float()
            per_sentence.append(
                torch.stack(
                    [offset_attention(w, -1), mean_attention_distance(w), (top * far).mean(-1)]
                )
            )
        mean = torch.stack(per_sentence).mean(0)  # [3, L, h]
        for layer in range(mean.size(1)):
            for head in range(mean.size(2)):
                stats[kind, layer, head] = tuple(mean[:, layer, head].tolist())
    lines = ["self-attention heads, mean over the 6 sentences of docs/figures/make_figures.py"]
    lines += ["kind          layer head  previous-piece weight  mean distance  focused distance"]
    for (kind, layer, head), (p, d, f) in stats.items():
        lines.append(f"{kind:12s} {layer + 1:6d} {head + 1:4d}  {p:21.2f}  {d:13.2f}  {f:16.2f}")
    # The paper's Figures 3-5 show encoder self-attention; so do these.
    prev_key = max((k for k in stats if k[0] == "encoder"), key=lambda k: stats[k][0])
    far_key = max((k for k in stats if k[0] == "encoder"), key=lambda k: stats[k][2])
    lines.append(
        "previous-word head: {} layer {} head {}".format(
            prev_key[0], *[x + 1 for x in prev_key[1:]]
        )
    )
    lines.append(
        "long-range head: {} layer {} head {}".format(far_key[0], *[x + 1 for x in far_key[1:]])
    )
    m = maps[FIGURE_SENTENCE]
    lines.append(f"figure sentence: {SENTENCES[FIGURE_SENTENCE]}")
    lines.append(f"its translation: {tokenizer.decode(tokenizer.encode(''.join(m.target[:-1])))}")
    (HERE / "attention_heads.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))

    src = [p.replace("\u2581", "_") for p in m.source]
    tgt = [p.replace("\u2581", "_") for p in m.target]
    size = 0.3 * max(len(src), len(tgt)) + 2
    fig, axes = plt.subplots(1, 2, figsize=(2 * size + 1, size))
    for ax, (kind, layer, head), what in (
        (axes[0], prev_key, "a previous-word head"),
        (axes[1], far_key, "a long-range head"),
    ):
        w = m.weights[kind][layer][head]
        labels = src if kind == "encoder" else ["<s>", *tgt[:-1]]
        ax.imshow(w.numpy(), cmap="viridis", vmin=0, vmax=1)
        p, d, f = stats[kind, layer, head]
        name = "encoder" if kind == "encoder" else "decoder self-attention"
        ax.set_title(
            f"{name} layer {layer + 1}, head {head + 1}: {what}\n"
            f"(previous-piece weight {p:.2f}, focused distance {f:.2f})",
            fontsize=9,
        )
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    save(fig, "attention_heads.png")

    last = len(m.weights["cross"]) - 1
    heads = m.weights["cross"][last]
    panels = [heads.mean(0), *heads]
    titles = ["mean of heads"] + [f"head {i + 1}" for i in range(len(heads))]
    cols, rows = 3, (len(panels) + 2) // 3
    width = 0.25 * len(src) + 1.5
    height = 0.25 * len(tgt) + 1.0
    fig, axes = plt.subplots(rows, cols, figsize=(cols * width, rows * height), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, data, title in zip(axes.flat, panels, titles):
        ax.imshow(data.numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt)), tgt, fontsize=7)
    fig.suptitle(
        f"encoder-decoder attention, last layer ({last + 1}): rows output pieces, "
        "columns source pieces",
        fontsize=10,
    )
    save(fig, "attention_cross.png")
    assert math.isfinite(float(heads.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a trained model directory (metrics.jsonl, checkpoint)")
    args = parser.parse_args()
    positional_encoding()
    masks()
    warmup()
    if args.model and Path(args.model).is_dir():
        training_curves(Path(args.model))
        attention(Path(args.model))
    else:
        print(f"no model directory {args.model!r}: kept the committed model figures")


if __name__ == "__main__":
    main()
