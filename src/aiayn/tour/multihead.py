"""The checker of a whole multi-head attention module (tour pages 5, 8 and 10), used as
self- and as cross-attention: positions, masks, where queries, keys and values come
from, every weight in use, and the scale of its scores."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from aiayn.tour.attention import K_T
from aiayn.tour.modules import (
    check_deterministic,
    check_gradients,
    check_no_modules_built_in_forward,
)
from aiayn.tour.report import (
    HEAD_SPLIT,
    FoundBugError,
    NotCheckedError,
    Report,
    close,
    evaluating,
    expect_shape,
    first_tensor,
    name_of,
    not_a_module,
    run_checks,
)
from aiayn.tour.scale import check_scales, watch_scales

B, T, S = 2, 5, 7  # T != S: a query axis and a key axis cannot be confused
# The names a module's head count goes by: aiayn's, the notes' and torch's.
HEAD_COUNTS = ("n_heads", "h", "num_heads", "heads", "n_head", "nhead")


def declared_heads(module: nn.Module) -> int | None:
    """The number of heads ``module`` says it has (an int attribute of one of the
    :data:`HEAD_COUNTS` names), or None."""
    for name in HEAD_COUNTS:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_multi_head_attention(module: nn.Module, d_model: int | None = None) -> Report:
    """Check a learner's multi-head attention module, called as aiayn's is:
    ``module(x [B, T, d_model], memory=None, mask=None)`` for self-attention and with
    ``memory [B, S, d_model]`` for encoder-decoder attention (queries from x, keys and
    values from memory); it returns ``[B, T, d_model]`` or a tuple starting with it.
    ``d_model`` defaults to ``module.d_model``.

    The scale of the scores is fitted against the module's own projections as it runs
    (see :func:`aiayn.tour.scale.watch_scales`); attention inside nn.MultiheadAttention
    is torch's own, right by construction, and passes unmeasured. Bugs: ``wrong_shape``,
    ``module_built_in_forward``, ``modules_in_plain_list``, ``dropout_in_eval``,
    ``unused_parameters``, ``mixes_positions``, ``future_leaks``, ``query_from_memory``,
    ``nan_on_fully_masked_rows``, ``kv_from_query``, ``queries_interact``,
    ``ignores_memory``, ``source_padding_leaks``, ``missing_projection``,
    ``softmax_wrong_axis``, ``wrong_head_count`` (against an ``n_heads``, ``h``,
    ``num_heads``, ... attribute), ``missing_scale``, ``divides_by_d_k``,
    ``scale_by_d_model``, ``divides_by_d_k_or_sqrt_d_model``, ``wrong_scale`` (a scale
    of 0, which makes every weight alike, too), ``not_a_module``, ``no_d_model``,
    ``raises``. A scale it cannot fit (queries and keys it cannot find among the
    projections), or a NaN for a fully masked query inside torch's own
    nn.MultiheadAttention, is reported as not checked (:attr:`Report.unchecked`), never as
    passed."""
    subject = f"check_multi_head_attention({name_of(module)})"
    if (refused := not_a_module(module, subject, "05-multi-head.md")) is not None:
        return refused
    d = d_model or getattr(module, "d_model", None)
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        said = "has no d_model attribute" if d is None else f"has d_model {d!r}"
        return Report(
            subject,
            failed="an integer d_model",
            bug="no_d_model",
            page="05-multi-head.md",
            message=f"the module {said}: pass d_model=... (an integer), the width of x",
        )
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(B, T, d, generator=g), torch.randn(B, S, d, generator=g)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]

    def attend(x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        with evaluating(module):
            return first_tensor(module(x, memory=memory, mask=mask), "the module")

    def self_shape() -> None:
        expect_shape(attend(x), (B, T, d), f"The output for x {[B, T, d]}")

    def cross(x: Tensor, memory: Tensor, mask: Tensor | None = None) -> Tensor:
        """Cross-attention; an error of the learner's forward there (where self-attention
        ran) is named as that call's, with its own message."""
        try:
            return attend(x, memory, mask)
        except (RuntimeError, IndexError, ValueError) as error:
            if f"'{[B, T, d]}' is invalid for input of size {B * S * d}" in str(error):
                # memory's S rows, merged into x's shape
                raise query_from_memory(f"(reshaped to x's shape, it raised: {error})") from None
            hint = ""
            if f"({T})" in str(error) and f"({S})" in str(error):
                hint = (
                    f"\n(An axis of the {T} query positions meets one of the {S} memory "
                    "positions where the heads should be: self-attention, where both are "
                    f"{T}, hides this. A head split whose transpose(1, 2) result is thrown "
                    "away (t.transpose(1, 2) on a line of its own leaves t as it was) keeps "
                    "the positions on axis 1, so the scores pair positions, not heads.)"
                )
            raise FoundBugError(
                "raises",
                f"calling it as cross-attention, module(x {[B, T, d]}, memory={[B, S, d]}), "
                f"raised {type(error).__name__}: {error}{hint}",
                "05-multi-head.md",
            ) from None

    def built_in_forward() -> None:
        def both() -> None:
            attend(x)
            with contextlib.suppress(Exception):  # an error of its own is check 6's to report
                attend(x, memory)

        check_no_modules_built_in_forward(module, both)

    def gradients() -> None:
        held = sum(p.numel() for p in module.parameters() if p.dim() >= 2)
        if held < 4 * d * d:  # W^Q, W^K, W^V (h slices of d_k each) and W^O: d x d each
            raise FoundBugError(
                "missing_projection",
                f"the module's weight matrices hold {held} numbers, fewer than the "
                f"{4 * d * d} = 4 x d_model^2 of multi-head attention's four projections: "
                "W^Q, W^K and W^V (each h slices of d_k columns) and W^O, which mixes the "
                "concatenated heads (Section 3.2.2). One is missing: often W^O, or one "
                "projection shared by the keys and the values.",
                "05-multi-head.md",
            )

        def loss() -> Tensor:  # both uses: a weight used in either one counts
            own = first_tensor(module(x), "the module")
            cross = first_tensor(module(x, memory=memory), "the module")
            return own.pow(2).sum() + cross.pow(2).sum()

        check_gradients(module, loss, "module")

    def heads() -> None:
        seen = watch_scales(lambda: (attend(x), attend(x, memory)), B, d)
        declared = declared_heads(module)
        for w in seen.attentions:
            shape = list(w.shape)
            if not torch.allclose(w.sum(-1), torch.ones_like(w[..., 0]), atol=1e-4):
                raise FoundBugError(
                    "softmax_wrong_axis",
                    f"the attention weights [B, h, T_q, T_k] = {shape} do not sum to 1 over "
                    "the keys (the last axis): the softmax runs over another axis (dim=1 "
                    "is the heads of [B, h, T_q, T_k]). Each query's weights are a "
                    "distribution over the keys: softmax(scores, dim=-1).",
                    "05-multi-head.md",
                )
            if declared is not None and w.size(1) != declared:
                raise FoundBugError(
                    "wrong_head_count",
                    f"the module has {declared} heads (its attribute), but its attention "
                    f"weights [B, h, T_q, T_k] = {shape} are those of {w.size(1)}: "
                    + (
                        "the head split never happens, or its result is thrown away "
                        "(t.view(...) or t.transpose(1, 2) on a line of its own leaves t as "
                        "it was), so one head attends over all of d_model. "
                        if w.size(1) == 1
                        else ""
                    )
                    + f"Each of the {declared} heads attends with its own d_k = d_model / h "
                    "slice of the projections.",
                    "05-multi-head.md",
                )

    def scales() -> None:
        check_scales(lambda: (attend(x), attend(x, memory)), B, d)

    def permutation() -> None:
        perm = torch.tensor([3, 0, 4, 1, 2])
        if not close(attend(x[:, perm]), attend(x)[:, perm], atol=1e-4):
            raise FoundBugError(
                "mixes_positions",
                "without a mask, self-attention treats positions alike: shuffling the input "
                "positions must shuffle the outputs the same way, and here it does not. "
                "The usual cause is the head split: a reshape to [B, h, T, d_k] without "
                "the transpose, or a transpose(1, 2) whose result is thrown away "
                "(t.transpose(1, 2) on a line of its own leaves t as it was).",
                "05-multi-head.md",
            )

    def causality() -> None:
        later = x.clone()
        later[:, 3:] += 1.0
        a, b = attend(x, mask=causal), attend(later, mask=causal)
        if not close(a[:, :3], b[:, :3], atol=1e-5):
            raise FoundBugError(
                "future_leaks",
                "with a causal mask, changing positions 3.. changed the output at positions "
                "0..2: the future leaks into the past. A head split without transpose does "
                "this, or a mask applied with the wrong convention (True = may attend), or "
                "after the softmax instead of to the scores, or a softmax over the queries "
                "(dim -2) instead of the keys (dim -1).",
                "05-multi-head.md",
            )

    def query_from_memory(how: str) -> FoundBugError:
        return FoundBugError(
            "query_from_memory",
            f"for x {[B, T, d]} and memory {[B, S, d]} the output has one row per memory "
            f"position {how}: the queries come from memory. Queries come from x (the "
            "decoder), keys and values from memory (the encoder).",
            "10-decoder.md",
        )

    def cross_shape() -> None:
        out = cross(x, memory)
        if tuple(out.shape) == (B, S, d):
            raise query_from_memory(f"({list(out.shape)})")
        expect_shape(out, (B, T, d), f"The output for x {[B, T, d]}, memory {[B, S, d]}")

    def kv_from_memory() -> None:
        bumped = x.clone()
        bumped[:, 0] += 1.0  # change query position 0 only
        a, b = attend(x, memory), attend(bumped, memory)
        other = torch.randn(B, S, d, generator=torch.Generator().manual_seed(1))
        reads_memory = not close(a, attend(x, other), atol=1e-6)
        if not close(a[:, 1:], b[:, 1:], atol=1e-5):
            if not reads_memory:
                raise FoundBugError(
                    "kv_from_query",
                    "in encoder-decoder attention, changing query position 0 changed the "
                    "output at the other positions: keys and values are computed from x (the "
                    "query side), so the decoder attends to itself and never reads the source. "
                    "Project K and V from memory.",
                    "10-decoder.md",
                )
            raise FoundBugError(
                "queries_interact",
                "in encoder-decoder attention, changing query position 0 changed the output "
                "at the other positions: each query must read only memory. Either K or V is "
                "projected from x instead of memory, or the softmax runs over the queries "
                "(dim -2) instead of the keys (dim -1).",
                "10-decoder.md",
            )
        if not reads_memory:
            raise FoundBugError(
                "ignores_memory", "the output does not change when memory changes", "10-decoder.md"
            )

    def source_padding() -> None:
        keys = torch.ones(B, 1, 1, S, dtype=torch.bool)
        # Sentence 1 alone is padded (its last two positions): a mask that reaches another
        # sentence's heads (mask.repeat(h, 1, 1) for [B * h, ..] scores) leaks then.
        keys[1, ..., -2:] = False
        changed = memory.clone()
        changed[1, -2:] = 100.0
        if not close(attend(x, memory, keys), attend(x, changed, keys), atol=1e-5):
            raise FoundBugError(
                "source_padding_leaks",
                "changing masked memory positions changed the output",
                "04-masks.md",
            )

    def fully_masked() -> None:
        nobody = torch.ones(1, 1, T, T, dtype=torch.bool)
        nobody[..., 1, :] = False  # query 1 may see no key at all
        xg = x.clone().requires_grad_()
        with evaluating(module), torch.enable_grad():
            out = first_tensor(module(xg, memory=None, mask=nobody), "the module")
            (grad,) = torch.autograd.grad(out.sum(), xg, allow_unused=True)
        if torch.isfinite(out).all() and (grad is None or torch.isfinite(grad).all()):
            return
        where = "output" if not torch.isfinite(out).all() else "gradient"
        if any(isinstance(m, nn.MultiheadAttention) for m in module.modules()):
            raise NotCheckedError(
                f"the {where} for a query whose keys are all masked is NaN inside torch's own "
                "nn.MultiheadAttention, which does that by design. aiayn gives such rows "
                "zero weights: check by hand that no such row reaches the loss."
            )
        raise FoundBugError(
            "nan_on_fully_masked_rows",
            "a query whose keys are all masked gets NaN (softmax of all -inf is 0/0), "
            "and a NaN poisons the loss and every gradient. aiayn gives such rows zero "
            "weights: torch.softmax(scores, -1).nan_to_num(0.0)."
            if where == "output"
            else "the output is finite but the gradient through a fully masked row is NaN",
            "04-masks.md",
        )

    return run_checks(
        subject,
        [
            ("self-attention returns [B, T, d_model]", self_shape),
            ("every module that runs belongs to it (nothing built in forward)", built_in_forward),
            (
                "eval mode is deterministic (dropout off)",
                lambda: check_deterministic(lambda: attend(x)),
            ),
            ("self-attention treats positions alike (no mask)", permutation),
            ("a causal mask keeps the future out", causality),
            ("cross-attention returns one row per query position", cross_shape),
            ("cross-attention: keys and values come from memory", kv_from_memory),
            ("cross-attention: masked memory positions are ignored", source_padding),
            ("four projections, every parameter gets a gradient (W^O included)", gradients),
            ("h heads, each a softmax over the keys", heads),
            ("each head scales its scores by 1/sqrt(d_k)", scales),
            ("a fully masked query gets no NaN", fully_masked),
        ],
        "05-multi-head.md",
        shape_hint=(
            "The module is called batch first, module(x [B, T, d_model], memory=None, "
            "mask=None), as aiayn's MultiHeadAttention: one written for [T, B, d_model] "
            f"reads the batch as positions. {HEAD_SPLIT} {K_T}"
        ),
    )
