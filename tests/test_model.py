"""The whole model: paper formulas, torch.nn.Transformer equivalence, masking properties,
input validation and the Table 3 presets."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aiayn import Transformer, TransformerConfig
from aiayn.errors import ModelInputError
from aiayn.model import DecoderState, projection, sinusoidal_table
from conftest import random_batch, tiny_config


@pytest.mark.parametrize("d_model", [6, 16, 512])
def test_positional_encoding_is_the_papers_formula(d_model):
    table = sinusoidal_table(120, d_model)
    for pos in (0, 1, 7, 50, 119):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positions_past_max_len_raise_a_clear_error(tiny_model):
    src = torch.full((1, 65), 5, dtype=torch.long)
    with pytest.raises(ValueError, match="max_len=64"):
        tiny_model.encode(src)


def copy_into_torch_transformer(model: Transformer) -> nn.Transformer:
    cfg = model.cfg
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        num_encoder_layers=cfg.encoder_layers,
        num_decoder_layers=cfg.decoder_layers,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=cfg.norm_first,
    ).eval()

    def attn(dst: nn.MultiheadAttention, src) -> None:
        dst.in_proj_weight.copy_(src.in_proj.weight)
        dst.in_proj_bias.copy_(src.in_proj.bias)
        dst.out_proj.weight.copy_(src.out_proj.weight)
        dst.out_proj.bias.copy_(src.out_proj.bias)

    def copy(dst: nn.Module, src: nn.Module) -> None:
        dst.load_state_dict(src.state_dict())

    with torch.no_grad():
        for r, o in zip(ref.encoder.layers, model.encoder.layers, strict=True):
            attn(r.self_attn, o.self_attn)
            copy(r.linear1, o.ffn.w_1)
            copy(r.linear2, o.ffn.w_2)
            copy(r.norm1, o.self_attn_norm)
            copy(r.norm2, o.ffn_norm)
        for r, o in zip(ref.decoder.layers, model.decoder.layers, strict=True):
            attn(r.self_attn, o.self_attn)
            attn(r.multihead_attn, o.cross_attn)
            copy(r.linear1, o.ffn.w_1)
            copy(r.linear2, o.ffn.w_2)
            copy(r.norm1, o.self_attn_norm)
            copy(r.norm2, o.cross_attn_norm)
            copy(r.norm3, o.ffn_norm)
        if cfg.norm_first:
            copy(ref.encoder.norm, model.encoder.norm)
            copy(ref.decoder.norm, model.decoder.norm)
        else:  # nn.Transformer always adds final norms; the post-LN paper model has none
            ref.encoder.norm = None
            ref.decoder.norm = None
    return ref


@pytest.mark.parametrize("norm_first", [False, True])
def test_model_equals_torch_nn_transformer(norm_first):
    torch.manual_seed(0)
    cfg = tiny_config(norm_first=norm_first, n_encoder_layers=3, n_decoder_layers=2)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    ref = copy_into_torch_transformer(model)
    src, tgt = random_batch(cfg, [7, 4, 6], [5, 6, 2])
    with torch.no_grad():
        ours = model(src, tgt)
        T = tgt.size(1)
        hidden = ref(
            model.src_pos(model.src_embed(src)),
            model.tgt_pos(model.tgt_embed(tgt)),
            tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1),  # True = blocked here
            src_key_padding_mask=src == cfg.pad_id,
            tgt_key_padding_mask=tgt == cfg.pad_id,
            memory_key_padding_mask=src == cfg.pad_id,
        )
        expected = model.project(hidden)
    real = tgt != cfg.pad_id
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=1e-5)


def test_changing_future_targets_never_changes_earlier_logits(tiny_model):
    cfg = tiny_model.cfg
    src, tgt = random_batch(cfg, [6, 6], [8, 8])
    with torch.no_grad():
        base = tiny_model(src, tgt)
        for t in range(tgt.size(1) - 1):
            changed = tgt.clone()
            changed[:, t + 1 :] = torch.randint(3, cfg.tgt_vocab_size, changed[:, t + 1 :].shape)
            out = tiny_model(src, changed)
            torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_extra_padding_does_not_change_real_positions(tiny_model):
    cfg = tiny_model.cfg
    src, tgt = random_batch(cfg, [6, 3], [5, 4])
    pad = cfg.pad_id
    with torch.no_grad():
        base = tiny_model(src, tgt)
        longer = tiny_model(
            nn.functional.pad(src, (0, 5), value=pad), nn.functional.pad(tgt, (0, 3), value=pad)
        )
    real = tgt != pad
    torch.testing.assert_close(longer[:, : tgt.size(1)][real], base[real], atol=1e-6, rtol=0)


def test_what_a_pad_position_holds_does_not_matter(tiny_model):
    cfg = tiny_model.cfg
    src, tgt = random_batch(cfg, [6, 3], [5, 2])
    with torch.no_grad():
        base = tiny_model(src, tgt)
        tiny_model.src_embed.weight[cfg.pad_id].normal_()  # pad vectors now hold noise
        tiny_model.tgt_embed.weight[cfg.pad_id].normal_()
        noisy = tiny_model(src, tgt)
    real = tgt != cfg.pad_id
    words = torch.arange(cfg.tgt_vocab_size) != cfg.pad_id  # the tied pad logit itself moves
    torch.testing.assert_close(noisy[real][:, words], base[real][:, words], atol=1e-6, rtol=0)


def test_batch_equals_each_sentence_alone(tiny_model):
    cfg = tiny_model.cfg
    lengths_src, lengths_tgt = [7, 2, 5], [3, 6, 4]
    src, tgt = random_batch(cfg, lengths_src, lengths_tgt)
    with torch.no_grad():
        batched = tiny_model(src, tgt)
        for i, (s, t) in enumerate(zip(lengths_src, lengths_tgt)):
            alone = tiny_model(src[i : i + 1, :s], tgt[i : i + 1, :t])
            torch.testing.assert_close(batched[i, :t], alone[0], atol=1e-5, rtol=1e-5)


def test_decoder_uses_the_source_through_cross_attention(tiny_model):
    cfg = tiny_model.cfg
    src, tgt = random_batch(cfg, [6], [5])
    other, _ = random_batch(cfg, [6], [5], seed=9)
    with torch.no_grad():
        assert not torch.allclose(tiny_model(src, tgt), tiny_model(other, tgt))
        _, weights = tiny_model.forward_with_attention(src, tgt)
    assert [w.shape for w in weights["cross"]] == [(1, 4, 5, 6)] * 2
    assert [w.shape for w in weights["decoder_self"]] == [(1, 4, 5, 5)] * 2
    assert [w.shape for w in weights["encoder"]] == [(1, 4, 6, 6)] * 2
    # With a source as long as the target the shapes agree: the encoder-decoder weights
    # must still be their own, over the source (a decoder returning its self-attention
    # weights twice passed on the shapes alone).
    src, tgt = random_batch(cfg, [5], [5])
    other, _ = random_batch(cfg, [5], [5], seed=9)
    with torch.no_grad():
        _, weights = tiny_model.forward_with_attention(src, tgt)
        _, changed = tiny_model.forward_with_attention(other, tgt)
    for cross, own, moved in zip(weights["cross"], weights["decoder_self"], changed["cross"]):
        assert not torch.allclose(cross, own) and not torch.allclose(cross, moved)
        assert torch.allclose(own.triu(1), torch.zeros_like(own))  # self: causal
        assert not torch.allclose(cross.triu(1), torch.zeros_like(cross))  # cross: not


def test_embeddings_scaled_shared_and_tied():
    torch.manual_seed(0)
    model = Transformer(tiny_config(tgt_vocab_size=23, share_embeddings=True)).eval()
    ids = torch.tensor([[5, 6]])
    torch.testing.assert_close(model.src_embed(ids), model.src_embed.weight[ids] * math.sqrt(32))
    assert model.tgt_embed is model.src_embed
    x = torch.randn(1, 2, 32)
    torch.testing.assert_close(model.project(x), x @ model.src_embed.weight.T)
    untied = Transformer(tiny_config(tie_output=False))
    assert untied.tgt_embed is not untied.src_embed and untied.out_proj is not None


@pytest.mark.parametrize("norm_first", [False, True])
def test_every_layer_norm_is_a_registered_trained_parameter(norm_first):
    """A LayerNorm built inside forward() would be re-initialised each call and never
    trained: the registered one beside it would shape nothing. Each is perturbed in turn
    (one of them alone was, so the other nine could be built in forward unseen)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(norm_first=norm_first)).eval()
    norms = {n: m for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    final = 2 if norm_first else 0  # pre-LN: the encoder's and the decoder's last norm
    assert len(norms) == 2 * 2 + 3 * 2 + final  # 2 per encoder and 3 per decoder layer
    src, tgt = random_batch(model.cfg, [5], [4])
    with torch.no_grad():
        before = model(src, tgt)
        for name, norm in norms.items():
            kept = norm.weight.clone()
            norm.weight.add_(torch.randn_like(kept))
            assert not torch.allclose(model(src, tgt), before), f"{name} shapes nothing"
            norm.weight.copy_(kept)


@pytest.mark.parametrize("norm_first", [False, True])
def test_checkpoints_with_the_old_norm_names_still_load(norm_first):
    """Before the sub-layers were spelled out, each LayerNorm sat in a Residual wrapper:
    encoder attn_block.norm / ffn_block.norm, decoder self_block / cross_block / ffn_block."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(norm_first=norm_first)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_()  # no norm at its default init: a key loaded into the wrong place shows
    old_names = {
        "encoder": {"self_attn_norm": "attn_block.norm", "ffn_norm": "ffn_block.norm"},
        "decoder": {
            "self_attn_norm": "self_block.norm",
            "cross_attn_norm": "cross_block.norm",
            "ffn_norm": "ffn_block.norm",
        },
    }
    legacy = {}
    for key, value in model.state_dict().items():
        stack, _, index, sub, rest = [*key.split(".", 4), "", "", "", ""][:5]
        if stack in old_names and sub in old_names[stack]:
            key = f"{stack}.layers.{index}.{old_names[stack][sub]}.{rest}"
        legacy[key] = value
    assert any(".attn_block.norm." in k for k in legacy) and any(
        ".cross_block." in k for k in legacy
    )
    fresh = Transformer(tiny_config(norm_first=norm_first)).eval()
    fresh.load_state_dict(legacy)  # strict: every old key found its new home
    src, tgt = random_batch(model.cfg, [5, 3], [4, 2])
    with torch.no_grad():
        torch.testing.assert_close(fresh(src, tgt), model(src, tgt), rtol=0, atol=0)


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.3))
    src, tgt = random_batch(model.cfg, [5], [4])
    assert not torch.allclose(model(src, tgt), model(src, tgt))
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt))


@pytest.mark.parametrize(
    ("src", "tgt", "message"),
    [
        (torch.ones(2, 3), torch.ones(2, 3, dtype=torch.long), "dtype"),
        (torch.ones(3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), "shape"),
        (torch.full((2, 3), 23), torch.ones(2, 3, dtype=torch.long), "id 23, outside"),
        (torch.full((2, 3), -1), torch.ones(2, 3, dtype=torch.long), "id -1, outside"),
        (torch.ones(2, 3, dtype=torch.long), torch.full((2, 3), 29), "tgt_in holds id 29"),
        (torch.ones(2, 65, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), "max_len"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 65, dtype=torch.long), "max_len"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long), "batch sizes"),
    ],
)
def test_bad_input_raises_value_error_saying_what_is_wrong(tiny_model, src, tgt, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(src, tgt)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"n_heads": 5}, "n_heads"),
        ({"dropout": 1.5}, "dropout"),
        ({"pad_id": 40}, "pad_id"),
        ({"eos_id": 0}, "eos_id"),
        ({"bos_id": 2}, "eos_id"),
        ({"activation": "tanh"}, "activation"),
        ({"activation_dropout": 1.0}, "activation_dropout"),
        ({"share_embeddings": True}, "share_embeddings"),
        ({"d_model": 0}, "d_model"),
        # The wrong type, as a recipe or a damaged file may give it: named, not a
        # TypeError from a comparison or from inside torch.
        ({"dropout": "abc"}, "dropout"),
        ({"max_len": 2.5}, "max_len"),
        ({"n_encoder_layers": 1.5}, "n_encoder_layers"),
        ({"layer_norm_eps": float("nan")}, "layer_norm_eps"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"tie_output": "yes"}, "tie_output"),
        ({"activation": 1}, "activation"),
        ({"pad_id": True}, "pad_id"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"TransformerConfig.{field}"):
        tiny_config(**overrides)


def test_presets_match_table_3_parameter_counts():
    base = TransformerConfig.base(37000)
    big = TransformerConfig.big(37000)
    assert (base.d_model, base.d_ff, base.n_heads, base.d_k, base.n_layers) == (512, 2048, 8, 64, 6)
    assert (big.d_model, big.d_ff, big.n_heads, big.d_k, big.dropout) == (1024, 4096, 16, 64, 0.3)
    n_base = Transformer(base).num_parameters()
    n_big = Transformer(big).num_parameters()
    assert abs(n_base - 65e6) / 65e6 < 0.04, n_base
    assert abs(n_big - 213e6) / 213e6 < 0.02, n_big


def test_every_default_is_the_papers():
    """Defaults that only a docs-sync test or a regression snapshot guarded (a mutation
    run changed each unnoticed by any test of behaviour): Table 3's base model, Section
    5.3's Adam and warmup, Section 5.4's label smoothing and Section 6.1's beam search."""
    from aiayn.decode import DecodeOptions
    from aiayn.train.recipe import Recipe

    cfg = TransformerConfig(src_vocab_size=100, tgt_vocab_size=100)
    assert (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.dropout) == (512, 8, 6, 2048, 0.1)
    assert (cfg.attention_dropout, cfg.activation_dropout) == (0.0, 0.0)  # not the paper's
    big = TransformerConfig.big(100)
    assert (big.n_layers, big.dropout, big.attention_dropout) == (6, 0.3, 0.0)
    r = Recipe()
    assert (r.label_smoothing, r.warmup, r.lr_scale) == (0.1, 4000, 1.0)
    assert (r.adam_betas, r.adam_eps) == ((0.9, 0.98), 1e-9)
    o = DecodeOptions()
    assert (o.beam, o.alpha, o.length_penalty, o.n_best, o.sampling) == (4, 0.6, "gnmt", 1, False)
    assert (o.max_len_a, o.max_len_b) == (1.0, 50)  # input length + 50


def test_config_round_trips_through_dict():
    cfg = tiny_config(norm_first=True)
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown field"):
        TransformerConfig.from_dict({**cfg.to_dict(), "d_modle": 3})


# -- options of pretrained Marian models (defaults: the paper) -------------------------------


@pytest.mark.parametrize(
    ("activation", "reference"),
    [("relu", torch.relu), ("swish", lambda h: h * torch.sigmoid(h)), ("gelu", None)],
)
def test_ffn_activation(activation, reference):
    torch.manual_seed(0)
    model = Transformer(tiny_config(activation=activation)).eval()
    ffn = model.encoder.layers[0].ffn
    x = torch.randn(2, 3, 32)
    hidden = ffn.w_1(x)
    if reference is None:  # the exact gelu: x * Phi(x)
        reference = lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # noqa: E731
    torch.testing.assert_close(ffn(x), ffn.w_2(reference(hidden)))


def test_activation_dropout_drops_hidden_units_in_training_only():
    torch.manual_seed(0)
    model = Transformer(tiny_config(activation_dropout=0.5))
    ffn = model.encoder.layers[0].ffn
    x = torch.randn(2, 3, 32)
    assert not torch.equal(ffn(x), ffn(x))
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn.w_2(torch.relu(ffn.w_1(x))))


