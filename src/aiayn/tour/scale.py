"""The softmax temperature of the attention inside a learner's module or layer (tour
pages 3, 5 and 9).

A module's output depends on its scale s only through s * W^Q W^K^T, so s cannot be read
off the output: it is fitted against the module's own projections while the module runs.
A torch function mode records the attention weights of every softmax (and of every
F.scaled_dot_product_attention) and the output of every product with a 2-D weight
(nn.Linear, F.linear, x @ W) and of every einsum: the candidate queries and keys, whole
(a head's slice is tried) or one head's. The log-weights of head h
are s * q_h . k_h plus a constant per query (the softmax's normaliser) and one per key (a
query bias dotted with the keys); centring over both queries and keys removes those, and
the candidate pair that leaves no residual gives s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from aiayn.tour.report import FoundBugError, NotCheckedError

PAGE = "03-scaled-dot-product.md"
_SOFTMAX = (torch.softmax, torch.Tensor.softmax, F.softmax)
PRODUCTS = (F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
_SDPA = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _sdpa_weights(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """The weights F.scaled_dot_product_attention computed for these arguments."""
    given = {**dict(zip(_SDPA, args)), **kwargs}
    q, k, mask = given["query"], given["key"], given.get("attn_mask")
    scale = given.get("scale")
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)) if scale is None else scale)
    if given.get("is_causal"):
        scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, -1)


class _Watch(TorchFunctionMode):
    """While active, records the weights of every softmax, the output of every product with
    a 2-D right operand (the projections; a product of scores has none) and of every
    einsum (projections by 3-D weights), and counts the calls of torch's own
    F.multi_head_attention_forward, whose scale is 1/sqrt(head_dim) by construction."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[Tensor] = []
        self.products: list[Tensor] = []
        self.torch_own = 0

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:  # only watching: a call it cannot read is left out, never broken
            if func in _SOFTMAX and isinstance(out, Tensor):
                self.weights.append(out.detach().double())
            elif func is F.scaled_dot_product_attention:
                self.weights.append(_sdpa_weights(args, kwargs).detach().double())
            elif func is F.multi_head_attention_forward:
                self.torch_own += 1
            elif func is torch.einsum and isinstance(out, Tensor) and out.dim() in (3, 4):
                self.products.append(out.detach().double())
            elif func in PRODUCTS and isinstance(out, Tensor) and out.dim() == 3:
                weight = args[1] if len(args) > 1 else kwargs.get("weight", kwargs.get("other"))
                if isinstance(weight, Tensor) and weight.dim() == 2:
                    self.products.append(out.detach().double())
        except Exception:  # a learner's unusual call is simply not recorded
            pass
        return out


@dataclass
class Measured:
    """One attention of the module: its heads, query and key lengths, and fitted scale
    (the mean over its heads)."""

    heads: int
    t_q: int
    t_k: int
    s: float


def _attentions(weights: list[Tensor], batch: int) -> list[Tensor]:
    """The recorded weights as attentions ``[B, h, T_q, T_k]``: a 4-D softmax is one, and
    3-D ones of one shape (``[B * h, ..]``, or ``[B, ..]`` once per head in a loop over the
    heads) are put together as the heads of one."""
    found = [w for w in weights if w.dim() == 4 and w.size(0) == batch]
    loose: dict[tuple[int, ...], list[Tensor]] = {}
    for w in weights:
        if w.dim() == 3 and w.size(0) % batch == 0:
            loose.setdefault(tuple(w.shape[1:]), []).append(w.reshape(batch, -1, *w.shape[1:]))
    return found + [torch.cat(ws, dim=1) for ws in loose.values()]


def _centred(t: Tensor) -> Tensor:
    """``t`` less its mean over the queries and over the keys (the last two axes)."""
    return t - t.mean(-1, keepdim=True) - t.mean(-2, keepdim=True) + t.mean((-2, -1), keepdim=True)


