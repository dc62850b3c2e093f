"""aiayn.train.loss beyond the bare loss: the fused loss's backward must scale by the
incoming gradient (training back-propagates ``loss * weight / n_tokens``, and fp16 runs a
GradScaler's ``loss * 2^16``), it must give gradients when only the projection is
trained, and its default chunking must keep every chunk's logits within CHUNK_LOGITS."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn import functional as F

from aiayn.train import loss as loss_module
from aiayn.train.loss import label_smoothed_cross_entropy, projected_label_smoothed_loss


def _inputs(bias: bool, hidden_grad: bool = True):
    torch.manual_seed(0)
    hidden = torch.randn(3, 8, 16, requires_grad=hidden_grad)
    weight = torch.randn(30, 16, requires_grad=True)
    b = torch.randn(30, requires_grad=True) if bias else None
    target = torch.randint(1, 30, (3, 8))
    target[0, 5:] = 0
    return hidden, weight, b, target


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scale", [0.25, 3.0, 65536.0])
def test_the_fused_loss_gradients_scale_with_the_loss(bias, scale):
    hidden, weight, b, target = _inputs(bias)
    params = [hidden, weight] + ([b] if b is not None else [])
    loss, _ = projected_label_smoothed_loss(hidden, weight, b, target, 0.1, 0, 3)
    fused = torch.autograd.grad(loss * scale, params)
    full_loss, _, _ = label_smoothed_cross_entropy(F.linear(hidden, weight, b), target)
    full = torch.autograd.grad(full_loss * scale, params)
    for a, c in zip(fused, full):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5 * scale)


def test_the_fused_loss_trains_the_projection_alone():
    """Frozen hidden states (a frozen model below the output layer): the projection's
    gradients still come back."""
    hidden, weight, b, target = _inputs(bias=True, hidden_grad=False)
    loss, _ = projected_label_smoothed_loss(hidden, weight, b, target, 0.1, 0, 2)
    fused = torch.autograd.grad(loss, [weight, b])
    full_loss, _, _ = label_smoothed_cross_entropy(F.linear(hidden, weight, b), target)
    full = torch.autograd.grad(full_loss, [weight, b])
    for a, c in zip(fused, full):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_the_fused_loss_trains_the_output_bias_alone():
    """Only the bias trained (hidden states and weight frozen): the fused loss computed no
    gradients and its backward raised "computed without gradients"."""
    hidden, weight, b, target = _inputs(bias=True, hidden_grad=False)
    weight.requires_grad_(False)
    assert b is not None
    loss, _ = projected_label_smoothed_loss(hidden, weight, b, target, 0.1, 0, 2)
    (fused,) = torch.autograd.grad(loss, [b])
    full_loss, _, _ = label_smoothed_cross_entropy(F.linear(hidden, weight, b), target)
    torch.testing.assert_close(fused, torch.autograd.grad(full_loss, [b])[0])


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
def test_default_chunks_keep_each_piece_within_chunk_logits(monkeypatch, rows):
    """Without ``chunks`` the positions are cut so that no piece holds more than
    CHUNK_LOGITS logits (the memory bound the fused loss exists for)."""
    V, C = 30, 8
    monkeypatch.setattr(loss_module, "CHUNK_LOGITS", 4 * V + 7)  # 4 positions a piece
    seen = []
    apply = loss_module._ProjectedSmoothedLoss.apply

    def spy(*args):
        seen.append(args[6])  # bounds
        return apply(*args)

    monkeypatch.setattr(loss_module._ProjectedSmoothedLoss, "apply", spy)
    torch.manual_seed(0)
    hidden, weight = torch.randn(rows, C, 16), torch.randn(V, 16)
    target = torch.randint(1, V, (rows, C))
    got, _ = projected_label_smoothed_loss(hidden, weight, None, target)
    (bounds,) = seen
    assert bounds[0] == 0 and bounds[-1] == rows * C
    assert max(e - s for s, e in itertools.pairwise(bounds)) * V <= loss_module.CHUNK_LOGITS
    want, _, _ = label_smoothed_cross_entropy(F.linear(hidden, weight), target)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
