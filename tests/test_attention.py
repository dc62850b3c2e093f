"""Scaled dot-product and multi-head attention against independent references."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aiayn.model import MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention
from aiayn.model.masks import decoder_self_mask

D, H = 32, 4


def make_pair(seed: int = 0):
    torch.manual_seed(seed)
    ours = MultiHeadAttention(D, H).eval()
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():
        # Random biases too, so a swapped or missing bias cannot hide.
        ours.in_proj.bias.normal_()
        ours.out_proj.bias.normal_()
        ref.in_proj_weight.copy_(ours.in_proj.weight)
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, ref


def per_head_loop(mha: MultiHeadAttention, x, memory, allowed):
    """One Linear per head for W_i^Q, W_i^K, W_i^V, attention per head, concat, W^O."""
    memory = x if memory is None else memory
    d_k = mha.d_k
    w, b = mha.in_proj.weight, mha.in_proj.bias
    heads = []
    for i in range(mha.n_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        q = x @ w[:D][cols].T + b[:D][cols]
        k = memory @ w[D : 2 * D][cols].T + b[D : 2 * D][cols]
        v = memory @ w[2 * D :][cols].T + b[2 * D :][cols]
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_k)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v)
    return mha.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("masked", [False, True])
def test_multihead_matches_torch_and_per_head_loop(kind, masked):
    ours, ref = make_pair()
    torch.manual_seed(1)
    x = torch.randn(3, 5, D)
    memory = None if kind == "self" else torch.randn(3, 7, D)
    kv = x if memory is None else memory
    key_ids = torch.ones(3, kv.size(1), dtype=torch.long)
    key_ids[1, -2:] = 0  # two pad keys in row 1
    key_ids[2, -1:] = 0
    allowed = padding_mask(key_ids, 0) if masked else None  # [B, 1, 1, Tk]
    if masked and kind == "self":
        allowed = allowed & causal_mask(5)
    with torch.no_grad():
        out, _ = ours(x, memory, mask=allowed)
        ref_mask = (
            None if allowed is None else ~allowed.expand(3, H, 5, kv.size(1)).reshape(3 * H, 5, -1)
        )
        expected, _ = ref(x, kv, kv, attn_mask=ref_mask, need_weights=False)
        loop = per_head_loop(ours, x, memory, None if allowed is None else allowed[:, 0])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, loop, atol=1e-5, rtol=1e-5)


def test_cross_attention_takes_keys_and_values_from_memory():
    ours, _ = make_pair()
    x = torch.randn(2, 4, D)
    with torch.no_grad():
        a, _ = ours(x, torch.randn(2, 6, D))
        b, _ = ours(x, torch.randn(2, 6, D))
    assert not torch.allclose(a, b), "cross-attention output ignores the memory"


def test_weights_path_equals_fused_path_and_rows_sum_to_one():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, H, 5, 8), torch.randn(2, H, 6, 8), torch.randn(2, H, 6, 8)
    allowed = torch.rand(2, 1, 5, 6) > 0.3
    allowed[..., 0] = True
    fast, none = scaled_dot_product_attention(q, k, v, allowed)
    slow, weights = scaled_dot_product_attention(q, k, v, allowed, need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 5))
    assert (weights.masked_select(~allowed.expand_as(weights)) == 0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_give_zeros_not_nan(need_weights):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, H, 3, 8), torch.randn(2, H, 4, 8), torch.randn(2, H, 4, 8)
    q.requires_grad_()
    allowed = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    allowed[1] = False  # every key of sentence 1 is masked
    out, _ = scaled_dot_product_attention(q, k, v, allowed, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_scaling_is_by_sqrt_d_k():
    q = torch.tensor([[[[1.0, 1.0, 1.0, 1.0]]]])  # d_k = 4
    k = torch.tensor([[[[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]]])
    v = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]]])
    _, w = scaled_dot_product_attention(q, k, v, need_weights=True)
    expected = torch.softmax(torch.tensor([4.0 / 2.0, 0.0]), -1)  # QK^T / sqrt(4)
    torch.testing.assert_close(w[0, 0, 0], expected)


def test_head_split_keeps_each_heads_features_together():
    # If heads were split by a bare reshape(B, h, T, d_k), head 0 would see features of
    # several positions; changing position 1 would then change head 0's view of position 0.
    mha = MultiHeadAttention(D, H)
    x = torch.randn(1, 3, D)
    heads = mha._split_heads(x)  # [1, h, 3, d_k]
    assert heads.shape == (1, H, 3, D // H)
    torch.testing.assert_close(heads[0, 1, 2], x[0, 2, D // H : 2 * D // H])


def test_masks_are_made_on_the_device_of_their_ids():
    """On "meta" (a device every machine has) as on a GPU: a mask made on the CPU would
    be moved to the scores' device at every step, or fail to broadcast there."""
    meta = torch.device("meta")
    assert causal_mask(4, meta).device == meta
    ids = torch.ones(2, 5, dtype=torch.long, device=meta)
    assert decoder_self_mask(ids, 0).device == meta
    assert decoder_self_mask(ids, 0).shape == (2, 1, 5, 5)