def _head_candidates(
    products: list[Tensor], batch: int, length: int, heads: int, head: int, d_model: int
) -> list[Tensor]:
    """What the recorded projections offer as head ``head``'s queries (or keys) of
    ``length`` positions, ``[B, length, d_k]``: its slice of every ``[B, length, d_model]``
    block (a fused ``[B, length, 3 d_model]`` has three), every ``[B, length, d_k]``
    product (one nn.Linear(d_model, d_k) per head), and its row of every
    ``[B, h, length, d_k]`` or ``[B, length, h, d_k]`` einsum."""
    d_k = d_model // heads
    found = []
    for p in products:
        if p.size(0) != batch:
            continue
        if p.dim() == 3 and p.size(1) == length:
            if p.size(2) % d_model == 0:
                found += [b.unflatten(-1, (heads, -1))[..., head, :] for b in p.split(d_model, -1)]
            elif p.size(2) == d_k:
                found.append(p)
        elif p.dim() == 4 and p.size(3) == d_k:
            if p.size(1) == heads and p.size(2) == length:
                found.append(p[:, head])
            elif p.size(2) == heads and p.size(1) == length:
                found.append(p[:, :, head])
    return found


def _fit(weights: Tensor, products: list[Tensor], d_model: int) -> float | None:
    """The scale s with log-weights = s * q_h . k_h (up to the per-query and per-key
    constants), each head fitted against the recorded projections q_h and k_h that fit it
    best, or None when no pair fits some head (or the weights carry nothing to fit)."""
    batch, heads, t_q, t_k = weights.shape
    if d_model % heads or not bool((weights > 0).all()):  # a masked key: -inf log-weight
        return None
    scales = []
    for head in range(heads):
        logs = _centred(weights[:, head].log())
        uniform = float(logs.norm()) < 1e-6  # s = 0, if some q . k is not uniform too
        best: tuple[float, float] | None = None
        keys = _head_candidates(products, batch, t_k, heads, head, d_model)
        for q in _head_candidates(products, batch, t_q, heads, head, d_model):
            for k in keys:
                dots = _centred(q @ k.transpose(-2, -1))
                if uniform:
                    best = (0.0, 0.0) if float(dots.norm()) > 1e-3 else best
                    continue
                s = float((logs * dots).sum() / (dots * dots).sum().clamp_min(1e-30))
                misfit = float((logs - s * dots).norm() / logs.norm())
                if best is None or misfit < best[0]:
                    best = (misfit, s)
        if best is None or best[0] >= 1e-3:
            return None
        scales.append(best[1])
    return sum(scales) / len(scales)


@dataclass
class Scales:
    """What :func:`watch_scales` saw: the attentions it fitted, those it could not, and how
    many ran inside torch's own nn.MultiheadAttention."""

    measured: list[Measured]
    unmeasured: list[tuple[int, int, int]]  # (heads, t_q, t_k): no projections explain it
    torch_own: int
    attentions: list[Tensor]  # every attention's weights, [B, h, T_q, T_k]


def watch_scales(call: Callable[[], object], batch: int, d_model: int) -> Scales:
    """Run ``call()`` and fit the scale of every attention it computes against the module's
    own projections (run it with masks that allow every key: a masked key has no
    log-weight)."""
    watch = _Watch()
    with watch:
        call()
    measured: list[Measured] = []
    unmeasured: list[tuple[int, int, int]] = []
    attentions = _attentions(watch.weights, batch)
    for weights in attentions:
        _, heads, t_q, t_k = weights.shape
        s = _fit(weights, watch.products, d_model)
        if s is None:
            unmeasured.append((heads, t_q, t_k))
        else:
            measured.append(Measured(heads, t_q, t_k, s))
    return Scales(measured, unmeasured, watch.torch_own, attentions)


def measure_scales(call: Callable[[], object], batch: int, d_model: int) -> list[Measured]:
    """The attentions of ``call()`` whose scale :func:`watch_scales` fits. Those it cannot
    fit are left out: one inside nn.MultiheadAttention, say, whose internals a function
    mode does not see."""
    return watch_scales(call, batch, d_model).measured


