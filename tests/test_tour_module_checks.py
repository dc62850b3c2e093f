"""aiayn.tour's checks of whole modules: the scale of the attention inside a multi-head
attention module or a layer (fitted against the module's own projections), every weight
in use, dropout off in eval mode, and modules made in forward or kept in a plain list.
Correct modules written in other styles pass."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import tour
from aiayn.config import TransformerConfig
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.layers import DecoderLayer, EncoderLayer, FeedForward
from aiayn.tour.scale import measure_scales
from test_tour_checks import SCALES, LearnerMHA


def _heads(t, h):
    return t.unflatten(-1, (h, -1)).transpose(1, 2)


class EinsumMHA(nn.Module):
    """Correct: einsum scores, the scale folded into q first, nn.Softmax made in forward."""

    def __init__(self, d_model, h):
        super().__init__()
        self.d_model, self.h = d_model, h
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q = _heads(self.w_q(x), self.h) / math.sqrt(self.d_model // self.h)
        k, v = _heads(self.w_k(source), self.h), _heads(self.w_v(source), self.h)
        s = torch.einsum("bhtd,bhsd->bhts", q, k)
        if mask is not None:
            s = s.masked_fill(~mask, -1e9)
        w = nn.Softmax(dim=-1)(s)  # no weights, no train/eval behaviour: harmless
        return self.w_o(torch.einsum("bhts,bhsd->bthd", w, v).flatten(2))


class LoopMHA(EinsumMHA):
    """Correct: one head at a time, weights as raw parameters used as x @ W."""

    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        self.w_q = nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model))

    def forward(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q, k, v, d_k = x @ self.w_q, self.w_k(source), self.w_v(source), self.d_model // self.h
        heads = []
        for i in range(self.h):
            part = slice(i * d_k, (i + 1) * d_k)
            s = q[..., part] @ k[..., part].transpose(-2, -1) / math.sqrt(d_k)
            if mask is not None:
                s = s.masked_fill(~mask[:, 0], float("-inf"))
            heads.append(torch.softmax(s, -1).nan_to_num(0.0) @ v[..., part])
        return self.w_o(torch.cat(heads, -1))


class FusedSDPA(nn.Module):
    """Correct: one nn.Linear(d, 3d) and F.scaled_dot_product_attention."""

    def __init__(self, d_model, h):
        super().__init__()
        self.d_model, self.h = d_model, h
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, memory=None, mask=None):
        d = self.d_model
        if memory is None:
            q, k, v = self.qkv(x).chunk(3, -1)
        else:
            q, (k, v) = self.qkv(x)[..., :d], self.qkv(memory)[..., d:].chunk(2, -1)
        q, k, v = (_heads(t, self.h) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(o.transpose(1, 2).flatten(2))


class TorchMHA(nn.Module):
    """Correct: nn.MultiheadAttention, aiayn's masks turned into torch's."""

    def __init__(self, d_model, h):
        super().__init__()
        self.d_model, self.mha = d_model, nn.MultiheadAttention(d_model, h, batch_first=True)

    def forward(self, x, memory=None, mask=None):
        kv = x if memory is None else memory
        attn_mask = padding = None
        if mask is not None and mask.size(-2) == 1:
            padding = ~mask[:, 0, 0]
        elif mask is not None:
            attn_mask = ~mask[0, 0]
        return self.mha(x, kv, kv, attn_mask=attn_mask, key_padding_mask=padding)


@pytest.mark.parametrize(
    "module",
    [
        MultiHeadAttention(12, 3),
        LearnerMHA(12, 3),
        LearnerMHA(12, 3, fused=True),
        EinsumMHA(12, 3),
        LoopMHA(12, 3),
        FusedSDPA(12, 3),
        TorchMHA(12, 3),
        MultiHeadAttention(24, 4),
    ],
    ids=["library", "learner", "fused", "einsum", "loop", "sdpa", "torch", "library_24_4"],
)
def test_check_multi_head_attention_passes_correct_styles(module):
    report = tour.check_multi_head_attention(module)
    assert report.ok, str(report)
    assert "each head scales its scores by 1/sqrt(d_k)" in report.passed


def test_the_scale_is_fitted_in_every_style():
    """Each style's two attentions (self, cross) are found and fitted, none skipped:
    s = 1/sqrt(d_k) = 0.5. Only torch's nn.MultiheadAttention is out of sight."""
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(2, 5, 12, generator=g), torch.randn(2, 7, 12, generator=g)
    for module in (MultiHeadAttention(12, 3), EinsumMHA(12, 3), LoopMHA(12, 3), FusedSDPA(12, 3)):
        with torch.no_grad():
            measured = measure_scales(lambda m=module: (m(x), m(x, memory)), 2, 12)
        assert [(m.heads, m.t_q, m.t_k) for m in measured] == [(3, 5, 5), (3, 5, 7)], module
        assert all(abs(m.s - 0.5) < 1e-6 for m in measured)
    with torch.no_grad():
        assert measure_scales(lambda: TorchMHA(12, 3)(x, memory), 2, 12) == []


