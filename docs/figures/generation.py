"""The pictures of label smoothing (tour page 13) and of generation (page 15), for
make_figures.py. The generation pictures come from a real model trained here in seconds:
the SentencePiece vocabulary and the small model of tests/conftest.py's
``train_sample_model`` (d_model 64, 2 + 2 layers, 100 full-batch updates on the first 60
built-in German-English pairs of tests/sample_data.py), so `make figures` needs no data.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from aiayn.train.loss import label_smoothed_cross_entropy

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "Zwei Mädchen springen Seil."  # held out: the model trained on pairs 0-59 only


def label_smoothing(out) -> None:
    """Left: the one-hot target and the smoothed one; right: the loss against the model's
    probability of the gold token, with and without smoothing."""
    V, eps, gold = 10, 0.1, 3
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
    ax = axes[0]
    tokens = torch.arange(V)
    smoothed = torch.full((V,), eps / V)
    smoothed[gold] += 1 - eps
    ax.bar(tokens - 0.2, (tokens == gold).float(), width=0.4, label="one-hot target (eps 0)")
    ax.bar(tokens + 0.2, smoothed, width=0.4, label=f"smoothed target q (eps {eps})")
    ax.set_xticks(range(V), [f"{i}" + (" (gold)" if i == gold else "") for i in range(V)])
    ax.set_xlabel(f"vocabulary entry (V = {V})")
    ax.set_ylabel("target probability")
    ax.set_title(f"q = (1 - eps) one-hot + eps / V: {1 - eps + eps / V:.2f} on gold, "
                 f"{eps / V:.2f} elsewhere", fontsize=9)  # fmt: skip
    ax.legend(fontsize=8)
    ax = axes[1]
    confidence = torch.linspace(0.02, 0.9999, 400)
    for e, style in ((0.0, "-"), (eps, "--")):
        losses = []
        for c in confidence.tolist():
            p = torch.full((1, V), (1 - c) / (V - 1))  # the rest spread evenly
            p[0, gold] = c
            loss, _, _ = label_smoothed_cross_entropy(p.log(), torch.tensor([gold]), e, pad_id=-1)
            losses.append(float(loss))
        ax.plot(confidence, losses, style, label=f"eps {e}")
    best = 1 - eps + eps / V
    ax.axvline(best, color="#888", ls=":", lw=1)
    ax.text(best, 0.98, f"best with eps {eps}: {best:.2f} ", transform=ax.get_xaxis_transform(),
            ha="right", va="top", fontsize=8, color="#555")  # fmt: skip
    ax.set_xlabel("the model's probability of the gold token (the rest spread evenly)")
    ax.set_ylabel("loss of one token")
    ax.set_ylim(0, 4)
    ax.set_title("eps 0: the loss falls until p(gold) = 1; with smoothing it rises again "
                 "past q(gold)", fontsize=9)  # fmt: skip
    ax.legend(fontsize=8)
    out(fig, "label_smoothing.png")


def sample_model():
    """(model, tokenizer) trained as tests/conftest.py's train_sample_model does."""
    sys.path.insert(0, str(ROOT / "tests"))
    from aiayn.checkpoint import load_model
    from conftest import train_sample_model

    directory = Path(tempfile.mkdtemp())
    model, tokenizer = load_model(train_sample_model(directory) / "checkpoint_best.pt")
    return model.eval(), tokenizer


def _piece(tokenizer, i: int) -> str:
    return {1: "<s>", 2: "</s>"}.get(i, tokenizer.id_to_piece(i))


@torch.no_grad()
def decoding_steps(out, model, tokenizer) -> list[str]:
    """Greedy decoding of SENTENCE as the decoder sees it: at step t its input (BOS and
    the tokens chosen so far) and its 4 most probable next tokens, the chosen one first."""
    from aiayn.decode import greedy

    src = torch.tensor([tokenizer.encode(SENTENCE)])
    memory = model.encode(src)
    prefix, rows = [1], []
    while len(prefix) < 20:
        logp = model.decode(torch.tensor([prefix]), memory, src)[0, -1].log_softmax(-1)
        top = logp.topk(4)
        rows.append((list(prefix), list(zip(top.indices.tolist(), top.values.exp().tolist()))))
        prefix.append(int(top.indices[0]))
        if prefix[-1] == 2:
            break
    library = greedy(model, src, max_new_tokens=20)[0].tolist()
    assert prefix[1:] == library[: len(prefix) - 1], (prefix, library)  # the same tokens
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(rows) + 1.2))
    ax.axis("off")
    ax.set_xlim(0, 11)
    ax.set_ylim(len(rows) + 0.2, -1.2)
    ax.text(0, -0.8, "step", fontsize=9, weight="bold")
    ax.text(0.6, -0.8, "decoder input (BOS + the tokens chosen so far)", fontsize=9, weight="bold")
    ax.text(5.6, -0.8, "next-token probabilities, 4 most probable", fontsize=9, weight="bold")
    for t, (inp, top) in enumerate(rows):
        ax.text(0.1, t, str(t + 1), fontsize=9, va="center")
        ax.text(0.6, t, " ".join(_piece(tokenizer, i) for i in inp), fontsize=9, va="center",
                family="DejaVu Sans Mono")  # fmt: skip
        for j, (i, p) in enumerate(top):
            x = 5.6 + 1.35 * j
            ax.add_patch(plt.Rectangle((x, t - 0.32), 1.25 * p, 0.64,
                                       color="C2" if j == 0 else "#ccc"))  # fmt: skip
            ax.text(x + 0.03, t, f"{_piece(tokenizer, i)} {p:.2f}", fontsize=8, va="center",
                    weight="bold" if j == 0 else "normal")  # fmt: skip
    ax.set_title(f'Greedy decoding of "{SENTENCE}": each step feeds the whole prefix (the '
                 "cache of page 15 feeds only its last token) and appends the most probable "
                 "(green)", fontsize=9)  # fmt: skip
    out(fig, "decoding_steps.png")
    chosen = " ".join(_piece(tokenizer, i) for i in prefix[1:])
    return [
        f"sentence: {SENTENCE}",
        f"greedy, {len(rows)} decoder calls: {chosen}",
        "greedy, probability of each chosen token: "
        + " ".join(f"{top[0][1]:.2f}" for _, top in rows),
    ]


