"""Checkers for multi-head attention (tour pages 2, 5 and 10): the head split and merge,
and a whole multi-head attention module used as self- and as cross-attention."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from aiayn.tour.report import (
    Check,
    FoundBugError,
    Report,
    check_no_modules_built_in_forward,
    close,
    evaluating,
    expect_shape,
    first_tensor,
    name_of,
    run_checks,
)

B, T, S, D_MODEL, H = 2, 5, 7, 12, 3  # T != S, and d_k = 4 differs from both
D_K = D_MODEL // H


def _split_reference(x: Tensor, h: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


def check_split_heads(
    split: Callable[[Tensor, int], Tensor], merge: Callable[[Tensor], Tensor] | None = None
) -> Report:
    """Check a learner's ``split(x [B, T, d_model], n_heads) -> [B, h, T, d_k]`` and, if
    given, ``merge([B, h, T, d_k]) -> [B, T, d_model]``. Head i must hold features
    i*d_k..(i+1)*d_k of every position (the paper's W_i blocks), and positions must stay
    positions. Bugs: ``reshape_without_transpose``, ``mixes_positions``,
    ``strided_features``, ``merge_without_transpose``, ``merge_wrong``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D_MODEL, generator=g)

    def shape() -> None:
        out = split(x, H)
        # Each shape a thrown-away view() or transpose() leaves: one step lost, or both.
        if tuple(out.shape) in ((B, T, H, D_K), (B, D_MODEL, T), (B, T, D_MODEL)):
            raise FoundBugError(
                "result_thrown_away",
                f"split(x {[B, T, D_MODEL]}, {H}) has shape {list(out.shape)}, expected "
                f"{[B, H, T, D_K]}: one step's result is thrown away. view(), reshape() and "
                "transpose() return a new tensor and leave x as it was: write "
                "x = x.view(B, T, h, d_k), then return x.transpose(1, 2).",
                "05-multi-head.md",
            )
        expect_shape(out, (B, H, T, D_K), f"split(x {[B, T, D_MODEL]}, {H})")

    def positions() -> None:
        bumped = x.clone()
        bumped[:, 1] += 1.0  # change position 1 only
        changed = (split(bumped, H) - split(x, H)).abs().amax(dim=(0, 3)) > 0  # [h, T]
        if changed[:, 1].all() and not changed[:, [0, 2, 3, 4]].any():
            return
        where = [f"head {i} position {t}" for i, t in changed.nonzero().tolist()]
        said = f"changing position 1 of x changed {', '.join(where)}: "
        if torch.equal(split(x, H), x.reshape(B, H, T, D_K)):
            raise FoundBugError(
                "reshape_without_transpose",
                said + "a bare reshape to [B, h, T, d_k] cuts the memory of [B, T, d_model] "
                "into h runs of T*d_k numbers, whole positions each. View as [B, T, h, d_k], "
                "then transpose(1, 2).",
                "05-multi-head.md",
            )
        raise FoundBugError(
            "mixes_positions", said + "the split mixes positions", "05-multi-head.md"
        )

    def features() -> None:
        out = split(x, H)
        if torch.equal(out, _split_reference(x, H)):
            return
        raise FoundBugError(
            "strided_features",
            "head 0 does not hold features 0..d_k-1 of each position (the paper's head i "
            "owns columns i*d_k..(i+1)*d_k of W^Q, W^K, W^V, as torch.nn.MultiheadAttention "
            "and aiayn lay them out): view as [B, T, h, d_k], not [B, T, d_k, h]",
            "05-multi-head.md",
        )

    def merged(merge: Callable[[Tensor], Tensor]) -> None:
        heads = _split_reference(x, H)
        back = merge(heads)
        if close(back, x, atol=0):
            return
        if close(back, heads.reshape(B, T, D_MODEL), atol=0):
            raise FoundBugError(
                "merge_without_transpose",
                "merge reshapes [B, h, T, d_k] straight to [B, T, d_model]: the heads' rows "
                "end up at the wrong positions. transpose(1, 2) first, then reshape.",
                "05-multi-head.md",
            )
        raise FoundBugError("merge_wrong", "merge(split(x)) is not x", "05-multi-head.md")

    checks: list[Check] = [
        ("split returns [B, h, T, d_k]", shape),
        ("each position stays one position in every head", positions),
        ("head i holds features i*d_k..(i+1)*d_k", features),
    ]
    if merge is not None:
        checks.append(
            ("merge undoes split (the concatenation of the heads)", lambda: merged(merge))
        )
    return run_checks(f"check_split_heads({name_of(split)})", checks, "05-multi-head.md")


