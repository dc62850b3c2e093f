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
        "04-masks.md",
    )


def check_shift_target(fn: Callable) -> Report:
    """Check a learner's ``fn(tgt_ids) -> (tgt_in, tgt_out)`` for teacher forcing: for each
    target y, decoder input BOS + y and labels y + EOS (lists of ids)."""
    ys = [[7, 8, 9], [10]]

    def shifted() -> None:
        tgt_in, tgt_out = fn([list(y) for y in ys])  # its own copy: it may edit it
        tgt_in = [[int(t) for t in r] for r in tgt_in]  # ids as ints, from a tensor's rows too
        tgt_out = [[int(t) for t in r] for r in tgt_out]
        want_in, want_out = [[BOS_ID, *y] for y in ys], [[*y, EOS_ID] for y in ys]
        if tgt_in == want_in and tgt_out == want_out:
            return
        rows = zip(tgt_in, tgt_out, want_in, want_out)  # quote the first row that differs
        i = next((i for i, (a, b, c, d) in enumerate(rows) if (a, b) != (c, d)), 0)
        i = min(i, len(tgt_in) - 1, len(tgt_out) - 1, len(ys) - 1)
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
        said = f"for y = {ys[i]} tgt_in is {tgt_in[i]} and tgt_out {tgt_out[i]}: "
        if tgt_in == [[BOS_ID, *y, EOS_ID] for y in ys]:
            raise FoundBugError(
                "eos_in_input",
                said + "EOS stays in the decoder input. The input is BOS + y (no EOS: "
                "nothing is predicted after it), so it lines up with the labels y + EOS.",
                "12-teacher-forcing.md",
            )
        if tgt_out in ([[BOS_ID, *y, EOS_ID] for y in ys], [[BOS_ID, *y] for y in ys]):
            raise FoundBugError(
                "bos_in_output",
                said + "BOS is among the labels. BOS is only ever given, never "
                "predicted: the labels are y + EOS, the input shifted one step left.",
                "12-teacher-forcing.md",
            )
        if tgt_in == [[BOS_ID, *y] for y in ys] and tgt_out == [list(y) for y in ys]:
            raise FoundBugError(
                "no_eos",
                said + "the labels lack EOS (and are one shorter than the input), so the "
                "model never learns to end a sentence. The labels are y + EOS.",
                "12-teacher-forcing.md",
            )
        padded = all(
            len(a) >= len(b) and a[: len(b)] == b and set(a[len(b) :]) <= {PAD_ID}
            for got, want in ((tgt_in, want_in), (tgt_out, want_out))
            for a, b in zip(got, want)
        )
        raise FoundBugError(
            "wrong_shift",
            f"for y = {ys[i]} expected tgt_in {want_in[i]} and tgt_out {want_out[i]}, got "
            f"{tgt_in[i]} and {tgt_out[i]}"
            + (
                ": the rows are right but padded with PAD. fn returns one list of ids per "
                "sentence, unpadded; the batch is padded afterwards (page 4's pad)."
                if padded and len(tgt_in) == len(ys) == len(tgt_out)
                else ""
            ),
            "12-teacher-forcing.md",
        )

    return run_checks(
        f"check_shift_target({name_of(fn)})",
        [("tgt_in = BOS + y, tgt_out = y + EOS", shifted)],
        "12-teacher-forcing.md",
    )


def _smoothed(V: int, target: Tensor, spread: float, on_target: float, pad_col: bool) -> Tensor:
    """A target distribution per row: ``on_target`` on the target, ``spread`` elsewhere
    (and 0 in the pad column when ``pad_col`` is False)."""
    q = torch.full((len(target), V), spread, dtype=torch.float64)
    if not pad_col:
        q[:, PAD_ID] = 0.0
    q[torch.arange(len(target)), target] = on_target
    return q


