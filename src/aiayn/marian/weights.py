"""Marian (transformers' MarianMTModel) <-> aiayn: the config fields and the weights.

The two are the same model (the paper's post-LN Transformer with sinusoidal positions)
but for the layout of the positions: aiayn interleaves them as Section 3.5 writes them
(PE[:, 2i] = sin, PE[:, 2i+1] = cos), Marian puts every sin in the first half of d_model
and every cos in the second. A fixed permutation of the d_model axis maps one onto the
other exactly, :func:`marian_order`. Applied to every weight that reads or writes the
model's d_model-wide vectors (embeddings, the projections' input columns or output rows,
LayerNorm scales and shifts), it turns one model into the other: every hidden vector of
the one is the permuted hidden vector of the other, attention scores and logits are
unchanged (LayerNorm, dot products and sums do not depend on the order of their terms)
and no second positional encoding is needed.

Marian keeps W^Q, W^K and W^V as three matrices (q_proj, k_proj, v_proj); aiayn fuses them
into one ``in_proj`` in that row order. Its FFN is fc1/fc2, its output bias
``final_logits_bias [1, V]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from aiayn.config import TransformerConfig
from aiayn.errors import ConversionError
from aiayn.model.transformer import Transformer

# transformers' activation_function names -> TransformerConfig.activation
ACTIVATIONS = {
    "relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu", "gelu_python": "gelu",
}  # fmt: skip
LAYER_NORM_EPS = 1e-5  # Marian's LayerNorm (torch's default); aiayn's too
# Generation settings a config.json may hold (older OPUS-MT folders have no
# generation_config.json): kept as transformers reads them, see folder.generation_settings.
GENERATION_KEYS = (
    "max_length", "max_new_tokens", "min_length", "num_beams", "num_return_sequences",
    "length_penalty", "early_stopping", "no_repeat_ngram_size", "repetition_penalty",
    "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "decoder_start_token_id",
    "bos_token_id", "eos_token_id", "pad_token_id", "do_sample", "temperature", "top_k", "top_p",
)  # fmt: skip


def marian_order(d_model: int) -> Tensor:
    """``perm [d_model]`` with ``marian[..., j] = aiayn[..., perm[j]]``: the sin columns
    of aiayn's table (0, 2, 4, ...) first, then its cos columns (1, 3, 5, ...)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# -- config ----------------------------------------------------------------------------------
def config_from_marian(
    hf: dict[str, Any], shared: bool, tied: bool, output_bias: bool, where: str
) -> TransformerConfig:
    """The TransformerConfig of a Marian ``config.json`` (``hf``, read from ``where``);
    ``shared``, ``tied`` and ``output_bias`` say what its weights hold. ConversionError
    naming the field for what aiayn's model cannot express."""

    def get(key: str, default: Any = None) -> Any:
        value = hf.get(key, default)
        if value is None:
            raise ConversionError(f"{where}: no {key}")
        return value

    def number(key: str, default: float) -> float:
        value = get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConversionError(f"{where}: {key} must be a number, got {value!r}")
        return float(value)

    def same(a: str, b: str) -> Any:
        if get(a) != get(b):
            raise ConversionError(
                f"{where}: {a}={hf[a]} but {b}={hf[b]}; aiayn's encoder and decoder share it"
            )
        return hf[a]

    activation = get("activation_function", "gelu")  # MarianConfig's default
    if activation not in ACTIVATIONS:
        raise ConversionError(
            f"{where}: activation_function {activation!r} is not supported (choose from "
            f"{', '.join(ACTIVATIONS)})"
        )
    eos = get("eos_token_id", 0)
    if isinstance(eos, list):
        if len(eos) != 1:
            raise ConversionError(f"{where}: eos_token_id {eos}: aiayn stops at one EOS id")
        eos = eos[0]
    pad = get("pad_token_id", 58100)
    vocab = get("vocab_size", 58101)
    layers = (get("encoder_layers", 12), get("decoder_layers", 12))
    try:
        return TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=hf.get("decoder_vocab_size") or vocab,
            d_model=get("d_model", 1024),
            n_heads=same("encoder_attention_heads", "decoder_attention_heads"),
            n_layers=layers[0],
            n_decoder_layers=layers[1] if layers[1] != layers[0] else None,
            d_ff=same("encoder_ffn_dim", "decoder_ffn_dim"),
            dropout=number("dropout", 0.1),
            attention_dropout=number("attention_dropout", 0.0),
            activation_dropout=number("activation_dropout", 0.0),
            max_len=get("max_position_embeddings", 1024),
            pad_id=pad,
            bos_id=get("decoder_start_token_id", pad),  # decoding starts from it (pad)
            eos_id=eos,
            share_embeddings=shared,
            tie_output=tied,
            layer_norm_eps=LAYER_NORM_EPS,
            activation=ACTIVATIONS[activation],
            output_bias=output_bias,
            scale_embeddings=bool(hf.get("scale_embedding", False)),
        )
    except (TypeError, ValueError) as e:  # ConfigError names the TransformerConfig field
        raise ConversionError(f"{where}: {e}") from None


