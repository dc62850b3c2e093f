"""int8 dynamic quantization: really int8, and translating (almost) as the float model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.cli import main
from aiayn.data.batching import pad
from aiayn.model import CrossAttentionCache, MultiHeadAttention
from aiayn.quantize import (
    SplitCrossAttention,
    is_quantized,
    parameter_count,
    quantize_dynamic_int8,
)
from aiayn.translator import Translator
from numerics_util import log_probs, margins_and_shift
from sample_data import PAIRS

SOURCES = [s for s, _ in PAIRS]  # 60 seen in training, 10 never seen
REFERENCES = [t for _, t in PAIRS]


def test_split_cross_attention_changes_no_result():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).eval()
    with torch.no_grad():
        mha.in_proj.bias.normal_()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    split = SplitCrossAttention(mha).eval()
    with torch.no_grad():
        before, after = mha(x, memory)[0], split(x, memory)[0]
        cache = CrossAttentionCache(*split.memory_kv(memory))  # through the split layers
        cached = split(x[:, :1], memory, cache=cache)[0]
    assert not hasattr(split, "in_proj") and hasattr(mha, "in_proj")  # the original is kept
    assert {"q_proj.weight", "kv_proj.weight"} <= set(split.state_dict())
    assert set(mha.state_dict()) == {
        f"{p}_proj.{w}" for p in ("in", "out") for w in ("weight", "bias")
    }
    torch.testing.assert_close(before, after, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cached, before[:, :1], atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module")
def models(sample_model_dir):
    model, tokenizer = load_model(resolve_checkpoint(sample_model_dir(False)))
    return model, quantize_dynamic_int8(model), tokenizer


def test_every_linear_layer_is_int8_and_the_float_model_is_untouched(models):
    model, quantized, _ = models
    float_linears = sum(type(m) is nn.Linear for m in model.modules())
    int8 = [m for m in quantized.modules() if isinstance(m, DynamicQuantizedLinear)]
    # One more per decoder layer (encoder-decoder W^Q split from W^K|W^V) and one for the
    # tied output projection, which gets its own int8 copy of the target embedding.
    assert len(int8) == float_linears + model.cfg.decoder_layers + 1
    assert is_quantized(quantized) and not is_quantized(model)
    assert all(m.weight().dtype == torch.qint8 for m in int8)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert "decoder.layers.0.cross_attn.in_proj.weight" in model.state_dict()  # loads as before
    assert model.out_proj is None and quantized.out_proj is not None


def test_a_quantized_model_counts_the_parameters_of_the_float_model(models):
    # Its int8 layers hold their weights packed, not as parameters: the server's /info
    # said 11,520 parameters of 177,664 (the embeddings and LayerNorms alone).
    from aiayn.config import TransformerConfig
    from aiayn.model.transformer import Transformer

    model, quantized, tokenizer = models
    assert parameter_count(quantized) == parameter_count(model) == model.num_parameters()
    assert quantized.num_parameters() < model.num_parameters() / 2  # the packed ones left out
    cfg = TransformerConfig(
        src_vocab_size=50, tgt_vocab_size=60, d_model=16, n_heads=2, d_ff=32, n_layers=1,
        share_embeddings=False, tie_output=False, output_bias=True,
    )  # fmt: skip
    untied = Transformer(cfg)
    assert parameter_count(quantize_dynamic_int8(untied)) == untied.num_parameters()
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from aiayn.serve import ServeConfig, create_app

    app = create_app(Translator(quantized, tokenizer), ServeConfig(worker="thread"))
    with TestClient(app) as client:
        assert client.get("/info").json()["model"]["parameters"] == model.num_parameters()


def test_quantized_model_scores_and_translates_like_the_float_model(models):
    model, quantized, tokenizer = models
    cfg = model.cfg
    tgt = [tokenizer.encode(t) for t in REFERENCES]
    src = pad([tokenizer.encode(s) for s in SOURCES], cfg.pad_id)
    tgt_in = pad([[cfg.bos_id, *t] for t in tgt], cfg.pad_id)
    real = tgt_in != cfg.pad_id
    with torch.inference_mode():
        logp = torch.log_softmax(model(src, tgt_in), -1)[real]
        logp_int8 = torch.log_softmax(quantized(src, tgt_in), -1)[real]
    assert not torch.equal(logp, logp_int8)  # the int8 kernels really ran
    # Per position, the probability mass that moves (total variation). int8 rounds each
    # weight to 1/127 of its tensor's largest and each activation to 1/255 of its range:
    # ~0.5% per matmul, compounding over the layers to a logit shift of ~0.3-0.5 nats at
    # most (measured: mean 0.0065, largest 0.099). A token-level bug in a minority of positions
    # (one layer or head skipped or misquantized) moves far more.
    moved = (logp.exp() - logp_int8.exp()).abs().sum(-1) / 2
    assert moved.mean() < 0.02 and moved.max() < 0.2
    # The argmax may change only where the float model's two best tokens are closer than
    # int8 can move them: at most twice the largest shift of a best token's log-prob.
    best = logp.argmax(-1, keepdim=True)
    shift = float((logp.gather(-1, best) - logp_int8.gather(-1, best)).abs().max())
    assert shift < 0.75  # measured 0.31 and 0.52 (two trainings of the sample model)
    top2 = logp.topk(2, -1).values
    flipped = logp.argmax(-1) != logp_int8.argmax(-1)
    assert (top2[flipped, 0] - top2[flipped, 1] < 2 * shift).all()

    # Translations: a sentence whose greedy path the float model wins at every step by more
    # than int8 moves the gap between its two best tokens translates the same; x1.5 because
    # int8 takes each activation's scale from the whole batch, and the Translator's batches
    # are not these. The 60 memorised pairs are all that safe; the 10 unseen may differ.
    narrowest, gap_shift = margins_and_shift(
        model, lambda s, t: log_probs(quantized, s, t), tokenizer, SOURCES
    )
    safe = [i for i, g in enumerate(narrowest) if g > 1.5 * gap_shift]
    assert len(safe) >= 60, (gap_shift, sorted(narrowest))
    float_translator, int8_translator = (
        Translator(model, tokenizer),
        Translator(quantized, tokenizer),
    )
    for beam in (1, 4):
        ours = float_translator.translate(SOURCES, beam=beam)
        int8 = int8_translator.translate(SOURCES, beam=beam)
        assert [i for i in safe if ours[i] != int8[i]] == []
        assert sum(t[0] == ref for t, ref in zip(int8[:60], REFERENCES)) >= 40


def test_cli_quantize_for_translate_and_evaluate(sample_model_dir, tmp_path, capsys):
    model_dir = sample_model_dir(False)
    src, ref = tmp_path / "in.de", tmp_path / "ref.en"
    src.write_text("".join(s + "\n" for s in SOURCES[:8]), encoding="utf-8")
    ref.write_text("".join(t + "\n" for t in REFERENCES[:8]), encoding="utf-8")
    common = ["--model", str(model_dir), "--quantize", "--quiet"]
    assert main(["translate", *common, str(src), "-o", str(tmp_path / "out.en")]) == 0
    assert len((tmp_path / "out.en").read_text(encoding="utf-8").splitlines()) == 8
    assert main(["evaluate", *common, "--src", str(src), "--ref", str(ref)]) == 0
    assert "BLEU" in capsys.readouterr().out
    assert main(["translate", *common, "--device", "cuda", str(src)]) == 2
    assert "CPU only" in capsys.readouterr().err
    translator = Translator.from_dir(model_dir, quantize=True)
    assert is_quantized(translator.model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_model_is_refused_at_once(dtype):
    """torch quantized it, and the first forward failed deep inside ('expected scalar type
    Float but found BFloat16')."""
    from aiayn import Transformer
    from aiayn.errors import AiaynError
    from conftest import tiny_config

    model = Transformer(tiny_config()).to(dtype)
    with pytest.raises(AiaynError, match=f"takes a float32 model, not {dtype}"):
        quantize_dynamic_int8(model)