def check_label_smoothing(fn: Callable) -> Report:
    """Check a learner's ``fn(logits [N, V], target [N], eps, pad_id) -> loss`` (or a tuple
    starting with it): the cross-entropy against 1 - eps + eps/V on the target and eps/V
    elsewhere, summed over the non-pad targets (a mean over them is accepted too). The KL
    divergence from that distribution (``F.kl_div``) is accepted as well: it differs by the
    distribution's entropy, a constant, so its gradient is the same. Bugs:
    ``pads_counted``, ``mean_counts_pads``, ``smoothing_over_v_minus_1``,
    ``smoothing_skips_pad_column``, ``target_gets_1_minus_eps``, ``no_smoothing``,
    ``no_log_softmax``, ``wrong_loss``, ``ignores_arguments``."""
    g = torch.Generator().manual_seed(0)
    V, eps = 9, 0.1
    logits = torch.randn(6, V, generator=g, dtype=torch.float64)
    target = torch.tensor([3, 1, 4, 0, 5, 0])  # two pad targets (id 0)
    logp = logits.log_softmax(-1)
    real, every = target != PAD_ID, torch.ones(6, dtype=torch.bool)
    n = int(real.sum())
    right = _smoothed(V, target, eps / V, 1 - eps + eps / V, True)

    def totals(q: Tensor, keep: Tensor, logp: Tensor = logp, n: int = n) -> list[float]:
        """The loss against ``q`` over the rows ``keep``, as a cross-entropy or a KL
        divergence, summed or averaged over the ``n`` real targets."""
        ce = -(q * logp).sum(-1)
        kl = ce + torch.xlogy(q, q).sum(-1)
        return [float(t[keep].sum()) / k for t in (ce, kl) for k in (1, n)]

    def loss_of(result: object) -> float:
        """The scalar loss of ``fn``'s result (a tuple's first item)."""
        loss = result[0] if isinstance(result, (tuple, list)) and result else result
        if isinstance(loss, Tensor) and loss.numel() != 1:
            raise FoundBugError(
                "not_a_scalar",
                f"fn returned a tensor of shape {list(loss.shape)}, not one number: the loss "
                f"of the batch is a scalar, the per-token losses summed over the {n} non-pad "
                "targets (or averaged over them), as reduction='sum' gives, not "
                "reduction='none'",
                "13-label-smoothing.md",
            )
        if not isinstance(loss, (Tensor, float, int)) or isinstance(loss, bool):
            raise FoundBugError(
                "wrong_return",
                f"fn returned {type(loss).__name__}: the loss must be a scalar tensor "
                "(or a number)",
                "13-label-smoothing.md",
            )
        return float(loss)

    def arguments() -> None:  # another eps and pad id than value()'s
        other = torch.tensor([3, 1, 4, 0, 5, 3])  # pads: id 3 now, and 0 a real target
        keep, e = other != 3, 0.25
        q = torch.full((6, V), e / V, dtype=torch.float64)
        q[torch.arange(6), other] = 1 - e + e / V
        got = loss_of(fn(logits, other, e, 3))
        right = totals(q, keep, n=int(keep.sum()))
        if not any(math.isclose(got, t, rel_tol=1e-5) for t in right):
            raise FoundBugError(
                "ignores_arguments",
                f"with eps={e} and pad_id=3 the loss is {got:.4f}, not {right[0]:.4f} (the "
                "sum over the 4 targets that are not 3): fn uses a fixed eps or pad id "
                "(0.1 and 0 give the right loss) instead of its arguments",
                "13-label-smoothing.md",
            )

    def value() -> None:
        got = loss_of(fn(logits, target, eps, PAD_ID))
        if any(math.isclose(got, t, rel_tol=1e-5) for t in totals(right, real)):
            return
        candidates = {
            "pads_counted": totals(right, every) + [t * n / 6 for t in totals(right, every)],
            "mean_counts_pads": [t / 6 for t in totals(right, real)[::2]],
            "smoothing_over_v_minus_1": totals(
                _smoothed(V, target, eps / (V - 1), 1 - eps, True), real
            ),
            "smoothing_skips_pad_column": totals(
                _smoothed(V, target, eps / (V - 2), 1 - eps, False), real
            ),
            "target_gets_1_minus_eps": totals(_smoothed(V, target, eps / V, 1 - eps, True), real),
            "no_smoothing": totals(_smoothed(V, target, 0.0, 1.0, True), real),
            "no_log_softmax": totals(right, real, logits),
        }
        explain = {
            "pads_counted": "the pad targets are counted: leave them out of the loss",
            "mean_counts_pads": f"the pad targets are left out of the sum but counted in the "
            f"mean: it divides by all {len(target)} targets, not the {n} real ones",
            "smoothing_over_v_minus_1": "eps is spread over the V - 1 other tokens; aiayn "
            "(like torch's cross_entropy(label_smoothing=...)) spreads it over all V",
            "smoothing_skips_pad_column": "eps is spread over V - 2 tokens, the pad column "
            "left at 0 (The Annotated Transformer's convention); the tour, like torch's "
            "cross_entropy(label_smoothing=...), spreads it over all V: eps/V each, and "
            "1 - eps + eps/V on the target",
            "target_gets_1_minus_eps": "the target gets 1 - eps and every other token eps/V, "
            "so the smoothed target sums to 1 - eps/V, not 1: the target's share is "
            "1 - eps + eps/V (eps/V of the spread lands on it too)",
            "no_smoothing": "this is plain cross-entropy: eps is not used",
            "no_log_softmax": "the logits are used as log-probabilities: take "
            "logits.log_softmax(-1) first",
        }
        for bug, losses in candidates.items():
            if any(math.isclose(got, t, rel_tol=1e-5) for t in losses):
                raise FoundBugError(bug, explain[bug], "13-label-smoothing.md")
        raise FoundBugError(
            "wrong_loss",
            f"loss {got:.4f}, expected {totals(right, real)[0]:.4f} (sum over the {n} real "
            "targets)",
            "13-label-smoothing.md",
        )

    return run_checks(
        f"check_label_smoothing({name_of(fn)})",
        [
            ("the label-smoothed cross-entropy", value),
            ("eps and pad_id are its arguments", arguments),
        ],
        "13-label-smoothing.md",
    )


