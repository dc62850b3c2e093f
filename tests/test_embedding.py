"""Embeddings and positional encodings (Sections 3.4 and 3.5) as modules: the sinusoidal
table to float64 accuracy, learned positions, offsets per batch and per row, the max_len
check at its exact boundary, and the token embedding's scale, init and pad row; and what
the config gives every layer (epsilon, dropouts, activation)."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.errors import ConfigError, ModelInputError
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding, sinusoidal_table


@pytest.mark.parametrize("d_model", [8, 7])
def test_sinusoidal_table_to_float64_accuracy(d_model):
    """Computed in float64, then rounded: at position 9999 the angle is ~1e4 rad, where
    float32 arithmetic would be off by ~1e-3 (the sine as much)."""
    table = sinusoidal_table(10000, d_model)
    assert table.dtype == torch.float32 and table.shape == (10000, d_model)
    want = torch.zeros(10000, d_model, dtype=torch.float64)
    for i in range(d_model):
        freq = 10000.0 ** (-(i - i % 2) / d_model)
        angle = torch.arange(10000, dtype=torch.float64) * freq
        want[:, i] = torch.sin(angle) if i % 2 == 0 else torch.cos(angle)
    assert (table.double() - want).abs().max() < 1e-6


def test_sinusoidal_encoding_adds_its_rows_at_an_offset_and_is_not_saved():
    torch.manual_seed(0)
    pe = PositionalEncoding(8, max_len=20, dropout=0.0)
    assert list(pe.parameters()) == [] and pe.state_dict() == {}  # rebuilt, never saved
    x = torch.randn(2, 5, 8)
    table = sinusoidal_table(20, 8)
    torch.testing.assert_close(pe(x), x + table[:5])
    torch.testing.assert_close(pe(x, offset=3), x + table[3:8])
    offsets = torch.tensor([0, 11])  # each row at its own position
    out = pe(x, offset=offsets)
    torch.testing.assert_close(out[0], x[0] + table[0:5])
    torch.testing.assert_close(out[1], x[1] + table[11:16])
    empty = torch.randn(2, 0, 8)
    assert pe(empty, offset=offsets).shape == (2, 0, 8)  # no step: nothing to check
    assert pe(empty, offset=20).shape == (2, 0, 8)


@pytest.mark.parametrize("how", ["assign", "to_empty"])
def test_a_model_built_on_the_meta_device_gets_its_tables_when_loaded(how):
    # The fast way to load a large model: build it without memory, then load the weights.
    # The tables are in no state dict: they stayed meta (a device error deep in torch) or
    # were to_empty()'s uninitialised memory (NaN here: silently wrong outputs).
    from aiayn import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(30, 30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=24)
    model = Transformer(cfg).eval()
    with torch.device("meta"):
        loaded = Transformer(cfg)
    if how == "to_empty":
        loaded.to_empty(device="cpu").src_pos.table.fill_(math.nan)  # as memory may hold
        loaded.load_state_dict(model.state_dict())
    else:
        loaded.load_state_dict(model.state_dict(), assign=True)
    for pos in (loaded.src_pos, loaded.tgt_pos):
        assert torch.equal(pos.table, sinusoidal_table(24, 16))
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 8, 9]])
    assert torch.equal(loaded.eval()(src, tgt), model(src, tgt))
    half = Transformer(cfg).half()  # a table keeps its dtype: no float32 promotion
    half.load_state_dict(model.half().state_dict())
    assert half.src_pos.table.dtype == torch.float16


@pytest.mark.parametrize("built", ["meta", "float32"])
def test_bf16_weights_assigned_get_bf16_tables(built):
    """A table rebuilt in its own (float32) dtype beside assigned bf16 weights promoted the
    activations to float32: torch's 'mat1 and mat2 must have the same dtype' at the first
    forward, where docs/python-api.md promises a model that decodes as one built as usual."""
    from aiayn import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(30, 30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=24)
    model = Transformer(cfg).to(torch.bfloat16).eval()
    with torch.device("meta" if built == "meta" else "cpu"):
        loaded = Transformer(cfg)
    loaded.load_state_dict(model.state_dict(), assign=True)
    assert loaded.src_pos.table.dtype == loaded.tgt_pos.table.dtype == torch.bfloat16
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 8, 9]])
    assert torch.equal(loaded.eval()(src, tgt), model(src, tgt))


def test_positions_past_max_len_are_refused_at_the_exact_boundary():
    pe = PositionalEncoding(8, max_len=20, dropout=0.0)
    x = torch.zeros(2, 5, 8)
    pe(x, offset=15)  # positions 15..19: the last ones there are
    pe(x, offset=torch.tensor([15, 0]))
    for offset in (16, torch.tensor([0, 16])):
        with pytest.raises(ModelInputError) as e:
            pe(x, offset=offset)
        assert str(e.value) == (
            "sequence reaches position 21, past max_len=20; raise TransformerConfig.max_len "
            "or shorten the input"
        )
    # A negative offset dropped the input ([2, 0, 8]) or, per row, read the table from its
    # end; a 0-d tensor was torch's IndexError.
    for offset in (-1, torch.tensor([-1, 0])):
        with pytest.raises(ModelInputError, match=r"^offset -1: positions start at 0$"):
            pe(x, offset=offset)
    with pytest.raises(ModelInputError, match="got a 0-D tensor"):
        pe(x, offset=torch.tensor(3))


def test_learned_positions_are_a_trained_table():
    torch.manual_seed(0)
    pe = PositionalEncoding(32, max_len=64, dropout=0.0, learned=True)
    (table,) = pe.parameters()
    assert table.shape == (64, 32) and table.requires_grad
    assert table.std().item() == pytest.approx(32**-0.5, rel=0.1)  # 2048 draws
    x = torch.randn(3, 4, 32)
    torch.testing.assert_close(pe(x, offset=2), x + table[2:6])
    torch.testing.assert_close(pe(x, offset=torch.tensor([0, 1, 60]))[2], x[2] + table[60:64])
    assert not PositionalEncoding(32, 64, 0.0).learned  # sinusoidal by default


def test_positional_dropout_applies_in_training_only():
    torch.manual_seed(0)
    pe = PositionalEncoding(8, max_len=20, dropout=0.5)
    x = torch.ones(4, 10, 8)
    want = x + sinusoidal_table(20, 8)[:10]
    torch.testing.assert_close(pe.eval()(x), want)
    dropped = pe.train()(x)
    zeros = (dropped == 0).float().mean().item()
    assert 0.4 < zeros < 0.6  # 320 entries
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], 2 * want[kept])  # scaled by 1 / (1 - p)


def test_token_embedding_scale_init_and_pad_row():
    torch.manual_seed(0)
    emb = TokenEmbedding(50, 64, pad_id=3)
    assert emb.weight.std().item() == pytest.approx(64**-0.5, rel=0.1)
    assert emb.weight[3].abs().sum() == 0  # the pad row starts at zero
    ids = torch.tensor([[1, 3, 7]])
    out = emb(ids)
    torch.testing.assert_close(out, emb.weight[ids] * math.sqrt(64))  # scaled by default
    plain = TokenEmbedding(50, 64, pad_id=3, scale=False)
    torch.testing.assert_close(plain(ids), plain.weight[ids])
    out.sum().backward()
    grad = emb.weight.grad
    assert grad is not None and grad[3].abs().sum() == 0 and grad[7].abs().sum() > 0


def test_every_layer_takes_the_configs_epsilon_dropouts_and_activation():
    """What the config says reaches each layer (a layer built with a default instead
    computes nearly the same, and only on another config would it show)."""
    from aiayn import Transformer
    from aiayn.model import MultiHeadAttention
    from aiayn.model.layers import FeedForward
    from conftest import tiny_config

    cfg = tiny_config(
        layer_norm_eps=1e-3, attention_dropout=0.25, activation_dropout=0.125, activation="gelu"
    )
    model = Transformer(cfg)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 2 * 3 and all(m.eps == 1e-3 for m in norms)
    attentions = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attentions) == 2 + 2 * 2 and all(m.attention_dropout == 0.25 for m in attentions)
    ffns = [m for m in model.modules() if isinstance(m, FeedForward)]
    assert len(ffns) == 4
    assert all((m.activation, m.activation_dropout) == ("gelu", 0.125) for m in ffns)
    plain = FeedForward(8, 16)  # the defaults: ReLU, no dropout inside
    assert (plain.activation, plain.activation_dropout) == ("relu", 0.0)
    x = torch.randn(2, 3, 8)
    want = plain.w_2(torch.relu(plain.w_1(x)))
    torch.testing.assert_close(plain.train()(x), want)
    with pytest.raises(ConfigError) as e:
        FeedForward(8, 16, activation="tanh")
    assert str(e.value) == "activation must be one of relu, swish, gelu"
    twin = Transformer(cfg).eval()
    twin.load_state_dict(model.state_dict())  # every layer's loading hook passes it all on
    src, tgt = torch.randint(3, 23, (2, 5)), torch.randint(3, 29, (2, 4))
    torch.testing.assert_close(twin(src, tgt), model.eval()(src, tgt))