def check_multi_head_attention(module: nn.Module, d_model: int | None = None) -> Report:
    """Check a learner's multi-head attention module, called as aiayn's is:
    ``module(x [B, T, d_model], memory=None, mask=None)`` for self-attention and with
    ``memory [B, S, d_model]`` for encoder-decoder attention (queries from x, keys and
    values from memory); it returns ``[B, T, d_model]`` or a tuple starting with it.
    ``d_model`` defaults to ``module.d_model``. Bugs: ``module_built_in_forward``,
    ``mixes_positions``, ``future_leaks``, ``query_from_memory``, ``kv_from_query``,
    ``ignores_memory``, ``source_padding_leaks``, ``wrong_shape``, ``raises``."""
    d = d_model or getattr(module, "d_model", None)
    if d is None:
        raise TypeError("pass d_model=... (the module has no d_model attribute)")
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(B, T, d, generator=g), torch.randn(B, S, d, generator=g)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]

    def attend(x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        with evaluating(module):
            return first_tensor(module(x, memory=memory, mask=mask), "the module")

    def self_shape() -> None:
        out = attend(x)
        expect_shape(out, (B, T, d), f"The output for x {[B, T, d]}")
        if not torch.equal(out, attend(x)):
            raise FoundBugError(
                "dropout_in_eval",
                "two calls in eval mode give different outputs: dropout is still on. "
                "Use nn.Dropout modules (or F.dropout(x, p, training=self.training)).",
                "08-residual-layernorm.md",
            )

    def built_in_forward() -> None:
        check_no_modules_built_in_forward(module, lambda: attend(x, memory))

    def permutation() -> None:
        perm = torch.tensor([3, 0, 4, 1, 2])
        if not close(attend(x[:, perm]), attend(x)[:, perm], atol=1e-4):
            raise FoundBugError(
                "mixes_positions",
                "without a mask, self-attention treats positions alike: shuffling the input "
                "positions must shuffle the outputs the same way, and here it does not. "
                "The usual cause is the head split: a reshape to [B, h, T, d_k] without "
                "the transpose.",
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

    def cross_shape() -> None:
        out = attend(x, memory)
        if tuple(out.shape) == (B, S, d):
            raise FoundBugError(
                "query_from_memory",
                f"for x {[B, T, d]} and memory {[B, S, d]} the output has one row per "
                "memory position: the queries come from memory. Queries come from x (the "
                "decoder), keys and values from memory (the encoder).",
                "10-decoder.md",
            )
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
        keys[..., -2:] = False  # the last two source positions are padding
        changed = memory.clone()
        changed[:, -2:] = 100.0
        if not close(attend(x, memory, keys), attend(x, changed, keys), atol=1e-5):
            raise FoundBugError(
                "source_padding_leaks",
                "changing masked memory positions changed the output",
                "04-masks.md",
            )

    return run_checks(
        f"check_multi_head_attention({name_of(module)})",
        [
            ("self-attention returns [B, T, d_model]", self_shape),
            ("every module that runs belongs to it (nothing built in forward)", built_in_forward),
            ("self-attention treats positions alike (no mask)", permutation),
            ("a causal mask keeps the future out", causality),
            ("cross-attention returns one row per query position", cross_shape),
            ("cross-attention: keys and values come from memory", kv_from_memory),
            ("cross-attention: masked memory positions are ignored", source_padding),
        ],
        "05-multi-head.md",
    )
