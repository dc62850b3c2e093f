"""Checkers for the positional encoding and the layers (tour pages 6 to 10): the
feed-forward network, the encoder layer and the decoder layer, each called as aiayn's own."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

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

B, T, S = 2, 5, 7


class _Run(Protocol):
    """A layer's output for ``x`` (``grad=True``: in training mode, for a backward)."""

    def __call__(self, x: Tensor, *, grad: bool = False) -> Tensor: ...


def check_positional_encoding(fn: Callable[[int, int], Tensor]) -> Report:
    """Check a learner's ``fn(max_len, d_model) -> [max_len, d_model]`` table:
    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same). The frequency
    of every (sin, cos) pair is measured from the table. Bugs: ``sin_cos_swapped``,
    ``halves_not_interleaved``, ``halved_exponent``, ``wrong_frequencies``,
    ``wrong_values``."""
    L, d = 50, 32

    def table() -> Tensor:
        pe = fn(L, d)
        if not isinstance(pe, Tensor):
            raise FoundBugError("wrong_return", f"fn returned {type(pe).__name__}, not a tensor")
        pe = pe.squeeze(0) if pe.dim() == 3 else pe
        expect_shape(pe, (L, d), f"fn({L}, {d})", "06-positional-encoding.md")
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
        raise FoundBugError(
            "wrong_values",
            f"position 0 should be [0, 1, 0, 1, ...], got "
            f"{[round(x, 3) for x in row[:6].tolist()]}...",
            "06-positional-encoding.md",
        )

    def frequencies() -> None:
        pe = table()
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

    return run_checks(
        f"check_positional_encoding({name_of(fn)})",
        [
            ("returns [max_len, d_model]", table),
            ("position 0 is sin(0) = 0 and cos(0) = 1, alternately", position_zero),
            ("pair i has the frequency 1/10000^(2i/d_model)", frequencies),
            ("every position follows the formula", every_position),
        ],
    )


def check_feed_forward(module: nn.Module, d_model: int) -> Report:
    """Check a learner's ``module(x [B, T, d_model]) -> [B, T, d_model]``, the position-wise
    FFN: each position's output depends on that position alone."""
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(0))

    def run(x: Tensor) -> Tensor:
        with evaluating(module):
            return first_tensor(module(x), "the module")

    def position_wise() -> None:
        one_by_one = torch.cat([run(x[:, t : t + 1]) for t in range(T)], dim=1)
        if not close(run(x), one_by_one, atol=1e-5):
            raise FoundBugError(
                "not_position_wise",
                "a position's output depends on other positions",
                "07-feed-forward.md",
            )

    def nonlinear() -> None:
        if close(run(x) + run(-x), 2 * run(0 * x), atol=1e-5):  # true of any affine map
            raise FoundBugError(
                "no_relu",
                "the network is affine: the ReLU between W_1 and W_2 is missing",
                "07-feed-forward.md",
            )

    return run_checks(
        f"check_feed_forward({name_of(module)})",
        [
            ("returns [B, T, d_model]", lambda: expect_shape(run(x), (B, T, d_model), "output")),
            (
                "nothing built in forward",
                lambda: check_no_modules_built_in_forward(module, lambda: run(x)),
            ),
            ("each position on its own", position_wise),
            ("a ReLU between the two maps", nonlinear),
        ],
    )


def _with_weights(layer: nn.Module, *args: object) -> object:
    """Call ``layer`` asking for attention weights when its forward takes need_weights."""
    if "need_weights" in inspect.signature(layer.forward).parameters:
        return layer(*args, need_weights=True)
    return layer(*args)


def _common_checks(layer: nn.Module, run: _Run, x: Tensor, d: int) -> list[Check]:
    def deterministic() -> None:
        if not close(run(x), run(x), atol=0):
            raise FoundBugError(
                "dropout_in_eval",
                "two calls in eval mode give different outputs: dropout is still on. "
                "Use nn.Dropout modules (or F.dropout(x, p, training=self.training)).",
                "08-residual-layernorm.md",
            )

    def gradients() -> None:
        was = layer.training
        layer.eval()
        try:
            layer.zero_grad()
            run(x, grad=True).pow(2).sum().backward()
        finally:
            layer.train(was)
        idle = [n for n, p in layer.named_parameters() if p.requires_grad and p.grad is None]
        if idle:
            raise FoundBugError(
                "unused_parameters",
                f"no gradient reaches {', '.join(idle[:4])}: "
                "a weight the layer defines but never uses",
                "08-residual-layernorm.md",
            )

    return [
        ("returns [B, T, d_model]", lambda: expect_shape(run(x), (*x.shape[:2], d), "The output")),
        (
            "nothing built in forward (a LayerNorm made in forward)",
            lambda: check_no_modules_built_in_forward(layer, lambda: run(x)),
        ),
        ("eval mode is deterministic (dropout off)", deterministic),
        ("every parameter gets a gradient", gradients),
    ]