def _noam(
    step: int, d: int, w: int, e_d: float = -0.5, e_w: float = -1.5, pick: Callable = min
) -> float:
    return float(d**e_d * pick(step**-0.5, step * w**e_w))


# Slips in Eq. 3, each as the rate it computes instead
_NOAM_SLIPS: dict[str, tuple[Callable[[int, int, int], float], str]] = {
    "warmup_exponent": (
        lambda s, d, w: _noam(s, d, w, e_w=-0.5),
        "the warmup branch is step * warmup^-0.5; Eq. 3 has warmup^-1.5, so that both "
        "branches meet at step = warmup",
    ),
    "warmup_exponent_sign": (
        lambda s, d, w: _noam(s, d, w, e_w=1.5),
        "the warmup branch is step * warmup^1.5; Eq. 3 has warmup^-1.5",
    ),
    "missing_d_model_factor": (
        lambda s, d, w: _noam(s, d, w, e_d=0.0),
        "the factor d_model^-0.5 is missing",
    ),
    "d_model_exponent": (
        lambda s, d, w: _noam(s, d, w, e_d=0.5),
        "the rate is multiplied by d_model^0.5; Eq. 3 has d_model^-0.5",
    ),
    "max_not_min": (
        lambda s, d, w: _noam(s, d, w, pick=max),
        "it takes the max of the two branches; Eq. 3 takes the min (a linear rise, then "
        "the inverse square root decay)",
    ),
    "step_off_by_one": (
        lambda s, d, w: _noam(s + 1, d, w),
        "fn(step) is Eq. 3 at step + 1: steps are counted from 1, the first update is step 1",
    ),
    "step_behind_by_one": (
        lambda s, d, w: _noam(max(s - 1, 1), d, w),
        "fn(step) is Eq. 3 at step - 1: steps are counted from 1, the first update is step 1 "
        "(a LambdaLR passes its count from 0: compute the rate at count + 1)",
    ),
}


def check_noam_rate(fn: Callable[[int, int, int], float]) -> Report:
    """Check a learner's ``fn(step, d_model, warmup) -> learning rate``: Eq. 3,
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for steps from 1."""
    points = [
        (step, d, w)
        for d, w in ((512, 4000), (256, 1000))
        for step in (1, 10, w // 2, w, w + 1, 4 * w, 25 * w)
    ]

    def rate() -> None:
        got = {p: float(fn(*p)) for p in points}
        for step, d, w in points:
            want = _noam(step, d, w)
            if math.isclose(got[step, d, w], want, rel_tol=1e-6):
                continue
            said = f"fn({step}, {d}, {w}) = {got[step, d, w]:.6g}, Eq. 3 gives {want:.6g}"
            for bug, (slip, why) in _NOAM_SLIPS.items():
                if all(math.isclose(got[p], slip(*p), rel_tol=1e-6) for p in points):
                    raise FoundBugError(bug, f"{said}: {why}", "14-warmup.md")
            raise FoundBugError("wrong_rate", said, "14-warmup.md")

    return run_checks(
        f"check_noam_rate({name_of(fn)})", [("Eq. 3 at every step", rate)], "14-warmup.md"
    )