@pytest.mark.parametrize("bug", sorted(SCALES))
def test_check_multi_head_attention_measures_the_scale(bug):
    """The module's output depends on its scale only through s * W^Q W^K^T, so the checker
    fits s against the module's own projections: a wrong scale passed every check."""
    for module in (LearnerMHA(12, 3, bug=bug), LearnerMHA(24, 4, bug=bug)):
        report = tour.check_multi_head_attention(module)
        assert report.bug == bug, str(report)
        d_k = module.d_model // module.h
        assert f"{1 / math.sqrt(d_k):.4f}" in report.message


def test_check_multi_head_attention_wants_every_weight_used():
    report = tour.check_multi_head_attention(LearnerMHA(12, 3, bug="no_w_o"))
    assert report.bug == "unused_parameters", str(report)
    assert "w_o.weight" in report.message


class ThrownAwaySplit(EinsumMHA):
    """The head split's results thrown away (its view and transpose on a line of their
    own), scaled by 1/sqrt(q.size(-1)): one head over all of d_model, with the right scale
    for one head. It passed every check."""

    def forward(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q, k, v = self.w_q(x), self.w_k(source), self.w_v(source)
        for t in (q, k, v):
            t.view(x.size(0), -1, self.h, self.d_model // self.h).transpose(1, 2)  # the bug
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask[:, 0], float("-inf"))
        return self.w_o(torch.softmax(s, -1).nan_to_num(0.0) @ v)


class SoftmaxOverHeads(EinsumMHA):
    """softmax(scores, dim=1) on [B, h, T, S], the heads' axis: it passed every check."""

    dim = 1  # the bug

    def concat_heads(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q = _heads(self.w_q(x), self.h) / math.sqrt(self.d_model // self.h)
        k, v = _heads(self.w_k(source), self.h), _heads(self.w_v(source), self.h)
        s = q @ k.transpose(-2, -1)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=self.dim).nan_to_num(0.0)
        return (w @ v).transpose(1, 2).flatten(2)

    def forward(self, x, memory=None, mask=None):
        return self.w_o(self.concat_heads(x, memory, mask))


class NoOutputProjection(SoftmaxOverHeads):
    """No W^O at all (the concatenated heads are the output): it passed every check."""

    dim = -1

    def __init__(self, d_model, h):
        super().__init__(d_model, h)
        del self.w_o

    def forward(self, x, memory=None, mask=None):
        return self.concat_heads(x, memory, mask)  # the bug


class RepeatedMask(EinsumMHA):
    """[B * h, T, d_k] rows (d2l's, fairseq's) with the mask copied by mask.repeat(h, 1,
    1): rows are sentence-major, so one sentence's mask reaches the other's heads. It
    passed: the padding check masked the same keys in every sentence."""

    def forward(self, x, memory=None, mask=None):
        kv = x if memory is None else memory
        (B, T, _), S = x.shape, kv.size(1)

        def rows(t):
            return _heads(t, self.h).flatten(0, 1)  # [B * h, len, d_k]

        q, k, v = rows(self.w_q(x)), rows(self.w_k(kv)), rows(self.w_v(kv))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            m = mask.expand(B, 1, T, S).reshape(B, T, S).repeat(self.h, 1, 1)  # the bug
            s = s.masked_fill(~m, float("-inf"))
        o = (torch.softmax(s, -1).nan_to_num(0.0) @ v).unflatten(0, (B, self.h))
        return self.w_o(o.transpose(1, 2).flatten(2))


def test_check_multi_head_attention_counts_heads_projections_and_the_softmax_axis():
    cases = {
        "wrong_head_count": ThrownAwaySplit(12, 3),
        "softmax_wrong_axis": SoftmaxOverHeads(12, 3),
        "missing_projection": NoOutputProjection(12, 3),
        "source_padding_leaks": RepeatedMask(12, 3),
    }
    for bug, module in cases.items():
        report = tour.check_multi_head_attention(module)
        assert report.bug == bug, str(report)
    report = tour.check_multi_head_attention(ThrownAwaySplit(12, 3))
    assert "3 heads" in report.message and "thrown away" in report.message


class ListHeld(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.d_model, self.h = d_model, h
        self.proj = [nn.Linear(d_model, d_model) for _ in range(4)]  # the bug: ModuleList

    def forward(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q, k = _heads(self.proj[0](x), self.h), _heads(self.proj[1](source), self.h)
        o = F.scaled_dot_product_attention(q, k, _heads(self.proj[2](source), self.h), mask)
        return self.proj[3](o.transpose(1, 2).flatten(2))


class DropoutInForward(EinsumMHA):
    def forward(self, x, memory=None, mask=None):
        return nn.Dropout(0.1)(super().forward(x, memory, mask))  # the bug


class ViewMerge(EinsumMHA):
    def forward(self, x, memory=None, mask=None):
        source = x if memory is None else memory
        q, k = _heads(self.w_q(x), self.h), _heads(self.w_k(source), self.h)
        o = torch.softmax(q @ k.transpose(-2, -1) / 2, -1) @ _heads(self.w_v(source), self.h)
        return self.w_o(o.transpose(1, 2).view(x.shape))  # the bug: view, not reshape


def test_a_view_on_a_non_contiguous_tensor_is_explained():
    report = tour.check_multi_head_attention(ViewMerge(12, 3))
    assert report.bug == "raises" and ".contiguous().view" in report.message, str(report)


def test_modules_made_in_forward_or_held_in_a_list():
    listed = tour.check_multi_head_attention(ListHeld(12, 3))
    assert listed.bug == "modules_in_plain_list", str(listed)
    assert "self.proj" in listed.message and "nn.ModuleList" in listed.message
    dropped = tour.check_multi_head_attention(DropoutInForward(12, 3))
    assert dropped.bug == "module_built_in_forward", str(dropped)
    assert "training mode" in dropped.message and "optimizer" not in dropped.message


class FFN(nn.Module):
    def __init__(self, d_model, d_ff, style):
        super().__init__()
        self.w1, self.w2, self.style = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), style

    def forward(self, x):
        h = self.w1(x)
        if self.style == "relu_module":  # correct: an nn.ReLU() has nothing to train
            return self.w2(nn.ReLU()(h))
        if self.style == "dropout_module":
            return self.w2(nn.Dropout(0.1)(F.relu(h)))
        if self.style == "fresh_linear":
            return nn.Linear(h.size(-1), x.size(-1))(F.relu(h))
        return self.w2(F.dropout(F.relu(h), 0.1))  # always on: training=True by default


def test_check_feed_forward_module_checks():
    assert tour.check_feed_forward(FFN(8, 16, "relu_module"), 8)
    assert tour.check_feed_forward(FeedForward(8, 16), 8)
    dropout = tour.check_feed_forward(FFN(8, 16, "always_dropout"), 8)
    assert dropout.bug == "dropout_in_eval", str(dropout)  # it was named not_position_wise
    made = tour.check_feed_forward(FFN(8, 16, "dropout_module"), 8)
    assert made.bug == "module_built_in_forward" and "training mode" in made.message
    fresh = tour.check_feed_forward(FFN(8, 16, "fresh_linear"), 8)
    assert fresh.bug == "module_built_in_forward" and "optimizer" in fresh.message


CFG = TransformerConfig(
    src_vocab_size=10, tgt_vocab_size=10, d_model=12, n_heads=3, n_layers=1, d_ff=24, dropout=0.1
)


class ScaledMHA(MultiHeadAttention):
    """The library's attention with its scores scaled by ``scale``."""

    def __init__(self, d_model, n_heads, scale):
        super().__init__(d_model, n_heads)
        self.scale = scale

    def forward(self, x, memory=None, mask=None, cache=None, need_weights=False):
        if memory is None:
            q, k, v = map(self._split_heads, self.in_proj(x).chunk(3, -1))
        else:
            q, (k, v) = self._split_heads(self._cross_projections()[0](x)), self.memory_kv(memory)
        s = q @ k.transpose(-2, -1) * self.scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, -1).nan_to_num(0.0)
        return self.out_proj((w @ v).transpose(1, 2).flatten(2)), w


def test_layer_checkers_measure_the_scale():
    pre_ln = TransformerConfig(**{**CFG.to_dict(), "norm_first": True})
    for cfg in (CFG, pre_ln):
        report = tour.check_encoder_layer(EncoderLayer(cfg), 12)
        assert report.ok and "each head scales its scores by 1/sqrt(d_k)" in report.passed
        encoder = EncoderLayer(cfg)
        encoder.self_attn = ScaledMHA(12, 3, 1 / math.sqrt(12))
        report = tour.check_encoder_layer(encoder, 12)
        assert report.bug == "scale_by_d_model", str(report)
        decoder = DecoderLayer(cfg)
        decoder.cross_attn = ScaledMHA(12, 3, 1.0)
        report = tour.check_decoder_layer(decoder, 12)
        assert report.bug == "missing_scale", str(report)
        assert "encoder-decoder attention" in report.message
