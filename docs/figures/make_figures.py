"""Every picture of the guided tour (docs/tour/), generated; none is drawn by hand.

    python docs/figures/make_figures.py --model runs/de-en      # or: make figures MODEL=...

Always, from the library alone: figure1.png (Figure 1 with traced shapes) and
worked_example.png (page 0), attention_shapes.png (page 3), masks.png (page 4),
head_split.png (page 5), positional_encoding.png (page 6), label_smoothing.png (page 13),
warmup.png (page 14); and from a small model trained here in seconds on the built-in
sample (docs/figures/generation.py), decoding_steps.png and beam_tree.png, with
decoding.txt, what page 15 prints of them.

With ``--model`` (a directory that `aiayn train` wrote, e.g. with recipes/multi30k.yaml):
training_curves.png and training_run.txt (its summary) from its metrics.jsonl and
recipe.yaml, and the attention heatmaps attention_cross.png and attention_heads.png, with
attention_heads.txt: the head statistics and readings pages 14 and 17 print. Without a
model those are left as they are. The tour's pages print the .txt files, and
tests/test_tour.py compares what they print with the pages, so text that quotes these
figures is checked against them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import diagrams  # docs/figures/diagrams.py, beside this file
import generation  # docs/figures/generation.py, beside this file
import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FuncFormatter

from aiayn.inspect.curves import read_metrics, series, smooth
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
    fig, axes = plt.subplots(
        1, 3, figsize=(15, 4.4), layout="constrained", gridspec_kw={"width_ratios": [3, 3, 2.4]}
    )
    for ax, table, title in (
        (axes[0], sinusoidal_table(100, 128), "sinusoidal_table(100, 128) (the library)"),
        (axes[1], buggy_table(100, 128), "halved-exponent bug: 10000^(i/d), not 10000^(2i/d)"),
    ):
        im = ax.imshow(table.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("dimension")
        ax.set_ylabel("position")
    fig.colorbar(im, ax=axes[:2], location="right", fraction=0.04, pad=0.01, label="value")
    table = sinusoidal_table(100, 128)
    for dim in (0, 10, 40, 80):
        axes[2].plot(table[:, dim].numpy(), label=f"dim {dim}")
    axes[2].set_title("single dimensions of the library's table", fontsize=10)
    axes[2].set_xlabel("position")
    axes[2].set_ylim(-1.1, 1.6)
    axes[2].legend(fontsize=8, loc="upper center", ncols=4, columnspacing=0.8)
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
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.8), layout="constrained")
    labels = ["<s>", "y1", "y2", "y3", "y4", "y5"]
    for ax, (mask, title) in zip(axes, panels):
        ax.imshow(mask.float().numpy(), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(6), labels, fontsize=8)
        ax.set_yticks(range(6), labels, fontsize=8)
        ax.set_xlabel("key (attended to)")
    axes[0].set_ylabel("query")
    fig.suptitle("white: may attend; black: masked (-inf before the softmax)", fontsize=10)
    save(fig, "masks.png")


def warmup() -> None:
    steps = range(1, 40001)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for d, w, label in (
        (512, 4000, "base: d_model 512, warmup 4000"),
        (1024, 4000, "big: d_model 1024, warmup 4000"),
        (256, 1000, "d_model 256, warmup 1000 (Multi30k-sized)"),
    ):
        ax.plot(steps, [noam_rate(s, d, w) for s in steps], label=label)
    ax.set_xlabel("update")
    ax.set_ylabel("learning rate")
    ax.set_title("lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, "warmup.png")


def _recipe(model_dir: Path) -> dict:
    import yaml

    path = model_dir / "recipe.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}


def training_curves(model_dir: Path) -> None:
    """training_curves.png and training_run.txt from the run's metrics.jsonl."""
    records = read_metrics(model_dir)
    recipe = _recipe(model_dir)
    eps, warmup = recipe.get("label_smoothing", 0.1), recipe.get("warmup")
    steps, loss = series(records, "train", "loss")
    _, nll = series(records, "train", "nll")
    _, lr = series(records, "train", "lr")
    v_steps, v_loss = series(records, "valid", "loss")
    _, v_ppl = series(records, "valid", "ppl")
    _, v_bleu = series(records, "valid", "bleu")
    v_nll = [math.log(p) for p in v_ppl]
    window = 50
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), layout="constrained")
    ax = axes[0]
    ax.plot(steps, loss, color="C0", alpha=0.15, lw=0.8)
    ax.plot(
        steps,
        smooth(loss, window),
        color="C0",
        label=f"train: label-smoothed loss (eps {eps}), mean of {window} updates",
    )
    ax.plot(
        steps,
        smooth(nll, window),
        color="C0",
        ls="--",
        label=f"train: NLL of the reference, mean of {window} updates",
    )
    ax.plot(v_steps, v_loss, "o-", color="C1", ms=4, label="val: label-smoothed loss")
    ax.plot(v_steps, v_nll, "o--", color="C1", ms=4, label="val: NLL = ln(perplexity)")
    ax.set_ylabel("nats per target token")
    ax.set_ylim(0, min(10, max(loss) * 1.05))
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(
        "loss (solid) is what training minimises; NLL (dashed) has no smoothing", fontsize=9
    )
    axes[1].plot(v_steps, v_bleu, "o-", color="C2", ms=4)
    axes[1].set_ylabel("val BLEU (greedy)")
    axes[1].set_title("validation BLEU", fontsize=9)
    axes[2].plot(steps, lr, color="C3")
    axes[2].yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.1e}" if y else "0"))
    axes[2].set_ylabel("learning rate")
    schedule = recipe.get("schedule", "noam")
    names = {"noam": "Eq. 3", "noam_cooldown": "Eq. 3, then a cool-down to 0"}
    axes[2].set_title(
        f"learning rate ({names.get(schedule, schedule + ' decay to 0')})", fontsize=9
    )
    for ax in axes:
        ax.set_xlabel("update")
        ax.tick_params(labelsize=8)
        if warmup and warmup <= steps[-1]:
            ax.axvline(warmup, color="#888", ls=":", lw=1)
    if warmup and warmup <= steps[-1]:
        # At the top of the panel, right of the line: clear of the axis ticks.
        axes[2].text(
            warmup,
            0.98,
            f" end of warmup ({warmup})",
            transform=axes[2].get_xaxis_transform(),
            fontsize=8,
            color="#555",
            va="top",
            ha="left",
        )

    fig.suptitle(f"training of {model_dir.name} (metrics.jsonl)", fontsize=10)
    save(fig, "training_curves.png")

    train = [r for r in records if r.get("kind") == "train"]
    minutes = max(r.get("seconds", 0) for r in train) / 60
    peak = max(range(len(lr)), key=lr.__getitem__)
    best = max(range(len(v_bleu)), key=v_bleu.__getitem__) if v_bleu else None
    model = recipe.get("model", {})
    fields = [
        f"{k} {model[k]}"
        for k in ("d_model", "n_heads", "n_layers", "d_ff", "dropout")
        if k in model
    ]
    fields += [f"schedule {recipe.get('schedule', 'noam')}"]
    fields += [
        f"{k} {recipe[k]}"
        for k in ("label_smoothing", "weight_decay", "warmup", "max_tokens", "time_limit_minutes")
        if k in recipe
    ]
    lines = [
        f"the run of training_curves.png: {model_dir.name}",
        "recipe: " + ", ".join(fields),
        f"updates: {steps[-1]} in {minutes:.1f} minutes"
        + (f" (warmup ends at update {warmup})" if warmup else ""),
        f"learning rate: peak {lr[peak]:.2e} at update {steps[peak]}, last {lr[-1]:.2e}",
        f"train, mean of the last {window} updates: label-smoothed loss "
        f"{smooth(loss, window)[-1]:.2f}, NLL {smooth(nll, window)[-1]:.2f}",
    ]
    if best is not None:
        lines.append(
            f"val: {len(v_steps)} validations; best BLEU (greedy) {v_bleu[best]:.1f} at update "
            f"{v_steps[best]}; last {v_bleu[-1]:.1f} at update {v_steps[-1]}, loss "
            f"{v_loss[-1]:.2f}, perplexity {v_ppl[-1]:.2f}"
        )
    (HERE / "training_run.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


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
    # What the drawn heads read: each query's strongest key, on the figure sentence.
    last = len(m.weights["cross"]) - 1
    sharp = torch.stack([mp.weights["cross"][last].max(-1).values.mean(-1) for mp in maps])
    sharp = sharp.mean(0)  # [h]: each cross head's mean strongest weight over the sentences
    lines.append(
        f"cross-attention layer {last + 1}, mean strongest weight per head: "
        + ", ".join(f"head {i + 1} {x:.2f}" for i, x in enumerate(sharp.tolist()))
    )
    sharpest = int(sharp.argmax())
    src = [p.replace("\u2581", "") for p in m.source]
    tgt = [p.replace("\u2581", "") for p in m.target]

    def reads(w: torch.Tensor, queries: list[str], keys: list[str]) -> str:
        return "  ".join(f"{queries[i]}<-{keys[j]}" for i, j in enumerate(w.argmax(-1).tolist()))

    for (kind, layer, head), what in ((prev_key, "previous-word"), (far_key, "long-range")):
        lines.append(
            f"reads, {what} head (encoder layer {layer + 1} head {head + 1}): "
            + reads(m.weights[kind][layer][head], src, src)
        )
    heads = m.weights["cross"][last]
    lines.append(
        f"reads, sharpest cross head ({sharpest + 1}): " + reads(heads[sharpest], tgt, src)
    )
    lines.append("reads, mean of the cross heads: " + reads(heads.mean(0), tgt, src))
    (HERE / "attention_heads.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))

    src, tgt = m.source, m.target  # with SentencePiece's "\u2581", as tour page 0 writes it
    size = 0.3 * max(len(src), len(tgt)) + 2
    fig, axes = plt.subplots(1, 2, figsize=(2 * size + 1, size), layout="constrained")
    for ax, (kind, layer, head), what in (
        (axes[0], prev_key, "a previous-word head"),
        (axes[1], far_key, "largest focused distance"),
    ):
        w = m.weights[kind][layer][head]
        labels = src if kind == "encoder" else ["<s>", *tgt[:-1]]
        im = ax.imshow(w.numpy(), cmap="viridis", vmin=0, vmax=1)
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
    fig.colorbar(im, ax=axes, fraction=0.03, label="attention weight")
    save(fig, "attention_heads.png")

    panels = [heads.mean(0), *heads]
    titles = ["mean of heads"] + [f"head {i + 1}" for i in range(len(heads))]
    cols, rows = 3, (len(panels) + 2) // 3
    width = 0.25 * len(src) + 1.5
    height = 0.25 * len(tgt) + 1.0
    fig, axes = plt.subplots(
        rows, cols, figsize=(cols * width, rows * height + 0.6), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, data, title in zip(axes.flat, panels, titles):
        im = ax.imshow(data.numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt)), tgt, fontsize=7)
    fig.colorbar(im, ax=axes, fraction=0.03, label="attention weight")
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
    out = save
    diagrams.figure1(out)
    diagrams.worked_example(out)
    diagrams.attention_shapes(out)
    diagrams.head_split(out)
    positional_encoding()
    masks()
    warmup()
    generation.label_smoothing(out)
    model, tokenizer = generation.sample_model()  # trained here, in seconds
    facts = generation.decoding_steps(out, model, tokenizer)
    facts += generation.beam_tree(out, model, tokenizer)
    (HERE / "decoding.txt").write_text("\n".join(facts) + "\n", encoding="utf-8")
    print("\n".join(facts))
    if args.model and Path(args.model).is_dir():
        training_curves(Path(args.model))
        attention(Path(args.model))
    else:
        print(f"no model directory {args.model!r}: kept the committed model figures")


if __name__ == "__main__":
    main()