def check_scales(call: Callable[[], object], batch: int, d_model: int) -> None:
    """Raise :class:`FoundBugError` unless every attention :func:`watch_scales` fits has
    s = 1/sqrt(d_k), d_k = d_model / heads. Bugs: ``missing_scale``, ``divides_by_d_k``,
    ``scale_by_d_model``, ``divides_by_d_k_or_sqrt_d_model`` (d_model = h^2, where the
    two agree), ``wrong_scale`` (check_attention's names). Raise :class:`NotCheckedError`
    when some attention could not be fitted, or none was seen at all (torch's own
    nn.MultiheadAttention, whose scale is right by construction, counts as seen)."""
    seen = watch_scales(call, batch, d_model)
    for m in seen.measured:
        d_k = d_model // m.heads
        if abs(m.s * math.sqrt(d_k) - 1) < 0.01:
            continue
        kind = "self-attention" if m.t_q == m.t_k else "encoder-decoder attention"
        said = (
            f"the {kind} weights ([B, h, T_q, T_k] = {[batch, m.heads, m.t_q, m.t_k]}) are "
            f"softmax(s * q . k) of the module's own projections q and k with s = {m.s:.4f}; "
            f"with {m.heads} heads of d_k = {d_k} it must be 1/sqrt(d_k) = "
            f"{1 / math.sqrt(d_k):.4f}"
        )
        if m.s == 0:
            raise FoundBugError(
                "wrong_scale",
                said + ": the scores were multiplied by 0, so every key gets the same "
                "weight. A common cause is integer division: 1 // math.sqrt(d_k) is 0.0; "
                "write 1 / math.sqrt(d_k).",
                PAGE,
            )
        if abs(m.s - 1) < 0.01:
            raise FoundBugError("missing_scale", said + ": the scores are not scaled.", PAGE)
        if abs(m.s * d_k - 1) < 0.01 and d_k * d_k == d_model:
            raise FoundBugError(
                "divides_by_d_k_or_sqrt_d_model",
                said + f": s = 1/d_k, which here (d_model = {d_model} = d_k^2) is also "
                f"1/sqrt(d_model). Either the scores are divided by d_k, not sqrt(d_k), or "
                "by sqrt(d_model), the size of the whole model: each head scales its own "
                "scores by 1/sqrt(d_k), the size of one head (q.size(-1) after the split).",
                PAGE,
            )
        if abs(m.s * d_k - 1) < 0.01:
            raise FoundBugError(
                "divides_by_d_k", said + ": they are divided by d_k, not sqrt(d_k).", PAGE
            )
        if abs(m.s * math.sqrt(d_model) - 1) < 0.01:
            raise FoundBugError(
                "scale_by_d_model",
                said + f": it is 1/sqrt(d_model) = 1/sqrt({d_model}). Each head scales its "
                "own scores by 1/sqrt(d_k), the size of one head (q.size(-1) after the "
                "split), not of the whole model.",
                PAGE,
            )
        raise FoundBugError("wrong_scale", said + ".", PAGE)
    if seen.unmeasured:
        shapes = ", ".join(f"{[batch, *shape]}" for shape in seen.unmeasured)
        raise NotCheckedError(
            f"the weights of {shapes} ([B, h, T_q, T_k]) are not softmax(s * q . k) of any "
            "queries and keys the checker could find among the module's projections "
            "(nn.Linear, x @ W, einsum), so their scale could not be measured. Check by "
            "hand that each head divides its scores by sqrt(d_k), d_k = d_model / h."
        )
    if not seen.measured and not seen.torch_own:
        raise NotCheckedError(
            "no softmax (nor F.scaled_dot_product_attention, nor nn.MultiheadAttention) ran "
            "where the checker could see it, so the scale could not be measured. Check by "
            "hand that each head divides its scores by sqrt(d_k), d_k = d_model / h."
        )