def config_to_marian(cfg: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` of transformers' MarianMTModel for ``cfg``; ConversionError
    (one line) for what Marian cannot hold."""
    if cfg.norm_first:
        raise ConversionError("norm_first: Marian models are post-LN; this model is pre-LN")
    if cfg.learned_positions:
        raise ConversionError(
            "learned_positions: Marian's positions are sinusoidal; this model learned its own"
        )
    if cfg.layer_norm_eps != LAYER_NORM_EPS:
        raise ConversionError(
            f"layer_norm_eps: Marian's LayerNorm epsilon is 1e-5, not {cfg.layer_norm_eps}"
        )
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": cfg.src_vocab_size,
        "decoder_vocab_size": cfg.tgt_vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "activation_function": cfg.activation,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "max_position_embeddings": cfg.max_len,
        "scale_embedding": cfg.scale_embeddings,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "forced_eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id,
        "share_encoder_decoder_embeddings": cfg.share_embeddings,
        "tie_word_embeddings": cfg.tie_output,
        "is_encoder_decoder": True,
        "dtype": "float32",
    }


# -- weights ---------------------------------------------------------------------------------
def _layer_pairs(kind: str, i: int) -> list[tuple[str, str, str]]:
    """(aiayn name, Marian name, what its d_model axes are) for the weights of layer ``i``
    of ``kind`` (encoder or decoder) other than the fused attention inputs. The axis code:
    "in" permutes columns, "out" rows (and the bias), "vec" a d_model vector."""
    a, m = f"{kind}.layers.{i}.", f"model.{kind}.layers.{i}."
    attn = [("self_attn", "self_attn", "self_attn_norm", "self_attn_layer_norm")]
    if kind == "decoder":
        attn.append(("cross_attn", "encoder_attn", "cross_attn_norm", "encoder_attn_layer_norm"))
    pairs = []
    for ours, theirs, our_norm, their_norm in attn:
        pairs += [
            (f"{a}{ours}.out_proj.weight", f"{m}{theirs}.out_proj.weight", "out"),
            (f"{a}{ours}.out_proj.bias", f"{m}{theirs}.out_proj.bias", "vec"),
            (f"{a}{our_norm}.weight", f"{m}{their_norm}.weight", "vec"),
            (f"{a}{our_norm}.bias", f"{m}{their_norm}.bias", "vec"),
        ]
    return [
        *pairs,
        (f"{a}ffn.w_1.weight", f"{m}fc1.weight", "in"),
        (f"{a}ffn.w_1.bias", f"{m}fc1.bias", "none"),
        (f"{a}ffn.w_2.weight", f"{m}fc2.weight", "out"),
        (f"{a}ffn.w_2.bias", f"{m}fc2.bias", "vec"),
        (f"{a}ffn_norm.weight", f"{m}final_layer_norm.weight", "vec"),
        (f"{a}ffn_norm.bias", f"{m}final_layer_norm.bias", "vec"),
    ]


def _attention_inputs(cfg: TransformerConfig) -> list[tuple[str, str]]:
    """(aiayn in_proj prefix, Marian attention prefix) of every attention block."""
    out = []
    for kind, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            blocks = [("self_attn", "self_attn")]
            if kind == "decoder":
                blocks.append(("cross_attn", "encoder_attn"))
            for ours, theirs in blocks:
                out.append(
                    (f"{kind}.layers.{i}.{ours}.in_proj", f"model.{kind}.layers.{i}.{theirs}")
                )
    return out


def _permute(t: Tensor, axis: str, order: Tensor) -> Tensor:
    if axis == "in":
        return t[:, order]
    if axis in ("out", "vec"):
        return t[order]
    return t


def to_aiayn(
    model: Transformer,
    tensors: Callable[[str], Tensor],
    embeddings: dict[str, Tensor],
    where: str,
) -> None:
    """Fill ``model`` (built from the converted config) with Marian's weights:
    ``tensors(name)`` gives each Marian weight (float32), ``embeddings`` the source and
    target tables and the output projection ("source", "target", "output") and, with an
    output bias, "bias" ``[V]``. ConversionError naming ``where`` (the weights' file) for a
    weight of the wrong shape."""
    d = model.cfg.d_model
    order = torch.argsort(marian_order(d))  # aiayn[..., k] = marian[..., order[k]]
    ours = model.state_dict(keep_vars=True)

    def shaped(name: str, *shape: int) -> Tensor:
        """Marian's weight ``name``, refused (naming it) unless it has ``shape``."""
        t = tensors(name)
        if tuple(t.shape) != shape:
            raise ConversionError(
                f"{where}: weight {name} has shape {tuple(t.shape)}, the config makes it {shape}"
            )
        return t

    with torch.no_grad():
        model.src_embed.weight.copy_(embeddings["source"][:, order])
        if not model.cfg.share_embeddings:
            model.tgt_embed.weight.copy_(embeddings["target"][:, order])
        if model.out_proj is not None:
            model.out_proj.weight.copy_(embeddings["output"][:, order])
        if model.out_bias is not None:
            model.out_bias.copy_(embeddings["bias"])
        for kind, n in (
            ("encoder", model.cfg.encoder_layers),
            ("decoder", model.cfg.decoder_layers),
        ):
            for i in range(n):
                for a, m, axis in _layer_pairs(kind, i):
                    ours[a].copy_(_permute(shaped(m, *ours[a].shape), axis, order))
        for a, m in _attention_inputs(model.cfg):
            weight = torch.cat([shaped(f"{m}.{p}_proj.weight", d, d) for p in "qkv"])  # [3d, d]
            ours[f"{a}.weight"].copy_(weight[:, order])
            ours[f"{a}.bias"].copy_(torch.cat([shaped(f"{m}.{p}_proj.bias", d) for p in "qkv"]))


def from_aiayn(model: Transformer) -> dict[str, Tensor]:
    """MarianMTModel's weights (float32, contiguous, each its own tensor) for ``model``,
    named as transformers 5 saves them: ``model.shared.weight`` when the tables are shared,
    the encoder's and decoder's own ``embed_tokens`` otherwise (and whenever the output is
    untied, when transformers no longer ties them to the shared one), ``lm_head.weight``
    when untied, ``final_logits_bias``."""
    cfg, d = model.cfg, model.cfg.d_model
    order = marian_order(d)
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out: dict[str, Tensor] = {}
    source = model.src_embed.weight.detach().float().cpu()[:, order]
    target = model.tgt_embed.weight.detach().float().cpu()[:, order]
    if cfg.share_embeddings:
        out["model.shared.weight"] = source
    if not (cfg.share_embeddings and cfg.tie_output):
        out["model.encoder.embed_tokens.weight"] = source
        out["model.decoder.embed_tokens.weight"] = target
    if not cfg.tie_output:
        out["lm_head.weight"] = ours["out_proj.weight"][:, order]
    bias = ours.get("out_bias", torch.zeros(cfg.tgt_vocab_size))
    out["final_logits_bias"] = bias[None, :]
    for kind, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            for a, m, axis in _layer_pairs(kind, i):
                out[m] = _permute(ours[a], axis, order)
    for a, m in _attention_inputs(cfg):
        weights = ours[f"{a}.weight"][:, order].chunk(3)
        biases = ours[f"{a}.bias"].chunk(3)
        for p, w, b in zip("qkv", weights, biases):
            out[f"{m}.{p}_proj.weight"], out[f"{m}.{p}_proj.bias"] = w, b
    return {k: v.contiguous().clone() for k, v in out.items()}
