"""aiayn.tour's checkers: each passes the library's own implementation (and a learner's
correct one written differently) and names the bug of each classic wrong one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import tour
from aiayn.config import TransformerConfig
from aiayn.data.batching import pad, shift_target
from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.model.embedding import sinusoidal_table
from aiayn.model.layers import DecoderLayer, EncoderLayer, FeedForward
from aiayn.model.masks import causal_mask, padding_mask
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.train.schedule import noam_rate

# -- scaled dot-product attention ------------------------------------------------------


def learner_attention(q, k, v, mask=None):
    """A correct one written the way the notes write it."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0) @ v


def attention_with(scale=None, after=False, dim=-1, inverted=False, fill=None, nan_safe=True):
    def fn(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        factor = scale(q, k) if scale else math.sqrt(q.size(-1))
        if not after:
            s = s / factor
        if mask is not None:
            allowed = mask if not inverted else ~mask
            s = s + fill * (~allowed) if fill is not None else s.masked_fill(~allowed, -math.inf)
        w = torch.softmax(s, dim)
        if after:
            w = w / factor
        return (w.nan_to_num(0.0) if nan_safe else w) @ v

    return fn


def mask_after_softmax(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1)
    return (w if mask is None else w * mask) @ v


def keyword_only_mask(q, k, v, *, mask=None):
    return learner_attention(q, k, v, mask)


def kl_div_loss(logits, target, eps, pad_id):
    """Label smoothing as a KL divergence: the cross-entropy less a constant."""
    V, keep = logits.size(-1), target != pad_id
    q = torch.full_like(logits, eps / V).scatter(1, target[:, None], 1 - eps + eps / V)
    return F.kl_div(logits.log_softmax(-1)[keep], q[keep], reduction="sum")


@pytest.mark.parametrize(
    "fn",
    [
        learner_attention,
        lambda q, k, v, mask=None: scaled_dot_product_attention(q, k, v, mask),
        keyword_only_mask,
        lambda q, k, v, mask=None: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    ],
    ids=["learner", "library", "keyword_only_mask", "torch_sdpa"],
)
def test_check_attention_passes_correct_implementations(fn):
    report = tour.check_attention(fn)
    assert report.ok, str(report)
    assert len(report.passed) == 6 and report.bug is None
    assert "all 6 checks passed" in str(report)


def test_check_attention_passes_the_library_with_weights():
    fn = lambda q, k, v, mask=None: scaled_dot_product_attention(q, k, v, mask, need_weights=True)  # noqa: E731
    assert tour.check_attention(fn)


@pytest.mark.parametrize(
    ("fn", "bug"),
    [
        (attention_with(after=True), "scale_after_softmax"),
        (attention_with(scale=lambda q, k: 1.0), "missing_scale"),
        (attention_with(scale=lambda q, k: q.size(-1)), "divides_by_d_k"),
        (attention_with(scale=lambda q, k: math.sqrt(k.size(-2))), "scale_from_wrong_axis"),
        (attention_with(scale=lambda q, k: 3.0), "wrong_scale"),
        (attention_with(dim=-2), "softmax_over_queries"),
        (attention_with(inverted=True), "inverted_mask"),
        (attention_with(fill=-1.0), "masked_keys_get_weight"),
        (lambda q, k, v, mask=None: attention_with()(q, k, v), "mask_ignored"),
        (attention_with(nan_safe=False), "nan_on_fully_masked_rows"),
        (lambda q, k, v, mask=None: torch.softmax(q @ k.transpose(-2, -1), -1), "wrong_shape"),
        (lambda q, k, v, mask=None: q @ k.transpose(-2, -1) @ v / 4.0, "not_a_weighted_sum"),
        (
            attention_with(scale=lambda q, k: math.sqrt(q.size(-1) * q.size(0) / 2)),
            "depends_on_the_batch",
        ),
        (attention_with(scale=lambda q, k: math.sqrt(k.size(1))), "scale_from_wrong_axis"),
        (lambda q, k, v: attention_with()(q, k, v), "raises"),  # takes no mask
        (lambda q, k, v, mask=None: torch.softmax(q @ k.T / 4, -1) @ v, "raises"),
        (attention_with(scale=lambda q, k: math.sqrt(q.size(1) * q.size(-1))), "scale_by_d_model"),
        (attention_with(scale=lambda q, k: math.sqrt(512)), "scale_by_d_model"),
        (mask_after_softmax, "mask_after_softmax"),
        (  # the notes' mask.unsqueeze(1), kept: a 5-D output (was masked_keys_get_weight)
            lambda q, k, v, mask=None: attention_with()(
                q, k, v, None if mask is None else mask.unsqueeze(1)
            ),
            "wrong_shape",
        ),
        (
            lambda q, k, v, mask=None: F.dropout(learner_attention(q, k, v, mask), 0.1),
            "random_output",
        ),
    ],
)
@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_check_attention_names_each_bug(fn, bug):
    report = tour.check_attention(fn)
    assert not report.ok
    assert report.bug == bug, str(report)
    assert bug.replace("_", " ") in str(report) and report.message


def test_every_failure_names_a_page():
    """A learner's function that raises (or returns the wrong shape) still points to a page."""
    report = tour.check_attention(lambda q, k, v, mask=None: 1 / 0)
    assert report.bug == "raises" and report.page == "03-scaled-dot-product.md"
    assert "see docs/tour/03-scaled-dot-product.md" in str(report)
    assert tour.check_split_heads(lambda x, h: x).page == "05-multi-head.md"
    assert tour.check_causal_mask(lambda n: [[1]]).page == "04-masks.md"


def test_check_attention_measures_rather_than_compares():
    """A scale of 1/sqrt(2 d_k) is not one of the named slips: the message gives the fitted
    temperature, so it was measured."""
    report = tour.check_attention(attention_with(scale=lambda q, k: math.sqrt(2 * q.size(-1))))
    assert report.bug == "wrong_scale"
    assert f"s = {1 / math.sqrt(32):.4f}" in report.message


def test_report_after_a_failure_lists_the_checks_that_passed():
    report = tour.check_attention(attention_with(nan_safe=False))
    assert report.failed.startswith("a query with no allowed key")
    assert len(report.passed) == 4
    assert "see docs/tour/04-masks.md" in str(report)


# -- masks and padding -------------------------------------------------------------------


def test_mask_checkers():
    assert tour.check_causal_mask(lambda n: causal_mask(n))
    assert tour.check_causal_mask(lambda n: torch.ones(n, n).tril().bool())
    bugs = {
        "notes_convention": lambda n: torch.ones(n, n, dtype=torch.bool).triu(1),
        "diagonal_masked": lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1),
        "sees_the_future": lambda n: torch.ones(n, n, dtype=torch.bool).triu(),
        "sees_one_future_token": lambda n: torch.ones(n, n, dtype=torch.bool).tril(1),
        "not_boolean": lambda n: torch.full((n, n), float("-inf")).triu(1),
    }
    for bug, fn in bugs.items():
        assert tour.check_causal_mask(fn).bug == bug
    assert tour.check_padding_mask(padding_mask)
    assert tour.check_padding_mask(lambda ids, p: (ids == p)[:, None, None]).bug == "inverted_mask"
    assert tour.check_padding_mask(lambda ids, p: (ids != p)[:, None, :, None]).bug == "wrong_axis"
    assert tour.check_padding_mask(lambda ids, p: (ids != 5)[:, None, None]).bug == "ignores_pad_id"


