"""The checker for scaled dot-product attention (tour pages 1 and 3; the masks of page 4:
:mod:`aiayn.tour.masks`).

It measures properties of the learner's function on random inputs, the way the library's
own tests measure the library: the weights are read off by passing the identity matrix as
the values, the softmax temperature is fitted from them, and so on. Nothing is compared
with a stored answer.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.tour.report import FoundBugError, Report, expect_shape, first_tensor, name_of, run_checks

B, H, T_Q, T_K, D_K = 2, 3, 4, 6, 16  # T_q != T_k != d_k, so no two axes can be confused
# Why a learner's attention may raise "must match": two shapes that do not fit.
K_T = (
    "If the scores use k.T: on 4-D tensors it reverses every axis; transpose the last two "
    "with k.transpose(-2, -1)."
)


def _inputs(seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T_Q, D_K, generator=g)
    k = torch.randn(B, H, T_K, D_K, generator=g)
    v = torch.randn(B, H, T_K, D_K, generator=g)
    return q, k, v


def _some_allowed(seed: int) -> Tensor:
    """A random mask ``[B, 1, T_q, T_k]`` (shared by the heads), True = may attend, with at
    least one allowed and one forbidden key in every row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, 1, T_Q, T_K, generator=g) < 0.5
    mask[..., 0], mask[..., -1] = True, False
    return mask


