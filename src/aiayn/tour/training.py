"""Checkers for the data and training side (tour pages 4, 12, 13 and 14): padding a batch,
shifting the target for teacher forcing, label smoothing and the warmup schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.tour.report import FoundBugError, Report, name_of, run_checks


def check_pad(fn: Callable[[list[list[int]]], Tensor]) -> Report:
    """Check a learner's ``fn(rows) -> LongTensor [len(rows), longest]``: the rows
    right-padded with PAD (id 0 in aiayn; UNK is 3). Bugs: ``unk_for_padding``,
    ``left_padded``, ``wrong_pad_id``."""
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]

    def padded() -> Tensor:
        out = fn(rows)
        if not isinstance(out, Tensor) or out.dtype != torch.long:
            raise FoundBugError("wrong_return", "fn must return a LongTensor of ids", "04-masks.md")
        if tuple(out.shape) != (3, 4):
            raise FoundBugError(
                "wrong_shape",
                f"3 rows of at most 4 ids give [3, 4], got {list(out.shape)}",
                "04-masks.md",
            )
        return out

    def right() -> None:
        out = padded()
        if all(out[i, : len(r)].tolist() == r for i, r in enumerate(rows)):
            return
        if all(out[i, 4 - len(r) :].tolist() == r for i, r in enumerate(rows)):
            raise FoundBugError(
                "left_padded",
                "the ids sit at the end of each row: aiayn pads on the "
                "right, so position t is token t of every sentence",
                "04-masks.md",
            )
        raise FoundBugError("wrong_ids", "the rows do not start with their ids", "04-masks.md")

    def pad_id() -> None:
        fill = padded()[1, 2:].tolist() + padded()[2, 3:].tolist()
        if fill == [PAD_ID] * 3:
            return
        if fill == [UNK_ID] * 3:
            raise FoundBugError(
                "unk_for_padding",
                f"the rows are padded with UNK (id {UNK_ID}), not PAD (id {PAD_ID}). The "
                "padding mask and the loss look for PAD, so these positions are attended "
                "to and trained on as unknown words, and a sentence's output depends on "
                "how much padding its batch needed. (SentencePiece's default gives id 0 to "
                "<unk> and has no pad: padding with 0 there pads with UNK.)",
                "04-masks.md",
            )
        raise FoundBugError(
            "wrong_pad_id",
            f"the padding holds {sorted(set(fill))}, not PAD ({PAD_ID})",
            "04-masks.md",
        )

    return run_checks(
        f"check_pad({name_of(fn)})",
        [
            ("[rows, longest] LongTensor", padded),
            ("ids first, then padding", right),
            ("the padding is PAD", pad_id),
        ],
    )


def check_shift_target(fn: Callable) -> Report:
    """Check a learner's ``fn(tgt_ids) -> (tgt_in, tgt_out)`` for teacher forcing: for each
    target y, decoder input BOS + y and labels y + EOS (lists of ids)."""
    ys = [[7, 8, 9], [10]]

    def shifted() -> None:
        tgt_in, tgt_out = fn(ys)
        tgt_in, tgt_out = [list(r) for r in tgt_in], [list(r) for r in tgt_out]
        if tgt_in == [[BOS_ID, *y] for y in ys] and tgt_out == [[*y, EOS_ID] for y in ys]:
            return
        if tgt_in == tgt_out:
            raise FoundBugError(
                "not_shifted",
                "the decoder input equals the labels: position t is "
                "trained to output the token it is given (a copy)",
                "12-teacher-forcing.md",
            )
        if tgt_in == [[*y, EOS_ID] for y in ys]:
            raise FoundBugError(
                "swapped",
                "tgt_in and tgt_out are swapped: the decoder must see BOS "
                "first and predict EOS last",
                "12-teacher-forcing.md",
            )
        raise FoundBugError(
            "wrong_shift",
            f"for y = {ys[0]} expected tgt_in {[BOS_ID, *ys[0]]} and "
            f"tgt_out {[*ys[0], EOS_ID]}, got {tgt_in[0]} and {tgt_out[0]}",
            "12-teacher-forcing.md",
        )

    return run_checks(
        f"check_shift_target({name_of(fn)})", [("tgt_in = BOS + y, tgt_out = y + EOS", shifted)]
    )


def check_label_smoothing(fn: Callable) -> Report:
    """Check a learner's ``fn(logits [N, V], target [N], eps, pad_id) -> loss``: the
    cross-entropy against 1 - eps + eps/V on the target and eps/V elsewhere, summed over
    the non-pad targets (a mean over them is accepted too). Bugs: ``pads_counted``,
    ``smoothing_over_v_minus_1``, ``no_smoothing``, ``wrong_loss``."""
    g = torch.Generator().manual_seed(0)
    V, eps = 9, 0.1
    logits = torch.randn(6, V, generator=g, dtype=torch.float64)
    target = torch.tensor([3, 1, 4, 0, 5, 0])  # two pad targets (id 0)
    logp = logits.log_softmax(-1)
    real = target != PAD_ID

    def loss_with(spread: float, on_target: float, keep: Tensor) -> Tensor:
        q = torch.full((6, V), spread, dtype=torch.float64)
        q[torch.arange(6), target] = on_target
        return -(q * logp).sum(-1)[keep].sum()

    def value() -> None:
        got = float(fn(logits, target, eps, PAD_ID))
        n = int(real.sum())
        right = float(loss_with(eps / V, 1 - eps + eps / V, real))
        for total in (right, right / n):  # a sum, or a mean over the real targets
            if math.isclose(got, total, rel_tol=1e-5):
                return
        all_rows = torch.ones(6, dtype=torch.bool)
        candidates = {
            "pads_counted": loss_with(eps / V, 1 - eps + eps / V, all_rows),
            "smoothing_over_v_minus_1": loss_with(eps / (V - 1), 1 - eps, real),
            "no_smoothing": loss_with(0.0, 1.0, real),
        }
        explain = {
            "pads_counted": "the pad targets are counted: leave them out of the loss",
            "smoothing_over_v_minus_1": "eps is spread over the V - 1 other tokens; aiayn "
            "(like torch's cross_entropy(label_smoothing=...)) spreads it over all V",
            "no_smoothing": "this is plain cross-entropy: eps is not used",
        }
        for bug, loss in candidates.items():
            if any(math.isclose(got, float(t), rel_tol=1e-5) for t in (loss, loss / n)):
                raise FoundBugError(bug, explain[bug], "13-label-smoothing.md")
        raise FoundBugError(
            "wrong_loss",
            f"loss {got:.4f}, expected {right:.4f} (sum over the {n} real targets)",
            "13-label-smoothing.md",
        )

    return run_checks(
        f"check_label_smoothing({name_of(fn)})", [("the label-smoothed cross-entropy", value)]
    )


def check_noam_rate(fn: Callable[[int, int, int], float]) -> Report:
    """Check a learner's ``fn(step, d_model, warmup) -> learning rate``: Eq. 3,
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for steps from 1."""

    def rate() -> None:
        for d, w in ((512, 4000), (256, 1000)):
            for step in (1, 10, w // 2, w, w + 1, 4 * w, 25 * w):
                got = float(fn(step, d, w))
                want = d**-0.5 * min(step**-0.5, step * w**-1.5)
                if not math.isclose(got, want, rel_tol=1e-6):
                    raise FoundBugError(
                        "wrong_rate",
                        f"fn({step}, {d}, {w}) = {got:.6g}, Eq. 3 gives {want:.6g}",
                        "14-warmup.md",
                    )

    return run_checks(f"check_noam_rate({name_of(fn)})", [("Eq. 3 at every step", rate)])
