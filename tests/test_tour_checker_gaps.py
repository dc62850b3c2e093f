"""Gaps found in aiayn.tour's checkers: a check that could not measure said "ok", errors of
the checker's own code were blamed on the learner, and some diagnoses named the wrong
cause. A check that cannot measure is now reported as not checked (never ok)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import tour
from aiayn.model.embedding import sinusoidal_table
from aiayn.model.layers import DecoderLayer
from test_tour_checks import CFG, LearnerMHA
from test_tour_module_checks import TorchMHA

SCALE = "each head scales its scores by 1/sqrt(d_k)"
RESIDUAL = "the residual connections (post-LN or pre-LN)"
FULLY_MASKED = "a fully masked query gets no NaN"


class PerHeadLinears(nn.Module):
    """One nn.Linear(d_model, d_k) per head (the formula read literally), scaled by
    ``scale`` (1/sqrt(d_k) by default)."""

    def __init__(self, d_model=32, h=4, scale=None, nan_safe=True):
        super().__init__()
        self.d_model, d_k, self.nan_safe = d_model, d_model // h, nan_safe
        self.scale = 1 / math.sqrt(d_k) if scale is None else scale
        self.q, self.k, self.v = (
            nn.ModuleList(nn.Linear(d_model, d_k) for _ in range(h)) for _ in range(3)
        )
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x, memory=None, mask=None):
        m = x if memory is None else memory
        heads = []
        for q, k, v in zip(self.q, self.k, self.v):
            s = q(x) @ k(m).transpose(-2, -1) * self.scale
            if mask is not None:
                s = s.masked_fill(~mask[:, 0], float("-inf"))
            w = s.softmax(-1)
            heads.append((w.nan_to_num(0.0) if self.nan_safe else w) @ v(m))
        return self.o(torch.cat(heads, -1))


class EinsumParams(nn.Module):
    """Raw [d_model, h, d_k] parameters used through einsum, scaled by ``scale``."""

    def __init__(self, d_model=32, h=4, scale=None):
        super().__init__()
        self.d_model, d_k = d_model, d_model // h
        self.scale = 1 / math.sqrt(d_k) if scale is None else scale
        self.wq, self.wk, self.wv = (
            nn.Parameter(torch.randn(d_model, h, d_k) / d_model**0.5) for _ in range(3)
        )
        self.wo = nn.Parameter(torch.randn(h, d_k, d_model) / d_model**0.5)

    def forward(self, x, memory=None, mask=None):
        m = x if memory is None else memory
        q = torch.einsum("btd,dhk->bhtk", x, self.wq)
        k = torch.einsum("bsd,dhk->bhsk", m, self.wk)
        v = torch.einsum("bsd,dhk->bhsk", m, self.wv)
        s = torch.einsum("bhtk,bhsk->bhts", q, k) * self.scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.einsum("bhts,bhsk,hkd->btd", s.softmax(-1).nan_to_num(0.0), v, self.wo)


class StridedHeads(nn.Module):
    """Correct attention whose head i owns features i, i + h, ...: no recorded projection
    holds a head's queries, so its scale cannot be fitted."""

    def __init__(self, d_model=32, h=4):
        super().__init__()
        self.d_model, self.h = d_model, h
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def split(self, t):
        return t.unflatten(-1, (-1, self.h)).permute(0, 3, 1, 2)

    def forward(self, x, memory=None, mask=None):
        m = x if memory is None else memory
        q, k, v = self.split(self.wq(x)), self.split(self.wk(m)), self.split(self.wv(m))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return self.wo((s.softmax(-1).nan_to_num(0.0) @ v).permute(0, 2, 3, 1).flatten(2))


@pytest.mark.parametrize("style", [PerHeadLinears, EinsumParams])
def test_the_scale_is_measured_in_per_head_and_einsum_styles(style):
    """Both passed "each head scales its scores by 1/sqrt(d_k)" whatever their scale."""
    assert tour.check_multi_head_attention(style()).complete
    wrong = tour.check_multi_head_attention(style(scale=1.0))
    assert wrong.bug == "missing_scale", str(wrong)
    too_small = tour.check_multi_head_attention(style(scale=1 / math.sqrt(32)))
    assert too_small.bug == "scale_by_d_model", str(too_small)