def test_decoder_self_mask_of_no_target_positions():
    """An empty target (a decoder primed with nothing) gives an empty mask, no error."""
    assert decoder_self_mask(torch.empty(2, 0, dtype=torch.long), 0).shape == (2, 1, 0, 0)
    # Position 0 is never masked, even when it holds the pad id (Marian starts from pad).
    ids = torch.tensor([[0, 5, 0], [1, 0, 0]])
    mask = decoder_self_mask(ids, 0)
    assert mask[:, 0, :, 0].all()
    want = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert torch.equal(mask[0, 0], want)
    assert torch.equal(mask[1, 0], torch.tensor([[1, 0, 0], [1, 0, 0], [1, 0, 0]]).bool())


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_dropout_drops_weights_and_keeps_the_mean(need_weights):
    """dropout_p zeroes about that share of the attention weights and scales the rest by
    1 / (1 - p), on the fused path and on the one that returns the weights."""
    torch.manual_seed(0)
    q, k = torch.randn(8, 2, 16, 4), torch.randn(8, 2, 16, 4)
    v = torch.eye(16).expand(8, 2, 16, 16)  # the output row is the weight row
    plain, _ = scaled_dot_product_attention(q, k, v)
    dropped, weights = scaled_dot_product_attention(q, k, v, None, 0.5, need_weights)
    zeros = (dropped == 0).float().mean().item()
    assert 0.4 < zeros < 0.6  # 4096 weights
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], 2 * plain[kept])
    if need_weights:
        torch.testing.assert_close(weights, dropped)  # v is the identity


def test_attention_dropout_share_is_the_one_given():
    """The weights path drops the share asked for (0.25 here), not a default one."""
    torch.manual_seed(1)
    q, k = torch.randn(8, 2, 16, 4), torch.randn(8, 2, 16, 4)
    v = torch.eye(16).expand(8, 2, 16, 16)
    dropped, _ = scaled_dot_product_attention(q, k, v, None, 0.25, need_weights=True)
    assert 0.2 < (dropped == 0).float().mean().item() < 0.3  # 4096 weights


def test_multihead_defaults_and_refusal():
    """No attention dropout unless asked (train mode changes nothing then), no weights
    unless asked, dropout only in train mode, and a d_model that heads cannot split is
    refused by name."""
    torch.manual_seed(0)
    mha, x = MultiHeadAttention(16, 4), torch.randn(2, 5, 16)
    out, weights = mha.train()(x)
    assert weights is None
    torch.testing.assert_close(out, mha.eval()(x)[0], rtol=0, atol=0)
    dropping = MultiHeadAttention(16, 4, attention_dropout=0.5)
    dropping.load_state_dict(mha.state_dict())
    assert not torch.equal(dropping.train()(x)[0], out)  # half the weights dropped
    torch.testing.assert_close(dropping.eval()(x)[0], out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=4"):
        MultiHeadAttention(10, 4)


def test_an_empty_batch_attends_to_nothing():
    """Zero rows in, zero rows out, for self- and encoder-decoder attention alike."""
    mha = MultiHeadAttention(16, 4).eval()
    empty = torch.zeros(0, 3, 16)
    assert mha(empty)[0].shape == (0, 3, 16)
    assert mha(empty, torch.zeros(0, 5, 16))[0].shape == (0, 3, 16)
