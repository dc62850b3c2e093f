"""The checker for the sinusoidal positional encoding (tour page 6)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.tour.report import FoundBugError, Report, expect_shape, name_of, run_checks


def _exponent(w: float, d: int) -> str:
    """Frequency ``w`` as the formula writes it, 1/10000^(e/d_model): ``e/d_model``."""
    return f"{round(-math.log(w) / math.log(10000.0) * d, 2) + 0.0:.2f}/d_model" if w > 0 else "?"


def _one_angle_per_pair(pe: Tensor) -> None:
    """Raise ``sin_cos_frequencies_differ`` unless the sin and cos of every pair take one
    angle: then sin^2 + cos^2 = 1 at every position. Each column's frequency is measured
    on its own (at position 1: the sine's is asin, the cosine's acos) for the message."""
    off = (pe[:, 0::2].square() + pe[:, 1::2].square() - 1).abs()  # [max_len, d/2]
    if float(off.max()) < 1e-4:
        return
    i = int((off.amax(0) >= 1e-4).nonzero()[0])
    pos = int(off[:, i].argmax())
    d = pe.size(1)
    w_sin = math.asin(max(-1.0, min(1.0, float(pe[1, 2 * i]))))
    w_cos = math.acos(max(-1.0, min(1.0, float(pe[1, 2 * i + 1]))))
    raise FoundBugError(
        "sin_cos_frequencies_differ",
        f"the sine and cosine of a pair take one angle, so PE(pos, 2i)^2 + PE(pos, 2i+1)^2 "
        f"= 1 at every position; in pair {i} (dimensions {2 * i} and {2 * i + 1}) it is "
        f"{float(pe[pos, 2 * i] ** 2 + pe[pos, 2 * i + 1] ** 2):.3f} at position "
        f"{pos}. Measured column by column, the sine's frequency is {w_sin:.4f} = "
        f"1/10000^({_exponent(w_sin, d)}) and the cosine's {w_cos:.4f} = "
        f"1/10000^({_exponent(w_cos, d)}); the formula gives both 1/10000^({2 * i}/d_model). "
        "The exponent was computed per dimension (the cosine's from its own index, 2i+1, "
        "or the next pair's, 2(i+1)): compute the angle once per pair, "
        "pos / 10000^(2i/d_model), and take its sin and its cos.",
        "06-positional-encoding.md",
    )


def check_positional_encoding(fn: Callable[[int, int], Tensor]) -> Report:
    """Check a learner's ``fn(max_len, d_model) -> [max_len, d_model]`` table:
    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same). The frequency
    of every (sin, cos) pair is measured from the table, after checking that the two take
    one angle. Bugs: ``wrong_shape``, ``sin_cos_swapped``, ``halves_not_interleaved``,
    ``positions_start_at_1``, ``sin_cos_frequencies_differ``, ``halved_exponent``,
    ``doubled_exponent``, ``wrong_frequencies``, ``wrong_values``, ``wrong_far_positions``,
    ``low_precision_table``, ``raises``."""
    L, d = 50, 32

    def table(L: int = L) -> Tensor:
        pe = fn(L, d)
        if type(pe).__module__ == "numpy":  # a NumPy table is as good as a tensor
            pe = torch.as_tensor(pe)
        if not isinstance(pe, Tensor):
            raise FoundBugError("wrong_return", f"fn returned {type(pe).__name__}, not a tensor")
        if pe.dim() == 3 and 1 in pe.shape[:2]:  # [1, max_len, d] or [max_len, 1, d]
            pe = pe.flatten(0, 1)
        expect_shape(pe, (L, d), f"fn({L}, {d})", "06-positional-encoding.md")
        if pe.dtype in (torch.float16, torch.bfloat16):
            raise FoundBugError(
                "low_precision_table",
                f"the table is {pe.dtype}, which keeps about "
                f"{3 if pe.dtype == torch.float16 else 2} significant digits: its entries are "
                "off by up to 1e-3 or more, and a position over 2048 (or 256) is not even "
                "represented exactly, so far positions get wrong angles. Build it in float32 "
                "(a model cast to half precision later casts its output, not the angles).",
                "06-positional-encoding.md",
            )
        return pe.double()

    def position_zero() -> None:
        row = table()[0]  # sin(0) = 0 in even dimensions, cos(0) = 1 in odd ones
        zeros, ones = torch.zeros(d // 2, dtype=row.dtype), torch.ones(d // 2, dtype=row.dtype)
        if torch.allclose(row[0::2], zeros) and torch.allclose(row[1::2], ones):
            return
        if torch.allclose(row[0::2], ones) and torch.allclose(row[1::2], zeros):
            raise FoundBugError(
                "sin_cos_swapped",
                "position 0 is [1, 0, 1, 0, ...]: the even dimensions hold cos, the odd ones sin",
                "06-positional-encoding.md",
            )
        if torch.allclose(row[: d // 2], zeros) and torch.allclose(row[d // 2 :], ones):
            raise FoundBugError(
                "halves_not_interleaved",
                "position 0 is [0, ..., 0, 1, ..., 1]: all the sines first, then all the "
                "cosines (tensor2tensor's layout). The paper interleaves them: sin in "
                "dimension 2i, cos in 2i+1.",
                "06-positional-encoding.md",
            )
        pos = torch.tensor(1.0, dtype=row.dtype)
        angle = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=row.dtype) / d)
        if torch.allclose(row[0::2], angle.sin(), atol=1e-5) and torch.allclose(
            row[1::2], angle.cos(), atol=1e-5
        ):
            raise FoundBugError(
                "positions_start_at_1",
                "row 0 of the table is the formula at position 1: the positions count from "
                "1. The first token is at position 0: torch.arange(max_len), whose row 0 is "
                "sin(0) = 0 and cos(0) = 1.",
                "06-positional-encoding.md",
            )
        raise FoundBugError(
            "wrong_values",
            f"position 0 should be [0, 1, 0, 1, ...], got "
            f"{[round(x, 3) for x in row[:6].tolist()]}...",
            "06-positional-encoding.md",
        )

    def frequencies() -> None:
        pe = table()
        _one_angle_per_pair(pe)
        # At position 1, pair i holds (sin w_i, cos w_i): its angle is the frequency w_i.
        w = torch.atan2(pe[1, 0::2], pe[1, 1::2])
        i = torch.arange(d // 2, dtype=torch.float64)
        expected = 10000.0 ** (-2 * i / d)
        if torch.allclose(w, expected, rtol=1e-4, atol=1e-9):
            return
        longest = 2 * math.pi / float(w[-1]) if float(w[-1]) > 0 else math.inf
        said = (
            f"the longest wavelength is {longest:.0f} positions, where the paper's formula "
            f"gives {2 * math.pi / float(expected[-1]):.0f} for d_model = {d} (its wavelengths "
            "run from 2 pi towards 10000 * 2 pi = 62832, which only a next pair would reach)"
        )
        if torch.allclose(w, 10000.0 ** (-i / d), rtol=1e-4, atol=1e-9):
            raise FoundBugError(
                "halved_exponent",
                said + ": the exponent is i/d_model, not 2i/d_model",
                "06-positional-encoding.md",
            )
        if torch.allclose(w, 10000.0 ** (-4 * i / d), rtol=1e-4, atol=1e-9):
            raise FoundBugError(
                "doubled_exponent",
                said + ": the exponent is 4i/d_model, not 2i/d_model. When i already runs "
                "over the even dimensions, torch.arange(0, d_model, 2), it is 2i: divide it by "
                "d_model without doubling it again.",
                "06-positional-encoding.md",
            )
        raise FoundBugError("wrong_frequencies", said, "06-positional-encoding.md")

    def every_position() -> None:
        pe = table()
        pos = torch.arange(L, dtype=torch.float64)[:, None]
        angle = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        if not (
            torch.allclose(pe[:, 0::2], angle.sin(), atol=1e-5)
            and torch.allclose(pe[:, 1::2], angle.cos(), atol=1e-5)
        ):
            raise FoundBugError(
                "wrong_values",
                "the table differs from the formula at later positions",
                "06-positional-encoding.md",
            )
        far = torch.tensor([255, 257, 1000, 2049, 4095])  # past bf16's and fp16's integers
        pe, angle = table(4096)[far], far[:, None].double() * angle[1]
        if not (
            torch.allclose(pe[:, 0::2], angle.sin(), atol=2e-3)
            and torch.allclose(pe[:, 1::2], angle.cos(), atol=2e-3)
        ):
            raise FoundBugError(
                "wrong_far_positions",
                "fn(4096, d_model) differs from the formula at positions 255..4095: the "
                "positions or angles are counted in a low-precision type (bfloat16 holds "
                "whole numbers exactly only up to 256, float16 up to 2048). Build them in "
                "float32: torch.arange(max_len, dtype=torch.float32).",
                "06-positional-encoding.md",
            )

    return run_checks(
        f"check_positional_encoding({name_of(fn)})",
        [
            ("returns [max_len, d_model]", table),
            ("position 0 is sin(0) = 0 and cos(0) = 1, alternately", position_zero),
            ("pair i has the frequency 1/10000^(2i/d_model)", frequencies),
            ("every position follows the formula", every_position),
        ],
        "06-positional-encoding.md",
    )