@torch.no_grad()
def beam_tree(out, model, tokenizer, K: int = 3, alpha: float = 0.6) -> list[str]:
    """Beam search of SENTENCE with K beams, drawn as a tree: at each step every active
    beam's K best continuations; the K best of all of them by total log-prob survive
    (coloured), the rest are pruned (grey); an EOS among the K best ends a hypothesis.
    Stops as aiayn's beam_search does and checks that both find the same best output."""
    from aiayn.decode import beam_search, length_penalty

    src = torch.tensor([tokenizer.encode(SENTENCE)])
    memory = model.encode(src)
    beams = [((1,), 0.0, 0)]  # (prefix, log-prob, node id)
    nodes = {0: ("<s>", 0.0, 0, None, "kept")}  # id -> (piece, log-prob, step, parent, state)
    finished = []  # (score, tokens, log-prob)
    for t in range(1, 15):
        cands = []
        for prefix, score, node in beams:
            logp = model.decode(torch.tensor([prefix]), memory, src)[0, -1].log_softmax(-1)
            logp[[0, 1]] = float("-inf")  # PAD and BOS are never generated (banned_ids)
            top = logp.topk(2 * K)
            cands += [(score + float(v), prefix, int(i), node) for v, i in zip(*top)]
        cands.sort(key=lambda c: -c[0])
        best2k, alive = cands[: 2 * K], []
        for rank, (score, prefix, i, parent) in enumerate(cands):
            shown = sum(1 for c in cands[:rank] if c[3] == parent) < 2  # 2 children drawn
            state = "pruned"
            if rank < K and i == 2:
                state = "eos"
                tokens = list(prefix[1:])
                finished.append((score / length_penalty(len(tokens) + 1, alpha), tokens, score))
            elif (score, prefix, i, parent) in best2k and i != 2 and len(alive) < K:
                state = "kept"
            if shown or state != "pruned":
                node = len(nodes)
                nodes[node] = (_piece(tokenizer, i), score, t, parent, state)
                if state == "kept":
                    alive.append(((*prefix, i), score, node))
        beams = alive
        done = len(finished) >= K and sorted(f[0] for f in finished)[-K] >= beams[0][1] / (
            length_penalty(t + 1 + 50, alpha)
        )
        if done or not beams:
            break
    best = max(finished)
    library = beam_search(model, src, beam_size=K, alpha=alpha)[0][0]
    assert best[1] == library.tokens, (best, library)  # the tree's best is the library's
    fig, ax = plt.subplots(figsize=(11.5, 5.0))
    ax.axis("off")
    per_step: dict[int, list[int]] = {}
    for node, (_, _, step, _, _) in nodes.items():
        per_step.setdefault(step, []).append(node)
    y = {}
    for step in sorted(per_step):  # children beside their parents: few crossing lines
        ids = per_step[step]
        ids.sort(key=lambda n: (y.get(nodes[n][3], 0.0), nodes[n][1]))
        for rank, n in enumerate(ids):
            y[n] = rank - (len(ids) - 1) / 2
    colour = {"kept": "C0", "eos": "C2", "pruned": "#bbb"}
    best_path = set()
    for node, (_, score, _, _, state) in nodes.items():
        if state == "eos" and abs(score - best[2]) < 1e-6:
            while node is not None:
                best_path.add(node)
                node = nodes[node][3]
    for node, (piece, score, step, parent, state) in nodes.items():
        if parent is not None:
            ax.plot([nodes[parent][2], step], [y[parent], y[node]], color=colour[state],
                    lw=2.5 if node in best_path else 1, zorder=1)  # fmt: skip
        ax.text(step, y[node], f"{piece}\n{score:.2f}", ha="center", va="center", fontsize=7,
                color="#999" if state == "pruned" else "black", zorder=2,
                bbox={"boxstyle": "round", "fc": "white", "ec": colour[state],
                      "lw": 2 if node in best_path else 1})  # fmt: skip
    ax.set_title(f'Beam search, beam {K}, of "{SENTENCE}" (under each piece: the total '
                 "log-prob so far). Blue: kept; grey: pruned; green: EOS, a finished "
                 f"hypothesis; thick: the best by log p / lp (alpha {alpha}): "
                 f'"{tokenizer.decode(best[1])}"', fontsize=9, wrap=True)  # fmt: skip
    out(fig, "beam_tree.png")
    states = [state for _, _, _, _, state in nodes.values()]
    return [
        f"beam {K}, alpha {alpha}: {t} steps, {len(finished)} finished hypotheses, "
        f"{states.count('pruned')} pruned candidates drawn",
        f"beam {K}, best: {tokenizer.decode(best[1])} (log p {best[2]:.2f}, "
        f"score {best[0]:.2f}); beam_search agrees",
    ]