def test_an_unmeasured_scale_is_not_checked_never_ok():
    report = tour.check_multi_head_attention(StridedHeads())
    assert report.ok and not report.complete, str(report)  # no bug found: not a failure
    assert SCALE not in report.passed and [n for n, _ in report.unchecked] == [SCALE]
    said = str(report)
    assert "NOT ALL CHECKED" in said and "all 11 checks passed" not in said
    assert f"not checked: {SCALE}" in said and "could not be measured" in said
    layer = RawLayer()
    layer.att = StridedHeads()
    encoder = tour.check_encoder_layer(layer, 32)
    assert encoder.ok and [n for n, _ in encoder.unchecked] == [SCALE], str(encoder)
    assert "NOT ALL CHECKED" in str(encoder) and "7 checks passed" in str(encoder)


class RawAttention(nn.Module):
    """Self-attention with its four matrices as raw nn.Parameters (x @ W)."""

    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.W = nn.ParameterList(nn.Parameter(torch.randn(d, d) / d**0.5) for _ in range(4))

    def forward(self, x, mask=None):
        def split(t):
            return t.unflatten(-1, (self.h, -1)).transpose(1, 2)

        q, k, v = split(x @ self.W[0]), split(x @ self.W[1]), split(x @ self.W[2])
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2).flatten(2) @ self.W[3]


class RawLayer(nn.Module):
    def __init__(self, d=32, style="post", bias=False):
        super().__init__()
        self.att, self.style = RawAttention(d), style
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
        self.shift = nn.Parameter(torch.randn(d)) if bias else None  # no matrix: not silenced

    def forward(self, x, mask):
        a = self.att(x, mask=mask) + (0 if self.shift is None else self.shift)
        if self.style == "pre":
            x = x + self.att(self.n1(x), mask=mask)
            return x + self.ff(self.n2(x))
        if self.style == "no_residual":
            return self.n2(self.n1(a) + self.ff(self.n1(a)))
        x = self.n1(x + a)
        return self.n2(x + self.ff(x))


class InlineNormLayer(nn.Module):
    """Post-LN (or pre-LN) with every weight a raw parameter on the layer itself: the
    attention's and the feed-forward network's matrices, their biases and the LayerNorms'
    gains and biases (F.layer_norm)."""

    def __init__(self, d=32, h=4, style="post"):
        super().__init__()
        self.h, self.style = h, style
        self.wq, self.wk, self.wv, self.wo = (
            nn.Parameter(torch.randn(d, d) / d**0.5) for _ in range(4)
        )
        self.w1 = nn.Parameter(torch.randn(d, 4 * d) / d**0.5)
        self.w2 = nn.Parameter(torch.randn(4 * d, d) / (4 * d) ** 0.5)
        self.b1, self.b2 = nn.Parameter(torch.zeros(4 * d)), nn.Parameter(torch.zeros(d))
        self.g1, self.beta1 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.g2, self.beta2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def attend(self, x, mask):
        def split(t):
            return t.unflatten(-1, (self.h, -1)).transpose(1, 2)

        q, k, v = split(x @ self.wq), split(x @ self.wk), split(x @ self.wv)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2).flatten(2) @ self.wo

    def forward(self, x, mask):
        def ff(y):
            return F.relu(y @ self.w1 + self.b1) @ self.w2 + self.b2

        def norm(y, g, b):
            return F.layer_norm(y, y.shape[-1:], g, b)

        if self.style == "pre":
            x = x + self.attend(norm(x, self.g1, self.beta1), mask)
            return x + ff(norm(x, self.g2, self.beta2))
        x = norm(x + self.attend(x, mask), self.g1, self.beta1)
        return norm(x + ff(x), self.g2, self.beta2)


def test_the_residual_check_silences_raw_parameters():
    """A layer whose attention keeps raw nn.Parameter matrices passed the residual check
    unchecked, missing residual and all."""
    torch.manual_seed(0)
    missing = tour.check_encoder_layer(RawLayer(style="no_residual"), 32)
    assert missing.bug == "missing_residual", str(missing)
    for style in ("post", "pre"):
        assert tour.check_encoder_layer(RawLayer(style=style), 32).complete, style
    # A LayerNorm's gain kept beside raw matrices is zeroed with them: the correct post-LN
    # layer then returns 0, which proves no missing residual (it was reported as one).
    inline = tour.check_encoder_layer(InlineNormLayer(), 32)
    assert inline.ok and [n for n, _ in inline.unchecked] == [RESIDUAL], str(inline)
    assert tour.check_encoder_layer(InlineNormLayer(style="pre"), 32).complete
    shifted = tour.check_encoder_layer(RawLayer(bias=True), 32)  # a weight it cannot zero
    assert shifted.ok and [n for n, _ in shifted.unchecked] == [RESIDUAL], str(shifted)
    assert RESIDUAL not in shifted.passed and "could not be checked" in str(shifted)