def check_encoder_layer(layer: nn.Module, d_model: int) -> Report:
    """Check a learner's encoder layer, called as aiayn's ``EncoderLayer``:
    ``layer(x [B, S, d_model], src_mask [B, 1, 1, S])`` returning x or ``(x, weights)``."""
    x = torch.randn(B, S, d_model, generator=torch.Generator().manual_seed(0))
    everyone = torch.ones(B, 1, 1, S, dtype=torch.bool)

    def run(x: Tensor, mask: Tensor = everyone, grad: bool = False) -> Tensor:
        if grad:
            return first_tensor(layer(x, mask), "the layer")
        with evaluating(layer):
            return first_tensor(layer(x, mask), "the layer")

    def permutation() -> None:
        perm = torch.tensor([3, 0, 6, 4, 1, 5, 2])
        if not close(run(x[:, perm]), run(x)[:, perm], atol=1e-4):
            raise FoundBugError(
                "mixes_positions",
                "shuffling the input positions does not shuffle the outputs alike",
                "09-encoder.md",
            )

    def padding() -> None:
        keys = everyone.clone()
        keys[1, ..., 4:] = False  # sentence 1 has 4 real tokens, then 3 pads
        changed = x.clone()
        changed[1, 4:] = 50.0
        if not close(run(x, keys)[1, :4], run(changed, keys)[1, :4], atol=1e-4):
            raise FoundBugError(
                "padding_leaks",
                "the real positions of a padded sentence change with what its pad positions hold",
                "04-masks.md",
            )

    checks = _common_checks(layer, run, x, d_model)
    checks += [
        ("positions treated alike (no mask)", permutation),
        ("pads do not reach real positions", padding),
    ]
    return run_checks(f"check_encoder_layer({name_of(layer)})", checks)


def check_decoder_layer(layer: nn.Module, d_model: int) -> Report:
    """Check a learner's decoder layer, called as aiayn's ``DecoderLayer``:
    ``layer(x [B, T, d_model], memory [B, S, d_model], self_mask [.., T, T], cross_mask
    [B, 1, 1, S])`` returning ``(x, self-attention weights [B, h, T, T], encoder-decoder
    weights [B, h, T, S])`` (with ``need_weights=True`` when forward takes it). Bugs:
    ``returns_self_attention_twice``, ``future_leaks``, ``ignores_memory``,
    ``source_padding_leaks``, and those of the encoder layer."""
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(B, T, d_model, generator=g), torch.randn(B, S, d_model, generator=g)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    sources = torch.ones(B, 1, 1, S, dtype=torch.bool)
    sources[1, ..., 5:] = False  # sentence 1: 5 real source tokens, then 2 pads

    def outputs(x: Tensor, memory: Tensor = memory, grad: bool = False) -> Sequence[Any]:
        if grad:
            result = _with_weights(layer, x, memory, causal, sources)
        else:
            with evaluating(layer):
                result = _with_weights(layer, x, memory, causal, sources)
        if not (isinstance(result, (tuple, list)) and len(result) == 3):
            raise FoundBugError(
                "wrong_return",
                "a decoder layer returns (x, self-attention weights, encoder-decoder "
                "weights), as aiayn's DecoderLayer does; this one returned "
                + (f"{len(result)} values" if isinstance(result, (tuple, list)) else "a tensor"),
                "10-decoder.md",
            )
        return result

    def run(x: Tensor, memory: Tensor = memory, grad: bool = False) -> Tensor:
        return first_tensor(outputs(x, memory, grad)[0], "the layer")

    def weights() -> None:
        _, self_w, cross_w = outputs(x)
        if not isinstance(self_w, Tensor) or not isinstance(cross_w, Tensor):
            raise FoundBugError(
                "wrong_return",
                "the two weights must be tensors (ask for them with need_weights=True)",
                "10-decoder.md",
            )
        h = self_w.size(1) if self_w.dim() == 4 else 0
        expect_shape(self_w, (B, h, T, T), "The self-attention weights", "10-decoder.md")
        if cross_w is self_w or close(cross_w, self_w, atol=0):
            raise FoundBugError(
                "returns_self_attention_twice",
                f"the 'encoder-decoder' weights are the self-attention weights again "
                f"([B, h, T, T] = {list(cross_w.shape)}). Return the weights of the second "
                f"attention, over the source: [B, h, T, S] = {[B, h, T, S]}.",
                "10-decoder.md",
            )
        expect_shape(cross_w, (B, h, T, S), "The encoder-decoder weights", "10-decoder.md")
        if not torch.allclose(cross_w.sum(-1), torch.ones(B, h, T), atol=1e-4):
            raise FoundBugError(
                "wrong_cross_weights",
                "the encoder-decoder weights of a query must sum to 1 over the source",
                "10-decoder.md",
            )
        if (cross_w[1, ..., 5:] != 0).any():
            raise FoundBugError(
                "source_padding_leaks",
                "the encoder-decoder attention puts weight on the source's padding: give it "
                "the source padding mask (cross_mask)",
                "04-masks.md",
            )

    def causality() -> None:
        later = x.clone()
        later[:, 3:] += 1.0
        if not close(run(x)[:, :3], run(later)[:, :3], atol=1e-5):
            raise FoundBugError(
                "future_leaks",
                "changing target positions 3.. changed the outputs at 0..2 under a causal mask",
                "12-teacher-forcing.md",
            )

    def source() -> None:
        other = torch.randn(B, S, d_model, generator=torch.Generator().manual_seed(1))
        if close(run(x), run(x, other), atol=1e-6):
            raise FoundBugError(
                "ignores_memory",
                "the output does not change when the encoder memory "
                "changes: the source never reaches the decoder",
                "10-decoder.md",
            )
        padded = memory.clone()
        padded[1, 5:] = 50.0
        if not close(run(x)[1], run(x, padded)[1], atol=1e-4):
            raise FoundBugError(
                "source_padding_leaks",
                "what the source's pad positions hold changes the output",
                "04-masks.md",
            )

    checks: list[Check] = [("returns (x, self weights, cross weights)", lambda: outputs(x))]
    checks += _common_checks(layer, run, x, d_model)
    checks += [
        ("the weights: [B, h, T, T] over the target, [B, h, T, S] over the source", weights),
        ("the causal mask keeps the future out", causality),
        ("the source enters, its padding does not", source),
    ]
    return run_checks(f"check_decoder_layer({name_of(layer)})", checks)
