"""Checkers for the masks (tour page 4): the causal mask of the decoder's self-attention
and the padding mask of the keys, both boolean, True where a query may attend."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.tour.report import FoundBugError, Report, name_of, run_checks


def _as_square(mask: object, size: int, what: str) -> Tensor:
    if not isinstance(mask, Tensor):
        raise FoundBugError("wrong_return", f"{what} returned {type(mask).__name__}, not a tensor")
    if mask.dtype != torch.bool:
        raise FoundBugError(
            "not_boolean",
            f"{what} has dtype {mask.dtype}; aiayn's masks are boolean, True = may attend "
            "(an additive 0/-inf float mask is another convention)",
            "04-masks.md",
        )
    if mask.numel() != size * size or mask.shape[-2:] != (size, size):
        raise FoundBugError(
            "wrong_shape",
            f"{what} has shape {list(mask.shape)}, expected [.., {size}, {size}]",
            "04-masks.md",
        )
    return mask.reshape(size, size)


def check_causal_mask(fn: Callable[[int], Tensor]) -> Report:
    """Check a learner's ``fn(size)``: the boolean causal mask, True where query t may
    attend to key s (s <= t), shape ``[size, size]`` or ``[1, 1, size, size]``."""
    ones = torch.ones(5, 5, dtype=torch.bool)

    def convention() -> None:
        m = _as_square(fn(5), 5, "fn(5)")
        if torch.equal(m, ones.tril()):
            return
        if torch.equal(m, ones.triu(1)):
            raise FoundBugError(
                "notes_convention",
                "this is triu(ones, 1): True above the diagonal, the notes' convention where "
                "True means MASKED. aiayn's True means may attend: tril(ones), or ~triu(ones, 1).",
                "00-map.md",
            )
        if torch.equal(m, ones.tril(-1)):
            raise FoundBugError(
                "diagonal_masked",
                "position t may not attend to itself: use tril(), not tril(-1)",
                "04-masks.md",
            )
        if torch.equal(m, ones.tril(1)):
            raise FoundBugError(
                "sees_one_future_token",
                "query t may attend to key t+1, one step into the future: tril(1) is off by "
                "one. Use tril() (diagonal 0): keys 0..t.",
                "04-masks.md",
            )
        if torch.equal(m, ones.triu()):
            raise FoundBugError(
                "sees_the_future",
                "query t may attend to keys t, t+1, ...: the future, not the past. Use tril.",
                "04-masks.md",
            )
        raise FoundBugError(
            "not_causal", f"fn(5) is\n{m.int()}\nnot the lower triangle", "04-masks.md"
        )

    def one() -> None:
        if not bool(_as_square(fn(1), 1, "fn(1)").all()):
            raise FoundBugError("diagonal_masked", "fn(1) masks the only key", "04-masks.md")

    return run_checks(
        f"check_causal_mask({name_of(fn)})",
        [("True on and below the diagonal, False above", convention), ("size 1", one)],
        "04-masks.md",
    )


_QUERY_AXIS = (
    "the mask does not hide the pad KEYS of sentence 1 for every query: the pads must be "
    "masked along the last axis, the keys, [B, 1, 1, S]. Masking queries, [B, 1, S, 1], "
    "leaves every query's softmax over the pads."
)


def check_padding_mask(fn: Callable[[Tensor, int], Tensor]) -> Report:
    """Check a learner's ``fn(ids [B, S], pad_id)``: the boolean key padding mask, True at
    real keys, broadcastable against scores ``[B, h, T_q, S]`` (e.g. ``[B, 1, 1, S]``)."""
    ids = torch.tensor([[7, 8, 9, 10, 11], [7, 8, 9, 5, 5]])  # the second padded with 5

    def mask_of(pad_id: int) -> Tensor:
        m = fn(ids, pad_id)
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            raise FoundBugError(
                "not_boolean", "the mask must be a boolean tensor, True = may attend", "04-masks.md"
            )
        try:
            return torch.broadcast_to(m, (2, 3, 4, 5))  # [B, h, T_q=4, S=5]
        except RuntimeError:
            if m.dim() >= 2 and m.shape[-2:] == (5, 1):  # [B, 1, S, 1]: along the queries
                raise FoundBugError("wrong_axis", _QUERY_AXIS, "04-masks.md") from None
            raise FoundBugError(
                "wrong_shape",
                f"a mask of shape {list(m.shape)} does not broadcast against scores "
                "[B, h, T_q, S] = [2, 3, 4, 5]: it must be [B, 1, 1, S] (one row of keys "
                "for every head and query)",
                "04-masks.md",
            ) from None

    def keys() -> None:
        m = mask_of(5)
        real = ids != 5
        if torch.equal(m, real[:, None, None, :].expand(2, 3, 4, 5)):
            return
        if torch.equal(m, (~real)[:, None, None, :].expand(2, 3, 4, 5)):
            raise FoundBugError(
                "inverted_mask", "True at the pads: aiayn's True means may attend", "04-masks.md"
            )
        if torch.equal(m, mask_of(7)):  # the same mask whatever the pad id
            raise FoundBugError(
                "ignores_pad_id",
                "with pad_id=5 the keys holding 5 (the padding of sentence 1) are not masked, "
                "and the mask is the same for pad_id=5 and pad_id=7: the pad_id argument is "
                "not used (a pad id written into the function, ids != 0, say). Compare with "
                "it: ids != pad_id.",
                "04-masks.md",
            )
        raise FoundBugError("wrong_axis", _QUERY_AXIS, "04-masks.md")

    def pad_id() -> None:
        if bool(mask_of(7)[0, 0, 0, 0]) or not bool(mask_of(7)[0, 0, 0, 1]):
            raise FoundBugError(
                "ignores_pad_id",
                "with pad_id=7 the key holding 7 must be masked: use the pad_id argument",
                "04-masks.md",
            )

    return run_checks(
        f"check_padding_mask({name_of(fn)})",
        [("False at pad keys, for every query and head", keys), ("uses pad_id", pad_id)],
        "04-masks.md",
    )
