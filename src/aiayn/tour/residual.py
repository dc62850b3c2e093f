"""The residual check of the layer checkers (tour page 8): with every sub-layer silenced,
a layer must hand its input through, as x itself (pre-LN, whose sub-layers then read
norm(x)) or as norm(x) (post-LN)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from aiayn.tour.report import FoundBugError, NotCheckedError
from aiayn.tour.scale import PRODUCTS

PAGE = "08-residual-layernorm.md"


class _Inputs(TorchFunctionMode):
    """While active, keeps the inputs of ``shape`` of every projection (a product with a
    2-D weight: nn.Linear, F.linear, x @ W): what a layer's sub-layers read."""

    def __init__(self, shape: torch.Size) -> None:
        super().__init__()
        self.shape, self.found = shape, cast("list[Tensor]", [])

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        x, weight = (*args, None, None)[:2]
        projects = isinstance(weight, Tensor) and weight.dim() == 2
        if func in PRODUCTS and projects and isinstance(x, Tensor) and x.shape == self.shape:
            self.found.append(x.detach())
        return func(*args, **kwargs)


def _silenceable(layer: nn.Module) -> bool:
    """True when every weight matrix of ``layer`` sits in an nn.Linear or an
    nn.MultiheadAttention (whose out_proj is an nn.Linear): zeroing the nn.Linear weights
    and biases then makes every sub-layer output exactly 0."""
    linear_owned = {
        id(p)
        for m in layer.modules()
        if isinstance(m, (nn.Linear, nn.MultiheadAttention))
        for p in m.parameters()
    }
    matrices = [p for p in layer.parameters() if p.dim() >= 2]
    return bool(matrices) and all(id(p) in linear_owned for p in matrices)


def _silence_raw(layer: nn.Module) -> bool:
    """Zero the weights that sit outside nn.Linear (raw nn.Parameter matrices, used as
    x @ W or in einsum): every parameter of two or more axes, and the 1-D parameters (the
    biases) of a module that holds such a matrix itself. The 1-D parameters of a module
    holding no matrix, a hand-written LayerNorm's gain and bias, are left as they are.
    Returns whether any 1-D parameter was zeroed: it may have been a LayerNorm's gain kept
    beside the matrices, which alone makes the layer's output 0."""
    vectors = False
    for m in layer.modules():
        if isinstance(m, (nn.LayerNorm, nn.Linear)):  # reset, and zeroed, by the caller
            continue
        own = list(m.parameters(recurse=False))
        if any(p.dim() >= 2 for p in own):
            for p in own:
                vectors |= p.dim() < 2
                p.zero_()
    return vectors


def _normalized(y: Tensor, kind: str = "LayerNorm") -> bool:
    """Each position of ``y`` has mean 0 and one common spread, as LayerNorm with its
    initial gain 1 and bias 0 leaves it (whatever its eps or variance estimator); or, for
    ``kind`` "RMSNorm", one common root mean square (RMSNorm's, with gain 1)."""
    if kind == "RMSNorm":
        rms = y.pow(2).mean(-1).sqrt()
        return bool((rms / rms.mean() - 1).abs().max() < 1e-2)
    std = y.std(-1)
    return bool(y.mean(-1).abs().max() < 1e-3) and bool((std / std.mean() - 1).abs().max() < 1e-2)


def _norm_of(y: Tensor, x: Tensor) -> str | None:
    """Which norm (gain 1, bias 0) ``y`` is of ``x``, position by position: "LayerNorm"
    (centred, then scaled), "RMSNorm" (scaled), or None."""
    centred = x - x.mean(-1, keepdim=True)
    if _parallel(y - y.mean(-1, keepdim=True), centred) and _normalized(y):
        return "LayerNorm"
    if _parallel(y, x) and _normalized(y, "RMSNorm"):
        return "RMSNorm"
    return None


def _parallel(a: Tensor, b: Tensor) -> bool:
    return bool((torch.cosine_similarity(a, b, dim=-1) > 0.999).all())


def _reset_norms(layer: nn.Module, x: Tensor) -> None:
    """Set every norm of ``layer`` to its initial gain 1 and bias 0: nn.LayerNorm and
    nn.RMSNorm, and a hand-written one (a module of one or two vectors of d_model and no
    matrix, as the notes' LayerNorm with its gain and bias) whose output on ``x`` is then
    a norm of x, which tells its gain from its bias. A module of vectors that no setting
    makes a norm (a LayerScale, a learned gate) keeps its values."""
    d = x.size(-1)
    for m in layer.modules():
        own = list(m.parameters(recurse=False))
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
            for p, value in zip(own, (1.0, 0.0)):  # weight, then bias
                p.fill_(value)
        elif (
            own
            and len(own) <= 2
            and all(p.shape == (d,) for p in own)
            and not any(True for c in m.children() for _ in c.parameters())
        ):
            _reset_hand_written(m, own, x)