def test_output_bias_adds_one_trained_logit_term_per_target_token():
    torch.manual_seed(0)
    for tie_output in (True, False):
        model = Transformer(tiny_config(output_bias=True, tie_output=tie_output)).eval()
        assert model.out_bias.shape == (29,) and model.out_bias.requires_grad
        with torch.no_grad():
            model.out_bias.normal_()
        src, tgt = random_batch(model.cfg, [5, 3], [4, 2])
        hidden = model(src, tgt, project=False)
        weight = model.tgt_embed.weight if tie_output else model.out_proj.weight
        torch.testing.assert_close(model(src, tgt), hidden @ weight.T + model.out_bias)


def test_embeddings_unscaled_when_asked():
    torch.manual_seed(0)
    model = Transformer(tiny_config(scale_embeddings=False))
    ids = torch.tensor([[4, 5, 6]])
    torch.testing.assert_close(model.src_embed(ids), model.src_embed.weight[ids])


def test_decoder_may_start_from_pad_and_always_sees_position_0():
    """Marian's decoder starts from the pad id: position 0 stays visible to every query,
    teacher forcing equals incremental decoding, and padding after it changes nothing."""
    torch.manual_seed(0)
    cfg = tiny_config(pad_id=22, bos_id=22, eos_id=0)
    model = Transformer(cfg).eval()
    src, tgt = random_batch(cfg, [5, 3], [4, 2])
    assert (tgt[:, 0] == cfg.pad_id).all()
    _, weights = model.forward_with_attention(src, tgt)
    for w in weights["decoder_self"]:  # [B, h, T, T]: every row attends to position 0
        assert (w[..., 0] > 0).all()
    logits = model(src, tgt)
    memory = model.encode(src)
    state = DecoderState()
    steps = [model.decode(tgt[:, t : t + 1], memory, src, state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1)[0], logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steps[0][1], logits[1, :1], atol=1e-5, rtol=1e-5)
    short = model(src[1:, :3], tgt[1:, :2])  # the second sentence without its padding
    torch.testing.assert_close(short[0], logits[1, :2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("output_bias", [False, True])
def test_projection_into_reused_memory_is_bit_identical(output_bias, blocked, monkeypatch):
    """A decoder may have the logits written into memory it reuses across steps (on a
    CPU that forms it so, from 16 rows on, blockwise as W x^T and transposed): exactly the
    logits of F.linear, whichever form the CPU takes."""
    monkeypatch.setattr(projection, "BLOCKED", blocked)
    torch.manual_seed(0)
    cfg = tiny_config(tgt_vocab_size=1000, src_vocab_size=1000, output_bias=output_bias)
    model = Transformer(cfg).eval()
    if output_bias:
        torch.nn.init.normal_(model.out_bias)
    work = torch.empty(300, cfg.tgt_vocab_size)
    with torch.inference_mode():
        for n in (1, 4, 16, 33, 256):
            x = torch.randn(n, cfg.d_model)
            out = torch.empty(n, cfg.tgt_vocab_size)
            got = model.project(x, out=out, work=work)
            assert got.data_ptr() == out.data_ptr()
            assert model.projection_buffers(x) == (2 if blocked and n >= 16 else 1)
            assert torch.equal(
                got, torch.nn.functional.linear(x, model.tgt_embed.weight, model.out_bias)
            )


def test_projection_given_buffers_with_autograd_on_is_differentiable():
    """out= and work= are offered for memory reuse; with autograd on they raised torch's
    "functions with out=... arguments don't support automatic differentiation"."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(tgt_vocab_size=100, src_vocab_size=100))
    x = torch.randn(20, model.cfg.d_model, requires_grad=True)
    out, work = torch.empty(20, 100), torch.empty(20, 100)
    logits = model.project(x, out=out, work=work)
    assert torch.equal(logits, torch.nn.functional.linear(x, model.tgt_embed.weight))
    logits.sum().backward()
    assert x.grad is not None and model.tgt_embed.weight.grad is not None


def test_refusals_are_whole_sentences(tiny_model):
    """The exact messages (a user reads them as they are): the ids' type and length, the
    first id out of range named over the last, every batch-size mismatch of decode with
    its grouping, and the decoder states that cannot be joined or are empty."""
    m, ok = tiny_model, torch.ones(2, 3, dtype=torch.long)

    def message(call) -> str:
        with pytest.raises(ValueError) as e:
            call()
        return str(e.value)

    assert message(lambda: m([[1, 2]], ok)) == ("src must be a torch.Tensor of token ids, got list")
    assert message(lambda: m(torch.ones(2, 65, dtype=torch.long), ok)) == (
        "src has length 65, longer than max_len=64"
    )
    m(torch.ones(2, 64, dtype=torch.long), ok)  # max_len itself fits
    low_and_high = torch.tensor([[0, 23, 4]])  # id 0 is fine; 23 is one past the vocabulary
    assert message(lambda: m.encode(low_and_high)) == (
        "src holds id 23, outside the vocabulary [0, 23)"
    )
    assert message(lambda: m.encode(torch.tensor([[-1, 30]]))) == (
        "src holds id -1, outside the vocabulary [0, 23)"
    )
    memory, tgt = m.encode(ok), torch.ones(4, 1, dtype=torch.long)
    assert message(lambda: m.decode(tgt, memory, ok)) == (
        "batch sizes differ: tgt_in (4, 1), memory (2, 3, 32), src (2, 3)"
    )
    assert message(lambda: m.decode(ok, memory[0], ok)) == (
        "memory must be the encoder output [batch, src_len, d_model=32], got (3, 32)"
    )
    assert message(lambda: m.decode(ok, memory, ok[:1])) == (
        "batch sizes differ: tgt_in (2, 3), memory (2, 3, 32), src (1, 3)"
    )
    grouped = m.start_state(memory, group=3)
    assert message(lambda: m.decode(tgt, memory, ok, grouped)) == (
        "batch sizes differ: tgt_in (4, 1), memory (2, 3, 32), src (2, 3) "
        "(3 target rows per source row)"
    )
    assert message(lambda: m.decode(ok, memory[:, :2], ok)) == (
        "memory covers 2 source positions but src has 3"
    )
    assert message(lambda: m.start_state(memory).join(m.start_state(memory, group=2))) == (
        "only states of one group size can be joined"
    )
    # A bare DecoderState (the tour's teacher forcing) is aligned, and zip() raised.
    assert message(lambda: m.start_state(memory).join(DecoderState())) == (
        "a state of 0 layers cannot join one of 2"
    )
    assert message(lambda: DecoderState(offset=2)._padding()) == (
        "an empty DecoderState (see Transformer.start_state)"
    )


def test_states_at_the_same_step_join_without_padding(tiny_model):
    """Rows that started together stay on the plain cached path when joined (no per-row
    positions, no key mask); rows of another step make the state padded."""
    src = torch.ones(2, 3, dtype=torch.long)
    memory = tiny_model.encode(src)
    a, b = tiny_model.start_state(memory), tiny_model.start_state(memory)
    a.join(b)
    assert a.positions is None and a.keys is None and a.offset == 0
    tiny_model.decode(
        torch.ones(4, 1, dtype=torch.long), memory.repeat(2, 1, 1), src.repeat(2, 1), a
    )
    a.join(tiny_model.start_state(memory))  # these rows are one step behind
    assert a.keys is not None and a.positions is not None
    assert a.positions.tolist() == [1, 1, 1, 1, 0, 0] and a.keys.tolist()[-1] == [False]


def test_every_config_field_reaches_its_module():
    """The fields for pretrained models land where they act: separate, unscaled target
    embeddings, learned positions with the configured dropout, the pre-LN stacks' final
    LayerNorm epsilon, and no output bias unless asked."""
    cfg = tiny_config(scale_embeddings=False, learned_positions=True, dropout=0.2, norm_first=True)
    cfg = TransformerConfig(**{**cfg.to_dict(), "layer_norm_eps": 1e-3})
    model = Transformer(cfg)
    assert model.tgt_embed is not model.src_embed and model.tgt_embed.scale is None
    for pos in (model.src_pos, model.tgt_pos):
        assert pos.learned is not None and pos.dropout.p == 0.2
    assert model.encoder.norm is not None and model.encoder.norm.eps == 1e-3
    assert model.decoder.norm is not None and model.decoder.norm.eps == 1e-3
    assert model.out_bias is None and "out_bias" not in model.state_dict()
    x = torch.randn(3, cfg.d_model)  # a plain 2-D projection, no buffers given
    torch.testing.assert_close(model.project(x), x @ model.tgt_embed.weight.t())


def test_a_state_may_not_step_past_max_len(tiny_model):
    """The positions a state has fed count against max_len (64 here): a state at 62 has
    room for 2 more, not 3, and says so (it said "tgt_in has length 3, longer than
    max_len=2", the room left taken for max_len); the other tgt_in checks stay as they
    were; and the batch-size refusals of forward and decode, word for word (a 2-D memory;
    two target rows per source row)."""
    src = torch.ones(2, 3, dtype=torch.long)
    memory = tiny_model.encode(src)
    state = tiny_model.start_state(memory)
    state.offset = 62  # as if 62 steps were fed (their keys are not needed to check this)
    with pytest.raises(ModelInputError) as e:
        tiny_model.decode(torch.ones(2, 3, dtype=torch.long), memory, src, state)
    assert str(e.value) == "the state holds 62 positions and tgt_in adds 3: past max_len=64"
    assert state.offset == 62  # refused before any step
    state = tiny_model.start_state(memory)
    state.offset = 1
    for tgt_in, message in (
        (torch.ones(2, 65, dtype=torch.long), "tgt_in has length 65, longer than max_len=64"),
        (torch.ones(2, 1), "tgt_in must be torch.long (int64) token ids, got dtype torch.float32"),
        (torch.ones(2, dtype=torch.long), "tgt_in must have shape [batch, length], got (2,)"),
    ):
        with pytest.raises(ModelInputError) as e:
            tiny_model.decode(tgt_in, memory, src, state)
        assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        tiny_model(src, torch.ones(3, 4, dtype=torch.long))  # rows, not lengths, differ
    assert str(e.value) == "batch sizes differ: src has 2 rows, tgt_in 3"
    with pytest.raises(ValueError) as e:
        tiny_model.decode(src, memory[:, 0], src)
    assert str(e.value) == (
        "memory must be the encoder output [batch, src_len, d_model=32], got (2, 32)"
    )
    with pytest.raises(ValueError) as e:
        tiny_model.decode(
            torch.ones(3, 1, dtype=torch.long), memory, src, tiny_model.start_state(memory, 2)
        )
    assert str(e.value).endswith("(2 target rows per source row)")


def test_stepping_a_real_state_past_max_len_says_how_far_it_went():
    """Step by step to max_len (4), then one more: the fifth step is refused naming the
    positions held, not "tgt_in has length 1, longer than max_len=0"."""
    model = Transformer(tiny_config(max_len=4)).eval()
    src = torch.tensor([[5, 6, 7]])
    memory = model.encode(src)
    state = model.start_state(memory)
    steps = [model.decode(torch.tensor([[5]]), memory, src, state) for _ in range(4)]
    torch.testing.assert_close(
        torch.cat(steps, 1), model(src, torch.tensor([[5, 5, 5, 5]])), atol=1e-5, rtol=1e-4
    )
    with pytest.raises(ModelInputError) as e:
        model.decode(torch.tensor([[5]]), memory, src, state)
    assert str(e.value) == "the state holds 4 positions and tgt_in adds 1: past max_len=4"


def test_the_cpu_vendor_chooses_the_projection_form(tmp_path):
    """The blocked W x^T projection is the form on AMD CPUs only (where it was measured
    faster); the vendor comes from /proc/cpuinfo's vendor_id, "" where it is not known."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert projection.cpu_vendor(str(info)) == "AuthenticAMD"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n")
    assert projection.cpu_vendor(str(info)) == "GenuineIntel"
    on_amd = projection.cpu_vendor() == "AuthenticAMD"
    assert projection.BLOCKED is on_amd
    assert isinstance(projection.cpu_vendor(str(tmp_path / "absent")), str)