def test_check_pad():
    assert tour.check_pad(pad)
    assert tour.check_pad(lambda rows: pad(rows, pad_id=3)).bug == "unk_for_padding"
    assert tour.check_pad(lambda rows: pad(rows, pad_id=7)).bug == "wrong_pad_id"
    left = lambda rows: pad([r[::-1] for r in rows]).flip(1)  # noqa: E731
    assert tour.check_pad(left).bug == "left_padded"


# -- heads -------------------------------------------------------------------------------


def test_check_split_heads():
    def split(x, h):
        B, T, d = x.shape
        return x.view(B, T, h, d // h).transpose(1, 2)

    def merge(x):
        B, h, T, d_k = x.shape
        return x.transpose(1, 2).reshape(B, T, h * d_k)

    assert tour.check_split_heads(split, merge)
    bare = lambda x, h: x.reshape(x.size(0), h, x.size(1), x.size(2) // h)  # noqa: E731
    assert tour.check_split_heads(bare).bug == "reshape_without_transpose"
    strided = lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2)  # noqa: E731
    assert tour.check_split_heads(strided).bug == "strided_features"
    flat = lambda x: x.reshape(x.size(0), x.size(2), -1)  # noqa: E731
    assert tour.check_split_heads(split, flat).bug == "merge_without_transpose"

    def thrown_away(x, h):
        B, T, d = x.shape
        x.view(B, T, h, d // h)  # the bug: the view's result is not kept
        return x.transpose(1, 2)

    assert tour.check_split_heads(thrown_away).bug == "result_thrown_away"

    def both_thrown_away(x, h):  # x as it came: it was only named a wrong shape
        B, T, d = x.shape
        x.view(B, T, h, d // h)
        x.transpose(1, 2)
        return x

    assert tour.check_split_heads(both_thrown_away).bug == "result_thrown_away"
    assert tour.check_split_heads(lambda x, h: x.unflatten(-1, (h, -1)).permute(0, 2, 1, 3))

    no_transpose = lambda x, h: x.view(x.size(0), x.size(1), h, -1)  # noqa: E731
    report = tour.check_split_heads(no_transpose)
    assert report.bug == "split_without_transpose" and "transpose(1, 2)" in report.message


def test_check_split_heads_gives_merge_a_contiguous_tensor():
    """split's transposed view transposes back to contiguous memory, so a merge that calls
    .view() on it passed; on what attention returns, a fresh [B, h, T, d_k], it raises."""

    def split(x, h):
        return x.view(x.size(0), x.size(1), h, -1).transpose(1, 2)

    def merge_view(x):
        B, h, T, d_k = x.shape
        return x.transpose(1, 2).view(B, T, h * d_k)

    report = tour.check_split_heads(split, merge_view)
    assert report.bug == "view_on_non_contiguous", str(report)
    assert ".reshape" in report.message and ".contiguous().view" in report.message

    def merge_contiguous(x):
        B, h, T, d_k = x.shape
        return x.transpose(1, 2).contiguous().view(B, T, h * d_k)

    assert tour.check_split_heads(split, merge_contiguous)
    assert tour.check_split_heads(split, lambda x: x.permute(0, 2, 1, 3).flatten(2))


class LearnerMHA(nn.Module):
    """Separate W^Q, W^K, W^V, W^O (or one fused W^QKV); the bugs are switches."""

    def __init__(
        self, d_model, n_heads, bare_reshape=False, kv_from_query=False, bug=None, fused=False
    ):
        super().__init__()
        self.d_model, self.h, self.bug, self.fused = d_model, n_heads, bug, fused
        self.w_o = nn.Linear(d_model, d_model)
        if fused:  # only the weights it uses: one without a gradient is a bug
            self.qkv = nn.Linear(d_model, 3 * d_model)
        else:
            self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.bare_reshape, self.kv_from_query = bare_reshape, kv_from_query

    def split(self, x):
        B, T, _ = x.shape
        if self.bare_reshape:
            return x.reshape(B, self.h, T, -1)
        return x.view(B, T, self.h, -1).transpose(1, 2)

    def forward(self, x, memory=None, mask=None):
        source = x if memory is None or self.kv_from_query else memory
        if self.fused:  # one nn.Linear(d, 3d): W^Q on x, W^K and W^V on the source
            w_q, w_kv = self.qkv.weight.split([self.d_model, 2 * self.d_model])
            b_q, b_kv = self.qkv.bias.split([self.d_model, 2 * self.d_model])
            k, v = F.linear(source, w_kv, b_kv).chunk(2, -1)
            q, k, v = self.split(F.linear(x, w_q, b_q)), self.split(k), self.split(v)
            return self.w_o(learner_attention(q, k, v, mask).transpose(1, 2).flatten(2))
        q, k, v = (
            self.split(self.w_q(x)),
            self.split(self.w_k(source)),
            self.split(self.w_v(source)),
        )
        if self.bug == "cross_softmax_over_queries" and memory is not None:
            out = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -2) @ v
        elif self.bug == "dropout_always":
            out = F.dropout(learner_attention(q, k, v, mask), 0.1)
        elif self.bug in SCALES:
            out = attention_with(scale=SCALES[self.bug])(q, k, v, mask)
        else:
            out = learner_attention(q, k, v, mask)
        out = out.transpose(1, 2).reshape(x.shape)
        return out if self.bug == "no_w_o" else self.w_o(out)


SCALES = {  # each a slip of the scale, as check_attention names them
    "missing_scale": lambda q, k: 1.0,
    "divides_by_d_k": lambda q, k: q.size(-1),
    "scale_by_d_model": lambda q, k: math.sqrt(q.size(1) * q.size(-1)),
    "wrong_scale": lambda q, k: 3.0,
}


class LayerNormInForward(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.d_model, self.attn = d_model, LearnerMHA(d_model, n_heads)

    def forward(self, x, memory=None, mask=None):
        return nn.LayerNorm(self.d_model)(x + self.attn(x, memory, mask))


def test_check_multi_head_attention():
    assert tour.check_multi_head_attention(MultiHeadAttention(12, 3))
    assert tour.check_multi_head_attention(LearnerMHA(12, 3))
    assert tour.check_multi_head_attention(LearnerMHA(12, 3, fused=True))
    cases = {
        "queries_interact": LearnerMHA(12, 3, bug="cross_softmax_over_queries"),
        "dropout_in_eval": LearnerMHA(12, 3, bug="dropout_always"),
        "mixes_positions": LearnerMHA(12, 3, bare_reshape=True),
        "kv_from_query": LearnerMHA(12, 3, kv_from_query=True),
        "module_built_in_forward": LayerNormInForward(12, 3),
    }
    for bug, module in cases.items():
        report = tour.check_multi_head_attention(module)
        assert report.bug == bug, str(report)


# -- positional encoding, FFN, layers ----------------------------------------------------


def test_check_positional_encoding():
    assert tour.check_positional_encoding(sinusoidal_table)

    def table(max_len, d, exponent=lambda i, d: 2 * i / d, interleave=True, swap=False):
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        angle = pos / 10000 ** exponent(torch.arange(d // 2, dtype=torch.float64), d)
        sin, cos = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
        if not interleave:
            return torch.cat([sin, cos], dim=-1)
        return torch.stack([sin, cos], dim=-1).flatten(1)

    assert tour.check_positional_encoding(table)

    def bf16_positions(max_len, d):  # whole numbers exact to 256 only: it passed
        pos = torch.arange(max_len).to(torch.bfloat16).float()[:, None]
        angle = pos * torch.exp(torch.arange(0, d, 2) * -(math.log(10000.0) / d))
        return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)

    assert tour.check_positional_encoding(bf16_positions).bug == "wrong_far_positions"
    assert (
        tour.check_positional_encoding(lambda L, d: table(L, d, lambda i, d: i / d)).bug
        == "halved_exponent"
    )
    assert (
        tour.check_positional_encoding(lambda L, d: table(L, d, swap=True)).bug == "sin_cos_swapped"
    )
    assert (
        tour.check_positional_encoding(lambda L, d: table(L, d, interleave=False)).bug
        == "halves_not_interleaved"
    )
    odd = lambda L, d: table(L, d, lambda i, d: 2 * i / (d + 2))  # noqa: E731
    assert tour.check_positional_encoding(odd).bug == "wrong_frequencies"
    # [max_len, 1, d_model] (PyTorch's tutorial) and a NumPy table are tables too
    assert tour.check_positional_encoding(lambda L, d: sinusoidal_table(L, d)[:, None])
    assert tour.check_positional_encoding(lambda L, d: sinusoidal_table(L, d).numpy())
    from_1 = lambda L, d: table(L + 1, d)[1:]  # noqa: E731
    assert tour.check_positional_encoding(from_1).bug == "positions_start_at_1"
    doubled = lambda L, d: table(L, d, lambda i, d: 4 * i / d)  # noqa: E731
    assert tour.check_positional_encoding(doubled).bug == "doubled_exponent"


def blog_table(max_len, d_model):
    """The widely copied loop: the cosine of dimension i + 1 uses exponent 2(i+1)/d_model."""
    pe = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            pe[pos, i] = math.sin(pos / (10000 ** ((2 * i) / d_model)))
            pe[pos, i + 1] = math.cos(pos / (10000 ** ((2 * (i + 1)) / d_model)))
    return pe


def per_dimension_table(max_len, d_model):
    """Exponent j/d_model for every dimension j: the cosine of pair i uses (2i+1)/d_model."""
    angle = torch.arange(max_len)[:, None] / 10000 ** (torch.arange(d_model) / d_model)
    return torch.where(torch.arange(d_model) % 2 == 0, angle.sin(), angle.cos())


def test_check_positional_encoding_measures_sin_and_cos_apart():
    """A pair whose sine and cosine have different frequencies has no one angle: the
    checker said the longest wavelength was 198691772 positions."""
    for fn, cosine in ((blog_table, "0.5623"), (per_dimension_table, "0.7499")):
        report = tour.check_positional_encoding(fn)
        assert report.bug == "sin_cos_frequencies_differ", str(report)
        assert "pair 0" in report.message and f"the cosine's {cosine}" in report.message
        assert "wavelength" not in report.message


def test_check_feed_forward():
    assert tour.check_feed_forward(FeedForward(8, 16), 8)
    linear = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    assert tour.check_feed_forward(linear, 8).bug == "no_relu"
    relu_last = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU())
    assert tour.check_feed_forward(relu_last, 8).bug == "relu_after_second_layer"
    relu_first = nn.Sequential(nn.ReLU(), nn.Linear(8, 16), nn.Linear(16, 8))  # it passed
    assert tour.check_feed_forward(relu_first, 8).bug == "relu_on_input"


CFG = TransformerConfig(
    src_vocab_size=10, tgt_vocab_size=10, d_model=12, n_heads=3, n_layers=1, d_ff=24, dropout=0.1
)


class FreshNorm(EncoderLayer):
    def forward(self, x, src_mask, need_weights=False):
        y, w = self._sa_block(x, src_mask, need_weights)
        x = nn.LayerNorm(x.size(-1))(x + y)  # the bug: a new LayerNorm on every call
        return self.ffn_norm(x + self._ff_block(x)), w


class AlwaysDropout(EncoderLayer):
    def forward(self, x, src_mask, need_weights=False):
        x, w = super().forward(x, src_mask, need_weights)
        return F.dropout(x, 0.1), w  # the bug: training=True by default


class SelfTwice(DecoderLayer):
    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        x, self_w, _ = super().forward(x, memory, self_mask, cross_mask, cache, need_weights)
        return x, self_w, self_w  # the bug


class CrossFirst(DecoderLayer):
    """The two attentions in the wrong order (post-LN): the encoder-decoder attention
    first, then the masked self-attention. Every other check passes it."""

    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        y, cross_w = self._mha_block(x, memory, cross_mask, None, need_weights)
        x = self.cross_attn_norm(x + y)
        y, self_w = self._sa_block(x, self_mask, None, need_weights)  # the bug: after it
        x = self.self_attn_norm(x + y)
        return self.ffn_norm(x + self._ff_block(x)), self_w, cross_w


class DiagonalMasked(DecoderLayer):
    """Its own causal mask, tril(-1): position 0 sees no key (zero weights). It passed."""

    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        own = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril(-1)[None, None]
        return super().forward(x, memory, own, cross_mask, cache, need_weights)


class CrossQueriesFromX(DecoderLayer):
    """The encoder-decoder attention's queries taken from x, not the self-attention's
    output (post-LN; x1 typed as x). It passed."""

    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        y, self_w = self._sa_block(x, self_mask, None, need_weights)
        x1 = self.self_attn_norm(x + y)
        y, cross_w = self._mha_block(x, memory, cross_mask, None, need_weights)  # the bug
        x = self.cross_attn_norm(x1 + y)
        return self.ffn_norm(x + self._ff_block(x)), self_w, cross_w


class Float64Weights(DecoderLayer):
    """Correct, its weights in float64: the checker's own float32 ones raised on them."""

    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        x, self_w, cross_w = super().forward(x, memory, self_mask, cross_mask, cache, True)
        return x, self_w.double(), cross_w.double()


class NoCrossMask(DecoderLayer):
    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        return super().forward(x, memory, self_mask, None, cache, need_weights)


class HeadAveraged(DecoderLayer):
    """Weights averaged over the heads, [B, T, S], as torch's nn.MultiheadAttention gives."""

    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        x, self_w, cross_w = super().forward(x, memory, self_mask, cross_mask, cache, True)
        return x, self_w.mean(1), cross_w.mean(1)


class CrossOverTarget(DecoderLayer):
    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        return super().forward(x, x, self_mask, None, cache, need_weights)  # the bug: memory


class CrossOverTargetMasked(DecoderLayer):
    """The same bug in a layer that passes the source mask on, as a learner's does: its
    [.., T, T] scores cannot take the [.., 1, S] mask, so the layer raises. The checker
    named a k.T bug; it now tries the layer without the mask and names this one."""

    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        return super().forward(x, x, self_mask, cross_mask, cache, need_weights)


class SelfMaskInCross(DecoderLayer):
    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        return super().forward(x, memory, self_mask, self_mask, cache, need_weights)  # the bug


class DecoderNoResidual(DecoderLayer):
    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        x, self_w, cross_w = super().forward(x, memory, self_mask, cross_mask, cache, need_weights)
        return self.ffn_norm(self.ffn(x)), self_w, cross_w  # the bug: no x + around the FFN


class NoCausalMask(DecoderLayer):
    def forward(self, x, memory, self_mask, cross_mask, cache=None, need_weights=False):
        return super().forward(x, memory, None, cross_mask, cache, need_weights)


class NoResidual(EncoderLayer):
    def forward(self, x, src_mask, need_weights=False):
        y, w = self._sa_block(x, src_mask, need_weights)
        x = self.self_attn_norm(y)  # the bug: x + y
        return self.ffn_norm(x + self._ff_block(x)), w


class NormOnBranch(EncoderLayer):
    """x + norm(sublayer(x)): silenced, it returns x, as pre-LN does. It passed."""

    def forward(self, x, src_mask, need_weights=False):
        y, w = self._sa_block(x, src_mask, need_weights)
        x = x + self.self_attn_norm(y)  # the bug: the norm on the branch
        return x + self.ffn_norm(self._ff_block(x)), w


class NoNorm(EncoderLayer):
    """x + sublayer(x) and no norm anywhere: silenced, it returns x. It passed."""

    def __init__(self, cfg):
        super().__init__(cfg)
        del self.self_attn_norm, self.ffn_norm

    def forward(self, x, src_mask, need_weights=False):
        y, w = self._sa_block(x, src_mask, need_weights)
        x = x + y
        return x + self._ff_block(x), w


class NormedResidual(EncoderLayer):
    """Pre-LN with the residual added to the normalised input."""

    def forward(self, x, src_mask, need_weights=False):
        x = self.self_attn_norm(x)
        y, w = self._sa_block(x, src_mask, need_weights)
        x = self.ffn_norm(x + y)
        return x + self._ff_block(x), w


class TorchEncoderLayer(nn.Module):
    def __init__(self, norm_first):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(12, 3, 24, batch_first=True, norm_first=norm_first)

    def forward(self, x, src_mask):
        return self.layer(x, src_key_padding_mask=~src_mask[:, 0, 0])


def test_check_encoder_layer():
    for norm_first in (False, True):
        cfg = TransformerConfig(**{**CFG.to_dict(), "norm_first": norm_first})
        assert tour.check_encoder_layer(EncoderLayer(cfg), 12)
        report = tour.check_encoder_layer(TorchEncoderLayer(norm_first), 12)
        assert report.ok, str(report)
    assert tour.check_encoder_layer(FreshNorm(CFG), 12).bug == "module_built_in_forward"
    assert tour.check_encoder_layer(AlwaysDropout(CFG), 12).bug == "dropout_in_eval"
    assert tour.check_encoder_layer(NoResidual(CFG), 12).bug == "missing_residual"
    for unnormed in (NormOnBranch(CFG), NoNorm(CFG)):
        report = tour.check_encoder_layer(unnormed, 12)
        assert report.bug == "missing_layer_norm", str(report)
    normed = tour.check_encoder_layer(NormedResidual(CFG), 12)
    assert normed.bug == "residual_on_normalized_input", str(normed)


def test_check_decoder_layer():
    layer = DecoderLayer(CFG)
    layer.train()
    report = tour.check_decoder_layer(layer, 12)
    assert report.ok, str(report)
    assert layer.training  # the checker restores the mode it found
    report = tour.check_decoder_layer(HeadAveraged(CFG), 12)
    assert report.ok, str(report)
    pre_ln = TransformerConfig(**{**CFG.to_dict(), "norm_first": True})
    for correct in (DecoderLayer(pre_ln), Float64Weights(CFG)):
        report = tour.check_decoder_layer(correct, 12)
        assert report.ok and report.complete, str(report)
    # 1.0 added to every feature of x is invisible to a LayerNorm: a pre-LN layer without
    # its causal mask passed the future check.
    report = tour.check_decoder_layer(NoCausalMask(pre_ln), 12)
    assert report.bug == "future_leaks", str(report)
    cases = {
        "returns_self_attention_twice": SelfTwice(CFG),
        "cross_attention_first": CrossFirst(CFG),
        "diagonal_masked": DiagonalMasked(CFG),
        "cross_queries_skip_self_attention": CrossQueriesFromX(CFG),
        "source_padding_leaks": NoCrossMask(CFG),
        "future_leaks": NoCausalMask(CFG),
        "kv_from_query": CrossOverTarget(CFG),
        "missing_residual": DecoderNoResidual(CFG),
    }
    report = tour.check_decoder_layer(CrossOverTargetMasked(CFG), 12)
    assert report.bug == "kv_from_query", str(report)
    report = tour.check_decoder_layer(SelfMaskInCross(CFG), 12)  # was: raises, and a k.T hint
    assert report.bug == "self_mask_in_cross_attention", str(report)
    assert "cross_mask" in report.message and "k.T" not in report.message
    for bug, module in cases.items():
        report = tour.check_decoder_layer(module, 12)
        assert report.bug == bug, str(report)


# -- training side -----------------------------------------------------------------------


def test_training_checkers():
    assert tour.check_shift_target(shift_target)
    assert tour.check_shift_target(lambda ys: (ys, ys)).bug == "not_shifted"
    assert tour.check_shift_target(lambda ys: shift_target(ys)[::-1]).bug == "swapped"
    shifts = {
        "eos_in_input": lambda ys: ([[1, *y, 2] for y in ys], [[*y, 2] for y in ys]),
        "bos_in_output": lambda ys: ([[1, *y] for y in ys], [[1, *y, 2] for y in ys]),
        "no_eos": lambda ys: ([[1, *y] for y in ys], [list(y) for y in ys]),
    }
    for bug, fn in shifts.items():
        assert tour.check_shift_target(fn).bug == bug

    assert tour.check_label_smoothing(lambda *a: label_smoothed_cross_entropy(*a)[0])
    torch_mean = lambda lg, t, eps, p: F.cross_entropy(lg, t, ignore_index=p, label_smoothing=eps)  # noqa: E731
    assert tour.check_label_smoothing(torch_mean)
    assert tour.check_label_smoothing(kl_div_loss)
    assert tour.check_label_smoothing(label_smoothed_cross_entropy)  # (loss, nll, n)
    fixed = lambda lg, t, eps, p: F.cross_entropy(lg, t, ignore_index=0, label_smoothing=0.1)  # noqa: E731
    assert tour.check_label_smoothing(fixed).bug == "ignores_arguments"  # it passed
    no_ignore = lambda lg, t, eps, p: F.cross_entropy(lg, t, label_smoothing=eps, reduction="sum")  # noqa: E731
    assert tour.check_label_smoothing(no_ignore).bug == "pads_counted"
    plain = lambda lg, t, eps, p: F.cross_entropy(lg, t, ignore_index=p, reduction="sum")  # noqa: E731
    assert tour.check_label_smoothing(plain).bug == "no_smoothing"

    def other_v_minus_1(logits, target, eps, pad_id):
        q = torch.full_like(logits, eps / (logits.size(-1) - 1))
        q[torch.arange(len(target)), target] = 1 - eps
        keep = target != pad_id
        return -(q * logits.log_softmax(-1)).sum(-1)[keep].sum()

    assert tour.check_label_smoothing(other_v_minus_1).bug == "smoothing_over_v_minus_1"

    def smoothed(logits, target, spread, on_target, pad_column=True):
        q = torch.full_like(logits, spread)
        if not pad_column:
            q[:, 0] = 0.0
        return q.scatter(1, target[:, None], on_target)

    def annotated(logits, target, eps, pad_id):  # The Annotated Transformer's
        q = smoothed(logits, target, eps / (logits.size(-1) - 2), 1 - eps, pad_column=False)
        return F.kl_div(
            logits.log_softmax(-1)[target != pad_id], q[target != pad_id], reduction="sum"
        )

    def one_minus_eps(logits, target, eps, pad_id):
        q = smoothed(logits, target, eps / logits.size(-1), 1 - eps)
        return -(q * logits.log_softmax(-1)).sum(-1)[target != pad_id].sum()

    def no_log_softmax(logits, target, eps, pad_id):
        V = logits.size(-1)
        return (
            -(smoothed(logits, target, eps / V, 1 - eps + eps / V) * logits)
            .sum(-1)[target != pad_id]
            .sum()
        )

    def mean_counts_pads(logits, target, eps, pad_id):
        loss = F.cross_entropy(logits, target, label_smoothing=eps, reduction="none")
        return loss.masked_fill(target == pad_id, 0.0).mean()

    losses = {
        "smoothing_skips_pad_column": annotated,
        "target_gets_1_minus_eps": one_minus_eps,
        "no_log_softmax": no_log_softmax,
        "mean_counts_pads": mean_counts_pads,
    }
    for bug, fn in losses.items():
        assert tour.check_label_smoothing(fn).bug == bug

    assert tour.check_noam_rate(noam_rate)
    wrong = lambda s, d, w: d**-0.5 * min(s**-0.5, s * w**-0.5)  # noqa: E731
    assert tour.check_noam_rate(wrong).bug == "warmup_exponent"
    assert tour.check_noam_rate(lambda s, d, w: 1e-3).bug == "wrong_rate"


@pytest.mark.parametrize(
    ("fn", "bug"),
    [
        (lambda s, d, w: noam_rate(s, d, w) * 10, "wrong_rate"),
        (lambda s, d, w: d**-0.5 * min(s**-0.5, s * w**1.5), "warmup_exponent_sign"),
        (lambda s, d, w: min(s**-0.5, s * w**-1.5), "missing_d_model_factor"),
        (lambda s, d, w: d**0.5 * min(s**-0.5, s * w**-1.5), "d_model_exponent"),
        (lambda s, d, w: d**-0.5 * max(s**-0.5, s * w**-1.5), "max_not_min"),
        (lambda s, d, w: noam_rate(s + 1, d, w), "step_off_by_one"),
    ],
)
def test_check_noam_rate_names_each_slip(fn, bug):
    assert tour.check_noam_rate(fn).bug == bug
    written_otherwise = lambda s, d, w: (1 / math.sqrt(d)) * min(s * w ** (-1.5), 1 / math.sqrt(s))  # noqa: E731
    assert tour.check_noam_rate(written_otherwise)


def test_trace_shapes_observes_the_model():
    from aiayn import Transformer

    cfg = TransformerConfig(
        src_vocab_size=30,
        tgt_vocab_size=30,
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_ff=40,
        share_embeddings=True,
    )
    model = Transformer(cfg).train()
    model.encoder.eval()  # a part in eval mode on purpose keeps it: not train(True) for all
    stages = {
        s.key: s.shape
        for s in tour.trace_shapes(model, torch.ones(1, 7).long() + 4, torch.ones(1, 5).long() + 4)
    }
    assert model.training and model.decoder.training and not model.encoder.training
    assert stages["src_embed"] == (1, 7, 16) and stages["tgt_embed"] == (1, 5, 16)
    assert stages["enc_q"] == (1, 2, 7, 8) and stages["enc_ffn_inner"] == (1, 7, 40)
    assert stages["dec_cross_q"] == (1, 2, 5, 8) and stages["dec_cross_k"] == (1, 2, 7, 8)
    assert stages["dec_cross_weights"] == (1, 2, 5, 7) and stages["logits"] == (1, 5, 30)
    assert list(stages) == list(tour.shapes.STAGES)
