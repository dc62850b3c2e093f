"""Checkers for the layers (tour pages 7 to 9): the feed-forward network and the encoder
layer, each called as aiayn's own, and the checks every layer gets (the decoder layer's
checker, :mod:`aiayn.tour.decoder`, adds its own)."""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
from torch import Tensor, nn

from aiayn.tour.attention import K_T
from aiayn.tour.modules import (
    activations_not_relu,
    check_deterministic,
    check_gradients,
    check_no_modules_built_in_forward,
)
from aiayn.tour.report import (
    HEAD_SPLIT,
    INVERTED_MASK,
    Check,
    FoundBugError,
    Report,
    close,
    evaluating,
    expect_finite,
    expect_shape,
    first_tensor,
    name_of,
    not_a_module,
    run_checks,
)
from aiayn.tour.residual import check_residual
from aiayn.tour.scale import check_scales

B, T, S = 2, 5, 7


class _Run(Protocol):
    """A layer's output for ``x`` (``grad=True``: in training mode, for a backward)."""

    def __call__(self, x: Tensor, *, grad: bool = False) -> Tensor: ...


def check_feed_forward(module: nn.Module, d_model: int) -> Report:
    """Check a learner's ``module(x [B, T, d_model]) -> [B, T, d_model]``, the position-wise
    FFN: each position's output depends on that position alone. Bugs: ``wrong_shape``,
    ``nan_output``, ``module_built_in_forward``, ``modules_in_plain_list``, ``dropout_in_eval``,
    ``unused_parameters``, ``not_position_wise``, ``no_relu``, ``relu_on_input``, ``not_relu``
    (GELU, SiLU, tanh, ... where the ReLU belongs), ``relu_after_second_layer``, ``raises``."""
    subject = f"check_feed_forward({name_of(module)})"
    if (refused := not_a_module(module, subject, "07-feed-forward.md")) is not None:
        return refused
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(0))

    def run(x: Tensor) -> Tensor:
        with evaluating(module):
            return first_tensor(module(x), "the module")

    def gradients() -> None:
        def loss() -> Tensor:
            return first_tensor(module(x), "the module").pow(2).sum()

        check_gradients(module, loss, "network")

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
        a, b = x.abs(), x.roll(1, dims=1).abs()  # every feature > 0: a ReLU of x is x
        if close(run(a) + run(b), 2 * run((a + b) / 2), atol=1e-5):
            raise FoundBugError(
                "relu_on_input",
                "on inputs whose features are all positive the network is affine: the ReLU "
                "is applied to x itself (which it leaves as it is there), not between the "
                "two maps. The FFN is max(0, x W_1 + b_1) W_2 + b_2.",
                "07-feed-forward.md",
            )
        if found := activations_not_relu(lambda: run(x)):
            raise FoundBugError(
                "not_relu",
                f"the activation between the two maps is {', '.join(found)}, not ReLU: "
                "the FFN is max(0, x W_1 + b_1) W_2 + b_2, and max(0, .) gives exactly 0 "
                "for every negative input, where GELU, SiLU and the like give small "
                "negative values. Use torch.relu (or nn.ReLU()).",
                "07-feed-forward.md",
            )

    def linear_output() -> None:
        if bool((run(x) >= 0).all()):
            raise FoundBugError(
                "relu_after_second_layer",
                "no output is negative: a ReLU comes after W_2. The FFN is "
                "max(0, x W_1 + b_1) W_2 + b_2, the ReLU between the two maps only.",
                "07-feed-forward.md",
            )

    return run_checks(
        subject,
        [
            ("returns [B, T, d_model]", lambda: expect_output(run(x), (B, T, d_model))),
            (
                "nothing built in forward",
                lambda: check_no_modules_built_in_forward(module, lambda: run(x)),
            ),
            (
                "eval mode is deterministic (dropout off)",
                lambda: check_deterministic(lambda: run(x)),
            ),
            ("every parameter gets a gradient", gradients),
            ("each position on its own", position_wise),
            ("a ReLU between the two maps", nonlinear),
            ("no ReLU after the second map", linear_output),
        ],
        "07-feed-forward.md",
    )


def with_weights(layer: nn.Module, *args: object) -> object:
    """Call ``layer`` asking for attention weights when its forward takes need_weights."""
    if "need_weights" in inspect.signature(layer.forward).parameters:
        return layer(*args, need_weights=True)
    return layer(*args)


def expect_output(out: Tensor, shape: tuple[int, ...], masks: bool = False) -> None:
    """The output has ``shape`` and is finite (NaN there would pass every later check that
    compares outputs, or fail one for the wrong reason); ``masks``: the call was given masks
    that leave every query a key."""
    expect_shape(out, shape, "The output")
    expect_finite(out, "The output", INVERTED_MASK if masks else "")


def common_checks(layer: nn.Module, run: _Run, x: Tensor, d: int) -> list[Check]:
    return [
        ("returns [B, T, d_model]", lambda: expect_output(run(x), (*x.shape[:2], d), True)),
        (
            "nothing built in forward (a LayerNorm made in forward)",
            lambda: check_no_modules_built_in_forward(layer, lambda: run(x)),
        ),
        ("eval mode is deterministic (dropout off)", lambda: check_deterministic(lambda: run(x))),
        (
            "every parameter gets a gradient",
            lambda: check_gradients(layer, lambda: run(x, grad=True).pow(2).sum(), "layer"),
        ),
    ]


def check_encoder_layer(layer: nn.Module, d_model: int) -> Report:
    """Check a learner's encoder layer, called as aiayn's ``EncoderLayer``:
    ``layer(x [B, S, d_model], src_mask [B, 1, 1, S])`` returning x or ``(x, weights)``.
    The scale of its attention is fitted against its own projections (see
    :func:`aiayn.tour.scale.measure_scales`; one inside nn.MultiheadAttention is torch's
    and passes unmeasured). Bugs: ``wrong_shape``, ``nan_output`` (a mask read the other
    way round, say), ``module_built_in_forward``, ``modules_in_plain_list``,
    ``dropout_in_eval``, ``unused_parameters``, ``mixes_positions``, ``padding_leaks``,
    ``missing_scale``, ``divides_by_d_k``, ``scale_by_d_model``, ``wrong_scale``,
    ``missing_residual``, ``residual_on_normalized_input``, ``not_a_module``,
    ``raises``. A scale it cannot fit, or a residual path it cannot silence, is reported as
    not checked, never as passed."""
    subject = f"check_encoder_layer({name_of(layer)})"
    if (refused := not_a_module(layer, subject, "09-encoder.md")) is not None:
        return refused
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

    def residual() -> None:
        check_residual(layer, lambda m, x: first_tensor(m(x, everyone), "the layer"), x)

    checks = common_checks(layer, run, x, d_model)
    checks += [
        ("positions treated alike (no mask)", permutation),
        ("pads do not reach real positions", padding),
        (
            "each head scales its scores by 1/sqrt(d_k)",
            lambda: check_scales(lambda: run(x), B, d_model),
        ),
        ("the residual connections (post-LN or pre-LN)", residual),
    ]
    hint = (
        "The layer is called batch first, layer(x [B, S, d_model], src_mask [B, 1, 1, S]), "
        f"as aiayn's EncoderLayer. {HEAD_SPLIT} {K_T}"
    )
    return run_checks(subject, checks, "09-encoder.md", hint)