def check_attention(fn: Callable[..., object]) -> Report:
    """Check a learner's ``fn(q, k, v, mask=None)``: softmax(Q K^T / sqrt(d_k)) V.

    q ``[B, h, T_q, d_k]``, k and v ``[B, h, T_k, d_k]``; ``mask`` is boolean, True where a
    query may attend to a key (aiayn's convention), broadcastable to ``[B, h, T_q, T_k]``.
    ``fn`` returns the output ``[B, h, T_q, d_v]``, or a tuple starting with it. Bugs named:
    ``wrong_shape``, ``scale_after_softmax``, ``softmax_over_queries``, ``not_a_weighted_sum``,
    ``missing_scale``, ``divides_by_d_k``, ``scale_from_wrong_axis``, ``wrong_scale``,
    ``not_softmax_of_dot_products``, ``inverted_mask``, ``mask_ignored``,
    ``masked_keys_get_weight``, ``nan_on_fully_masked_rows``, ``depends_on_the_batch``,
    ``raises``.
    """
    q, k, v = _inputs(0)
    eye = torch.eye(T_K).expand(B, H, T_K, T_K)  # values = identity: the output IS the weights
    state: dict[str, Tensor] = {}

    try:  # a mask parameter named mask is passed by name: it may be keyword-only
        by_name = "mask" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: no signature to read
        by_name = False

    def call(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is None:
            out = fn(q, k, v)
        else:
            out = fn(q, k, v, mask=mask) if by_name else fn(q, k, v, mask)
        return first_tensor(out, "the function")

    def shape() -> None:
        out = call(q, k, v)
        shapes = f"q {[B, H, T_Q, D_K]}, k and v {[B, H, T_K, D_K]}"
        expect_shape(out, (B, H, T_Q, D_K), f"The output for {shapes}")
        if not torch.equal(out, call(q, k, v)):
            raise FoundBugError(
                "random_output",
                "two calls on the same q, k, v give different outputs: dropout is always on "
                "(F.dropout(x, p) defaults to training=True). Pass training=self.training, "
                "or use an nn.Dropout module, which eval() turns off.",
                "08-residual-layernorm.md",
            )

    def weighted_average() -> None:
        w = call(q, k, eye)
        state["w"] = w
        rows, cols = w.sum(-1), w.sum(-2)
        if torch.allclose(rows, torch.ones_like(rows), atol=1e-4):
            pass
        elif torch.allclose(rows, torch.full_like(rows, 1 / math.sqrt(D_K)), atol=1e-4):
            raise FoundBugError(
                "scale_after_softmax",
                f"with d_k = {D_K}, each row of weights sums to {rows.mean():.3f} = "
                "1/sqrt(d_k), not 1: the division by sqrt(d_k) comes after the softmax. It "
                "belongs to the scores, before the softmax: softmax(q @ k.transpose(-2, -1) "
                "/ sqrt(d_k)).",
                "03-scaled-dot-product.md",
            )
        elif torch.allclose(cols, torch.ones_like(cols), atol=1e-4):
            raise FoundBugError(
                "softmax_over_queries",
                "the weights sum to 1 over the queries (dim -2), not over the keys: each "
                "query must get a distribution over the keys, softmax(..., dim=-1).",
                "01-attention.md",
            )
        else:
            raise FoundBugError(
                "not_a_weighted_sum",
                f"with the identity as values the output should be the weights, rows "
                f"summing to 1; they sum to {rows.min():.3f}..{rows.max():.3f}"
                + (" and some are negative" if (w < -1e-6).any() else ""),
                "01-attention.md",
            )
        if (w < -1e-6).any():
            raise FoundBugError(
                "not_a_weighted_sum", "some weights are negative", "01-attention.md"
            )
        out = call(q, k, v)  # in the learner's dtype (float64, say): compare in float64
        if not torch.allclose(out.double(), w.double() @ v.double(), atol=1e-4):
            raise FoundBugError(
                "not_a_weighted_sum",
                "the output is not the weights times the values (weights @ v)",
                "01-attention.md",
            )

    def temperature() -> None:
        # log w_ij = s * (q_i . k_j) - log Z_i: fit s from the differences within each row.
        w, dots = state["w"].double(), (q @ k.transpose(-2, -1)).double()
        lw = w.clamp_min(1e-30).log()
        lw, dots = lw - lw.mean(-1, keepdim=True), dots - dots.mean(-1, keepdim=True)
        s = float((lw * dots).sum() / (dots * dots).sum())
        residual = float((lw - s * dots).abs().max())
        if residual > 1e-2:
            raise FoundBugError(
                "not_softmax_of_dot_products",
                f"the weights are not softmax(s * q . k) for any one scale s (off by up to "
                f"{residual:.2f} in log-weight): check the scores are q @ k.transpose(-2, -1)",
                "03-scaled-dot-product.md",
            )
        expected = 1 / math.sqrt(D_K)
        if abs(s / expected - 1) < 0.01:
            return
        said = f"the weights are softmax(s * q . k) with s = {s:.4f}; with d_k = {D_K} it "
        said += f"must be 1/sqrt(d_k) = {expected:.4f}"
        if abs(s - 1) < 0.01:
            raise FoundBugError(
                "missing_scale",
                said + ": the scores are not scaled at all.",
                "03-scaled-dot-product.md",
            )
        if abs(s * D_K - 1) < 0.01:
            raise FoundBugError(
                "divides_by_d_k",
                said + ": they are divided by d_k, not sqrt(d_k).",
                "03-scaled-dot-product.md",
            )
        if abs(s * math.sqrt(H * D_K) - 1) < 0.01 or any(
            abs(s * math.sqrt(n) - 1) < 0.002 for n in (128, 256, 512, 768, 1024, 2048)
        ):
            raise FoundBugError(
                "scale_by_d_model",
                said + f": it is 1/sqrt({1 / s**2:.0f}), 1/sqrt(d_model) (here h * d_k = "
                f"{H * D_K}). Each head scales its own scores by 1/sqrt(d_k), d_k = "
                "q.size(-1), the size of one head.",
                "03-scaled-dot-product.md",
            )
        axes = (("queries", T_Q), ("keys", T_K), ("heads", H), ("sentences", B))
        for axis, size in axes:
            if abs(s * math.sqrt(size) - 1) < 0.01:
                raise FoundBugError(
                    "scale_from_wrong_axis",
                    said + f": it is 1/sqrt({size}), {axis}. d_k is the last axis, q.size(-1).",
                    "03-scaled-dot-product.md",
                )
        raise FoundBugError("wrong_scale", said + ".", "03-scaled-dot-product.md")

    def mask() -> None:
        allowed = _some_allowed(1)
        w = call(q, k, eye, allowed)
        # A mask broadcast into a new axis ([B, 1, 1, T] unsqueezed again) makes a 5-D
        # output, whose weights would be misread below.
        expect_shape(w, (B, H, T_Q, T_K), f"The output with a mask {list(allowed.shape)}")
        on_allowed = float(w.masked_fill(~allowed, 0).sum(-1).mean())
        on_forbidden = float(w.masked_fill(allowed, 0).abs().sum(-1).max())
        if on_forbidden <= 1e-6:
            rows = w.sum(-1)
            if not torch.allclose(rows, torch.ones_like(rows), atol=1e-4):
                raise FoundBugError(
                    "mask_after_softmax",
                    "the forbidden keys get no weight, but with the mask the weights of a "
                    f"query sum to {rows.min():.3f}..{rows.max():.3f}, not 1: the mask is "
                    "applied after the softmax (weights * mask), which only removes weight. "
                    "Mask the scores before it, scores.masked_fill(~mask, float('-inf')), so "
                    "the softmax shares the weight among the allowed keys.",
                    "04-masks.md",
                )
            return
        if on_allowed < 1e-6:
            raise FoundBugError(
                "inverted_mask",
                "all the weight goes to the keys the mask marks False. In aiayn (and in "
                "torch.nn.functional.scaled_dot_product_attention) True means MAY ATTEND; "
                "the notes' True means masked. Fill where the mask is False: "
                "scores.masked_fill(~mask, float('-inf')).",
                "04-masks.md",
            )
        unmasked = call(q, k, eye)
        if torch.allclose(w, unmasked, atol=1e-6):
            raise FoundBugError(
                "mask_ignored", "the output is the same with and without the mask", "04-masks.md"
            )
        raise FoundBugError(
            "masked_keys_get_weight",
            f"forbidden keys still get weight (up to {on_forbidden:.2e} per row): set "
            "their scores to -inf before the softmax (masked_fill), do not add or multiply "
            "the mask in",
            "04-masks.md",
        )

    def fully_masked() -> None:
        nobody = _some_allowed(2)
        nobody[0, :, 1] = False  # query 1 of sentence 0 may see no key at all
        qg = q.clone().requires_grad_()
        out = call(qg, k, v, nobody)
        if not torch.isfinite(out).all():
            raise FoundBugError(
                "nan_on_fully_masked_rows",
                "a query whose keys are all masked gets NaN (softmax of all -inf is 0/0), "
                "and a NaN poisons the loss and every gradient. aiayn gives such rows zero "
                "weights: torch.softmax(scores, -1).nan_to_num(0.0).",
                "04-masks.md",
            )
        out.sum().backward()
        if qg.grad is not None and not torch.isfinite(qg.grad).all():
            raise FoundBugError(
                "nan_on_fully_masked_rows",
                "the output is finite but the gradient through a fully masked row is NaN: "
                "the backward of a softmax over all -inf is NaN too, and a nan_to_num after "
                "it does not stop that where the mask is added to the scores (scores + a "
                "-inf mask). Apply it with scores.masked_fill(~mask, float('-inf')), whose "
                "backward gives masked scores no gradient, then .nan_to_num(0.0).",
                "04-masks.md",
            )

    def independent() -> None:
        whole = call(q, k, v)
        for b in range(B):
            for h in range(H):
                one = call(
                    q[b : b + 1, h : h + 1], k[b : b + 1, h : h + 1], v[b : b + 1, h : h + 1]
                )
                if not torch.allclose(whole[b, h], one[0, 0], atol=1e-5):
                    raise FoundBugError(
                        "depends_on_the_batch",
                        f"sentence {b}, head {h} comes out different when computed alone: "
                        "its result depends on the other sentences of the batch or on the "
                        "other heads, which attention never looks at.",
                        "05-multi-head.md",
                    )

    return run_checks(
        f"check_attention({name_of(fn)})",
        [
            ("returns [B, h, T_q, d_v]", shape),
            ("each output is a weighted average of the values (rows sum to 1)", weighted_average),
            ("the weights are softmax(q . k / sqrt(d_k))", temperature),
            ("a mask of True = may attend is obeyed", mask),
            ("a query with no allowed key gives no NaN, nor does its gradient", fully_masked),
            ("sentences and heads are computed independently", independent),
        ],
        "03-scaled-dot-product.md",
        shape_hint=K_T,
    )
