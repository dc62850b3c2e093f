"""The checker of the head split and merge (tour page 5). The checker of a whole
multi-head attention module, :func:`check_multi_head_attention`, lives in
:mod:`aiayn.tour.multihead` and is importable from here too."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.tour.multihead import check_multi_head_attention
from aiayn.tour.report import Check, FoundBugError, Report, close, expect_shape, name_of, run_checks

__all__ = ["check_multi_head_attention", "check_split_heads"]

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
    positions. ``merge`` is given both split's own output (a transposed view) and a fresh
    contiguous ``[B, h, T, d_k]`` tensor, as attention returns. Bugs: ``wrong_shape``,
    ``split_without_transpose``, ``result_thrown_away``, ``reshape_without_transpose``,
    ``mixes_positions``, ``strided_features``, ``merge_without_transpose``,
    ``view_on_non_contiguous``, ``merge_wrong``, ``raises``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D_MODEL, generator=g)

    def shape() -> None:
        out = split(x, H)
        if not isinstance(out, Tensor):
            raise FoundBugError(
                "wrong_return",
                f"split returned {type(out).__name__}, not a torch tensor: keep the tensor "
                "a tensor (x.view(...).transpose(1, 2)), as the attention after it needs",
                "05-multi-head.md",
            )
        if tuple(out.shape) == (B, T, H, D_K):
            raise FoundBugError(
                "split_without_transpose",
                f"split(x {[B, T, D_MODEL]}, {H}) has shape [B, T, h, d_k] = "
                f"{list(out.shape)}, expected [B, h, T, d_k] = {[B, H, T, D_K]}: the view is "
                "there, the transpose(1, 2) that puts the heads before the positions is not "
                "(or its result was thrown away: x.transpose(1, 2) on a line of its own "
                "leaves x as it was). Return x.view(B, T, h, d_k).transpose(1, 2).",
                "05-multi-head.md",
            )
        # Each shape a thrown-away view() leaves, without or with the transpose after it.
        if tuple(out.shape) in ((B, D_MODEL, T), (B, T, D_MODEL)):
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
        if not isinstance(back, Tensor):
            raise FoundBugError(
                "wrong_return",
                f"merge returned {type(back).__name__}, not a torch tensor",
                "05-multi-head.md",
            )
        if close(back, heads.reshape(B, T, D_MODEL), atol=0) and not close(back, x, atol=0):
            raise FoundBugError(
                "merge_without_transpose",
                "merge reshapes [B, h, T, d_k] straight to [B, T, d_model]: the heads' rows "
                "end up at the wrong positions. transpose(1, 2) first, then reshape.",
                "05-multi-head.md",
            )
        if not close(back, x, atol=0):
            raise FoundBugError("merge_wrong", "merge(split(x)) is not x", "05-multi-head.md")
        # Attention hands merge a new contiguous tensor, not split's transposed view (which
        # transposes back to contiguous memory, so a .view() on it happens to work).
        try:
            fresh = merge(heads.contiguous())
        except RuntimeError as error:
            if "view size" not in str(error):
                raise
            raise FoundBugError(
                "view_on_non_contiguous",
                "merge raised on a contiguous [B, h, T, d_k] tensor, the kind attention "
                "returns: its transpose(1, 2) is not contiguous in memory, and .view() on a "
                "non-contiguous tensor fails. merge(split(x)) worked only "
                "because split's transposed view transposes back to contiguous memory. "
                "Use .reshape(B, T, d_model), or .contiguous().view(B, T, d_model).",
                "05-multi-head.md",
            ) from None
        if not close(fresh, x, atol=0):
            raise FoundBugError(
                "merge_wrong",
                "merge of a contiguous copy of split(x) (what attention returns) is not x, "
                "though merge(split(x)) is",
                "05-multi-head.md",
            )

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