def _reset_hand_written(m: nn.Module, own: list[nn.Parameter], x: Tensor) -> None:
    kept = [p.clone() for p in own]
    for gain_first in (True, False)[: len(own)]:  # (gain, bias) or (bias, gain)
        for p, value in zip(own, (1.0, 0.0) if gain_first else (0.0, 1.0)):
            p.fill_(value)
        try:
            out = m(x)
        except Exception:  # it does not take x alone: no norm
            break
        if isinstance(out, Tensor) and out.shape == x.shape and _norm_of(out, x) is not None:
            return
    for p, saved in zip(own, kept):
        p.copy_(saved)


def check_residual(
    layer: nn.Module, call: Callable[[nn.Module, Tensor], Tensor], x: Tensor
) -> None:
    """Raise :class:`FoundBugError` unless ``layer`` keeps the paper's residual paths.

    ``call(module, x)`` runs a copy of the layer (eval mode, no grad) and returns its output.
    On a copy whose nn.Linear weights and biases are all zero and whose norms are reset
    (nn.LayerNorm, nn.RMSNorm, or a hand-written one: :func:`_reset_norms`), every
    sub-layer outputs 0, so a pre-LN layer must return x and a post-LN one a per-position
    normalisation of x (LayerNorm's or RMSNorm's); a post-LN layer must also return
    normalised vectors with its weights in place, and a pre-LN one must feed some
    projection of x's shape a normalised input (``missing_layer_norm``: x + sublayer(x),
    or x + norm(sublayer(x)), returns x when silenced too). A layer whose weights are not all in
    nn.Linear modules has its raw matrices (and their biases) zeroed too; as that may miss
    a weight, its output then proves a bug only when it is 0 (x reaches the output by no
    path) and no 1-D parameter beside a matrix was zeroed (a hand-written LayerNorm's gain
    kept there would make it 0); any other output that is neither x nor norm(x) raises
    :class:`NotCheckedError`.
    """
    strict = _silenceable(layer)
    copied = copy.deepcopy(layer).eval()  # its dropout off, whatever the learner's mode
    with torch.no_grad():
        _reset_norms(copied, x)
        with _Inputs(x.shape) as read:
            live = call(copied, x)
        for m in copied.modules():
            if isinstance(m, nn.Linear):
                m.weight.zero_()
                if m.bias is not None:
                    m.bias.zero_()
        gains_maybe_zeroed = not strict and _silence_raw(copied)
        silent = call(copied, x)
    if torch.allclose(silent, x, atol=1e-5):  # pre-LN: the residual stream is x itself
        if not read.found or any(_normalized(t) or _normalized(t, "RMSNorm") for t in read.found):
            return  # and a sub-layer reads norm(x)
        raise FoundBugError(
            "missing_layer_norm",
            "with every sub-layer silenced (all nn.Linear weights and biases 0) the layer "
            "returns x itself, as pre-LN does, but no sub-layer reads a normalised input "
            "(per position: mean 0 and one spread). Pre-LN is "
            "x + sublayer(norm(x)); with no norm before the sub-layer, x + sublayer(x), or "
            "one on its output, x + norm(sublayer(x)), nothing normalises the residual "
            "stream. Post-LN, the paper's, is norm(x + sublayer(x)).",
            PAGE,
        )
    kind = _norm_of(silent, x)
    if kind is not None:
        if _normalized(live, kind):
            return  # post-LN: norm(x + sublayer(x)), and norm(x) when silenced
        raise FoundBugError(
            "residual_on_normalized_input",
            "with every sub-layer silenced (all nn.Linear weights and biases 0) the layer "
            "returns norm(x), as post-LN does, but with its weights its output is not "
            "normalised: the sub-layer is added to the normalised input, "
            "norm(x) + sublayer(...). Post-LN is norm(x + sublayer(x)); pre-LN is "
            "x + sublayer(norm(x)), adding to x itself.",
            PAGE,
        )
    if not strict and (gains_maybe_zeroed or not bool((silent.abs() < 1e-6).all())):
        raise NotCheckedError(
            "some of the layer's weights are not in nn.Linear modules (raw nn.Parameter "
            "matrices); with every matrix the checker found set to 0 the layer returns "
            "neither x (pre-LN) nor norm(x) (post-LN), which may be a weight it could "
            "not silence, so the residual connections could not be checked. Check by hand: "
            "norm(x + sublayer(x)) (post-LN) or x + sublayer(norm(x)) (pre-LN)."
        )
    zeroed = "nn.Linear weights and biases" if strict else "weight matrices and their biases"
    raise FoundBugError(
        "missing_residual",
        f"with every sub-layer silenced (all {zeroed} 0) a layer must "
        "pass its input through its residual connections: x itself (pre-LN) or "
        "norm(x) (post-LN). This one returns neither, so some sub-layer's output is "
        "not added to its input: write norm(x + sublayer(x)) (post-LN) or "
        "x + sublayer(norm(x)) (pre-LN) around self-attention, the feed-forward network "
        "and (in the decoder) the encoder-decoder attention.",
        PAGE,
    )