def attention_f64(q, k, v, mask=None):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def test_errors_of_the_checkers_own_code_are_not_blamed_on_the_learner():
    assert tour.check_attention(attention_f64).complete  # the checker's w @ v mixed dtypes

    def per_token(logits, target, eps, pad_id):
        return F.cross_entropy(
            logits, target, ignore_index=pad_id, label_smoothing=eps, reduction="none"
        )

    loss = tour.check_label_smoothing(per_token)
    assert loss.bug == "not_a_scalar" and "[6]" in loss.message, str(loss)

    def split_numpy(x, h):
        b, t, d = x.shape
        return np.asarray(x).reshape(b, t, h, d // h).transpose(0, 2, 1, 3)

    split = tour.check_split_heads(split_numpy)
    assert split.bug == "wrong_return" and "ndarray" in split.message, str(split)

    def function(x, memory=None, mask=None):
        return x

    for checker, args in (
        (tour.check_multi_head_attention, (32,)),
        (tour.check_feed_forward, (32,)),
        (tour.check_encoder_layer, (32,)),
        (tour.check_decoder_layer, (32,)),
    ):
        report = checker(function, *args)
        assert report.bug == "not_a_module" and "function" in report.message, str(report)
    as_class = tour.check_multi_head_attention(PerHeadLinears, 32)
    assert as_class.bug == "not_a_module" and "PerHeadLinears(...)" in as_class.message


def test_a_hard_coded_pad_id_is_named():
    report = tour.check_padding_mask(lambda ids, pad_id: (ids != 0)[:, None, None, :])
    assert report.bug == "ignores_pad_id", str(report)  # it was named wrong_axis


class ThrownTranspose(LearnerMHA):
    def split(self, x):
        B, T, _ = x.shape
        x = x.view(B, T, self.h, -1)
        x.transpose(1, 2)  # the bug: its result is thrown away
        return x


class CrossRaises(LearnerMHA):
    def split(self, x):
        return x.view(x.size(0), 5, self.h, -1).transpose(1, 2)  # the bug: T fixed at 5


def test_an_error_in_forward_is_not_blamed_on_modules_built_in_forward():
    thrown = tour.check_multi_head_attention(ThrownTranspose(32, 4))
    assert thrown.bug == "mixes_positions" and "thrown away" in thrown.message, str(thrown)
    raised = tour.check_multi_head_attention(CrossRaises(32, 4))
    assert raised.failed == "cross-attention returns one row per query position", str(raised)
    assert raised.bug == "raises" and "cross-attention" in raised.message
    assert "is invalid for input of size" in raised.message  # the learner's own error
    assert "every module that runs belongs to it (nothing built in forward)" in raised.passed


def test_shift_target_quotes_the_row_that_differs_as_ints():
    def padded(ys):
        n = max(map(len, ys)) + 1
        tgt_in = torch.tensor([[1, *y] + [0] * (n - 1 - len(y)) for y in ys])
        return tgt_in, torch.tensor([[*y, 2] + [0] * (n - 1 - len(y)) for y in ys])

    report = tour.check_shift_target(padded)
    assert report.bug == "wrong_shift" and "tensor(" not in report.message, str(report)
    assert "for y = [10]" in report.message and "[1, 10, 0, 0]" in report.message
    assert "padded" in report.message


@pytest.mark.parametrize("d_model, h", [(16, 4), (64, 8)])
def test_when_d_model_is_h_squared_both_slips_are_named(d_model, h):
    for bug in ("divides_by_d_k", "scale_by_d_model"):
        report = tour.check_multi_head_attention(LearnerMHA(d_model, h, bug=bug))
        assert report.bug == "divides_by_d_k_or_sqrt_d_model", str(report)
        assert "sqrt(d_model)" in report.message and "divided by d_k" in report.message


def test_a_zero_scale_is_named_not_left_unchecked():
    """scores * (1 // math.sqrt(d_k)) multiplies by 0.0: every weight alike, which no
    scale but 0 explains. It was "not checked"."""
    for module in (PerHeadLinears(scale=1 // math.sqrt(8)), EinsumParams(scale=0.0)):
        report = tour.check_multi_head_attention(module)
        assert report.bug == "wrong_scale", str(report)
        assert "multiplied by 0" in str(report) and "1 // math.sqrt(d_k)" in str(report)


class SmoothFFN(nn.Module):
    """The FFN with another activation between the two maps."""

    def __init__(self, activation, d_model=16, d_ff=64):
        super().__init__()
        self.w1, self.w2, self.act = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), activation

    def forward(self, x):
        return self.w2(self.act(self.w1(x)))


@pytest.mark.parametrize(
    ("activation", "name"),
    [(nn.GELU(), "gelu"), (F.silu, "silu"), (lambda h: h * torch.sigmoid(1.702 * h), "sigmoid")],
    ids=["gelu", "silu", "sigmoid_gelu"],
)
def test_an_ffn_without_relu_is_named(activation, name):
    """A GELU FFN passed "a ReLU between the two maps": it is not affine, which was all
    that check asked."""
    report = tour.check_feed_forward(SmoothFFN(activation), 16)
    assert report.bug == "not_relu" and name in str(report), str(report)
    assert tour.check_feed_forward(SmoothFFN(nn.ReLU()), 16).complete
    assert tour.check_feed_forward(SmoothFFN(lambda h: h.clamp(min=0)), 16).complete


def test_multi_head_attention_names_nan_on_fully_masked_rows():
    """Only check_attention asked what a query whose keys are all masked gets."""
    report = tour.check_multi_head_attention(PerHeadLinears(nan_safe=False))
    assert report.bug == "nan_on_fully_masked_rows", str(report)
    assert "nan_to_num(0.0)" in str(report)
    assert tour.check_multi_head_attention(PerHeadLinears()).complete
    torch_own = tour.check_multi_head_attention(TorchMHA(12, 3))  # NaN by torch's design
    assert torch_own.ok and [n for n, _ in torch_own.unchecked] == [FULLY_MASKED]


def test_a_checker_gives_back_each_submodules_own_mode():
    """A checker runs the learner's module in eval mode, then put it back with
    ``train(was_training)``, which sets every submodule alike: a part held in eval mode on
    purpose (a frozen projection) came back in training mode, and one in training mode
    inside a module in eval mode came back in eval mode."""
    module = PerHeadLinears()
    module.q.eval()
    assert tour.check_multi_head_attention(module).complete
    assert module.training and not module.q.training and module.k.training
    module.eval()
    module.o.train()
    assert tour.check_multi_head_attention(module).complete
    assert not module.training and module.o.training and not module.v.training


class InvertedMaskLayer(nn.Module):
    """A post-LN encoder layer on torch's nn.MultiheadAttention, handed aiayn's mask (True:
    may attend) as key_padding_mask (True: masked): every key is masked, every output NaN."""

    def __init__(self, d_model=12):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, 3, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d_model, 24), nn.ReLU(), nn.Linear(24, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, src_mask):
        x = self.norm1(x + self.attn(x, x, x, key_padding_mask=src_mask[:, 0, 0])[0])
        return self.norm2(x + self.ffn(x))


def test_a_mask_read_the_other_way_round_is_named_not_blamed_on_dropout():
    """An all-NaN output passed "returns [B, T, d_model]", then failed "eval mode is
    deterministic" (NaN is never equal to NaN) as dropout left on."""
    report = tour.check_encoder_layer(InvertedMaskLayer(), 12)
    assert report.bug == "nan_output" and report.failed == "returns [B, T, d_model]"
    assert "~mask" in report.message and "dropout" not in report.message, str(report)

    class Fixed(InvertedMaskLayer):
        def forward(self, x, src_mask):
            return super().forward(x, ~src_mask)

    assert tour.check_encoder_layer(Fixed(), 12).ok


class DictDecoder(nn.Module):
    def forward(self, x, memory, self_mask, cross_mask):
        return {"x": x}


class AnnotatedOrder(DecoderLayer):
    """The Annotated Transformer's forward(x, memory, src_mask, tgt_mask)."""

    def forward(self, x, memory, src_mask, tgt_mask, need_weights=False):
        return super().forward(x, memory, tgt_mask, src_mask, need_weights=need_weights)


class ThrownTransposeMasked(nn.Module):
    """A head split whose transpose result is thrown away: [B, T, h, d_k] stays, and
    self-attention without a mask runs (positions pair up as if they were heads), and
    shuffles alike; the causal mask [1, 1, T, T] then does not fit the scores [B, T, h, h]."""

    def __init__(self, d_model=32, h=4):
        super().__init__()
        self.d_model, self.h = d_model, h
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def split(self, t):
        t = t.view(t.size(0), t.size(1), self.h, -1)
        t.transpose(1, 2)  # the bug: the result is thrown away
        return t

    def forward(self, x, memory=None, mask=None):
        m = x if memory is None else memory
        q, k, v = self.split(self.wq(x)), self.split(self.wk(m)), self.split(self.wv(m))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return self.wo((s.softmax(-1).nan_to_num(0.0) @ v).reshape(x.shape))


def test_shape_hints_fit_the_checker():
    """Every error of two shapes that do not fit got the k.T hint of attention scores,
    whatever was checked: a positional table, a head split whose transpose was thrown
    away, a decoder layer taking its masks in the Annotated Transformer's order."""
    report = tour.check_positional_encoding(lambda n, d: torch.zeros(n, d) + torch.zeros(n, d + 1))
    assert report.bug == "raises" and "k.T" not in report.message, str(report)
    report = tour.check_multi_head_attention(ThrownTransposeMasked())
    assert report.bug == "raises" and "thrown away" in report.message, str(report)
    assert "batch first" in report.message
    report = tour.check_decoder_layer(AnnotatedOrder(CFG), 12)
    assert report.bug == "raises" and "swaps the two masks" in report.message, str(report)
    report = tour.check_decoder_layer(DictDecoder(), 12)
    assert report.bug == "wrong_return" and "returned a dict" in report.message, str(report)


class NotesLayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm: a gain and a bias of its own, std + eps."""

    def __init__(self, d):
        super().__init__()
        self.a_2, self.b_2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return (
            self.a_2 * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6) + self.b_2
        )


class OwnNormLayer(nn.Module):
    """An encoder layer (aiayn's attention and FFN) around norms of ``norm(d)``: post-LN,
    pre-LN, or with the residual left out (``missing``)."""

    def __init__(self, norm, style="post", d_model=12):
        super().__init__()
        from aiayn.model.attention import MultiHeadAttention
        from aiayn.model.layers import FeedForward

        self.attn, self.ffn = MultiHeadAttention(d_model, 3), FeedForward(d_model, 24)
        self.n1, self.n2, self.style = norm(d_model), norm(d_model), style

    def forward(self, x, src_mask):
        attend = lambda y: self.attn(y, mask=src_mask)[0]  # noqa: E731
        if self.style == "pre":
            x = x + attend(self.n1(x))
            return x + self.ffn(self.n2(x))
        if self.style == "missing":
            x = self.n1(attend(x))
            return self.n2(self.ffn(x))
        x = self.n1(x + attend(x))
        return self.n2(x + self.ffn(x))


@pytest.mark.parametrize("norm", [NotesLayerNorm, nn.RMSNorm], ids=["notes_layernorm", "rmsnorm"])
def test_trained_norms_of_its_own_do_not_read_as_a_missing_residual(norm):
    """The residual check reset only nn.LayerNorm's gain and bias: a post-LN layer with the
    notes' LayerNorm, trained (gain not 1), or with an RMSNorm, was told "some sub-layer's
    output is not added to its input"."""
    for style in ("post", "pre", "missing"):
        layer = OwnNormLayer(norm, style)
        with torch.no_grad():
            for n in (layer.n1, layer.n2):
                gain, *bias = n.parameters()
                gain.uniform_(0.5, 1.5)
                for b in bias:
                    b.normal_(0.0, 0.1)
        report = tour.check_encoder_layer(layer, 12)
        if style == "missing":
            assert report.bug == "missing_residual", str(report)
        else:
            assert report.complete, str(report)


def test_smaller_diagnoses_name_their_cause():
    """Found by a learner's walk of the tour: a rate one step behind was a bare wrong_rate;
    a float16 table was told its sine and cosine take different frequencies (both 0.9997);
    a [B, 1, S, 1] padding mask never reached the wrong_axis diagnosis written for it;
    a shift_target that edits its input was judged on the edited input; an additive mask
    was told to use the nan_to_num it already used."""
    from aiayn.train.schedule import noam_rate

    behind = tour.check_noam_rate(lambda s, d, w: noam_rate(max(s - 1, 1), d, w))
    assert behind.bug == "step_behind_by_one" and "LambdaLR" in behind.message, str(behind)

    table = tour.check_positional_encoding(lambda n, d: sinusoidal_table(n, d).half())
    assert table.bug == "low_precision_table" and "float32" in table.message, str(table)
    assert tour.check_positional_encoding(lambda n, d: sinusoidal_table(n, d).double()).ok

    queries = tour.check_padding_mask(lambda ids, pad_id: (ids != pad_id)[:, None, :, None])
    assert queries.bug == "wrong_axis" and "[B, 1, 1, S]" in queries.message, str(queries)

    def shift_in_place(ys):
        for y in ys:
            y.insert(0, 1)  # BOS in front, in the caller's own lists
        return ys, [[*y[1:], 2] for y in ys]

    assert tour.check_shift_target(shift_in_place).ok

    def additive(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s + torch.zeros_like(s).masked_fill(~mask, float("-inf"))
        return s.softmax(-1).nan_to_num(0.0) @ v

    report = tour.check_attention(additive)
    assert report.bug == "nan_on_fully_masked_rows" and "masked_fill" in report.message


def test_a_module_without_d_model_gets_a_report_not_a_traceback():
    report = tour.check_multi_head_attention(TorchMHA(12, 3).mha)  # no d_model attribute
    assert report.bug == "no_d_model" and "d_model=" in report.message, str(report)
    assert tour.check_multi_head_attention(TorchMHA(12, 3).mha, d_model=12).bug != "no_d_model"


class LayerScale(nn.Module):
    """CaiT's per-feature scale of a sub-layer's output: one vector, no norm."""

    def __init__(self, d):
        super().__init__()
        self.g = nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x):
        return x * self.g


def test_a_layerscale_is_no_norm_and_its_missing_residual_is_still_named():
    """The hunt for hand-written norms took a LayerScale (a vector, no matrix) for a norm it
    could not reset, and reported the residual of a layer without one as not checked."""

    class Scaled(OwnNormLayer):
        def __init__(self, style):
            super().__init__(nn.LayerNorm, style)
            self.s1, self.s2 = LayerScale(12), LayerScale(12)

        def forward(self, x, src_mask):
            a = self.s1(self.attn(x, mask=src_mask)[0])
            if self.style == "missing":
                x = self.n1(a)
                return self.n2(self.s2(self.ffn(x)))
            x = self.n1(x + a)
            return self.n2(x + self.s2(self.ffn(x)))

    assert tour.check_encoder_layer(Scaled("missing"), 12).bug == "missing_residual"
    assert tour.check_encoder_layer(Scaled("post"), 12).complete


class QueryFromMemory(nn.Module):
    """Page 10's exercise 3: Q projected from memory, K and V from x, the heads merged by
    ``reshape(x.shape)`` (which then raises: the output has memory's rows) or by
    ``reshape(B, -1, d)`` (one output row per memory position)."""

    def __init__(self, merge: str, d_model=32, h=4):
        super().__init__()
        self.merge, self.h, self.d_model = merge, h, d_model
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def split(self, t):
        return t.view(t.size(0), t.size(1), self.h, -1).transpose(1, 2)

    def forward(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q, k, v = self.split(self.w_q(source)), self.split(self.w_k(x)), self.split(self.w_v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = (scores.softmax(-1).nan_to_num(0.0) @ v).transpose(1, 2)
        return self.w_o(
            out.reshape(x.shape) if self.merge == "x" else out.reshape(x.size(0), -1, x.size(-1))
        )


@pytest.mark.parametrize("merge", ["x", "rows"])
def test_queries_from_memory_are_named_however_the_heads_are_merged(merge):
    """Merged into x's shape, the output of memory's rows raised in the reshape, and the
    checker said only "raises" (pointing to page 5), not the exercise's bug."""
    report = tour.check_multi_head_attention(QueryFromMemory(merge))
    assert report.bug == "query_from_memory", report
    assert "docs/tour/10-decoder.md" in str(report)
