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

from aiayn.config import MAX_POSITIONS, TransformerConfig
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
# Fields of the BartConfig that transformers 3's MarianConfig was, with the values of every
# Marian model: another value describes a model that is not the post-LN Transformer with
# sinusoidal positions (transformers 4 and 5 ignore them and would compute otherwise).
MARIAN_ONLY = {
    "normalize_before": False,  # pre-LN
    "normalize_embedding": False,  # a LayerNorm on the embeddings (layernorm_embedding)
    "add_final_layer_norm": False,  # a LayerNorm after the last layer
    "static_position_embeddings": True,  # learned positions
}


def flag(hf: dict[str, Any], key: str, default: bool, where: str) -> bool:
    """The true/false field ``key`` of a Marian ``config.json`` (``hf``, read from
    ``where``); ConversionError naming the field for anything else ("false" is truthy)."""
    value = hf.get(key, default)
    if not isinstance(value, bool):
        raise ConversionError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def config_from_marian(
    hf: dict[str, Any], shared: bool, tied: bool, output_bias: bool, where: str
) -> TransformerConfig:
    """The TransformerConfig of a Marian ``config.json`` (``hf``, read from ``where``);
    ``shared``, ``tied`` and ``output_bias`` say what its weights hold. ConversionError
    naming the config.json field (not aiayn's) for what aiayn's model cannot express."""

    def get(key: str, default: Any = None) -> Any:
        value = hf.get(key, default)
        if value is None:
            raise ConversionError(f"{where}: no {key}")
        return value

    def number(key: str, default: float) -> float:
        value = get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConversionError(f"{where}: {key} must be a number, got {value!r}")
        if not 0.0 <= value < 1.0:  # the dropouts; NaN fails too
            raise ConversionError(f"{where}: {key} must be in [0, 1), got {value!r}")
        return float(value)

    def integer(key: str, default: int | None, low: int = 1, high: int | None = None) -> int:
        value = get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConversionError(f"{where}: {key} must be an integer, got {value!r}")
        if value < low or (high is not None and value > high):
            bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ConversionError(f"{where}: {key} must be {bounds}, got {value}")
        return value

    def same(a: str, b: str) -> int:
        value, other = integer(a, None), integer(b, None)
        if value != other:
            raise ConversionError(
                f"{where}: {a}={value} but {b}={other}; aiayn's encoder and decoder share it"
            )
        return value

    for key, marian in MARIAN_ONLY.items():
        if hf.get(key) is not None and flag(hf, key, marian, where) != marian:
            raise ConversionError(
                f"{where}: {key} {hf[key]!r}: Marian models have {str(marian).lower()}; "
                "aiayn imports the post-LN Transformer with sinusoidal positions only"
            )
    activation = get("activation_function", "gelu")  # MarianConfig's default
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ConversionError(
            f"{where}: activation_function {activation!r} is not supported (choose from "
            f"{', '.join(ACTIVATIONS)})"
        )
    eos_key = "eos_token_id"
    if isinstance(hf.get(eos_key), list):
        if len(hf[eos_key]) != 1:
            raise ConversionError(f"{where}: {eos_key} {hf[eos_key]}: aiayn stops at one EOS id")
        hf = {**hf, eos_key: hf[eos_key][0]}
    vocab = integer("vocab_size", 58101)
    # MarianConfig's rule: decoder_vocab_size or vocab_size (a 0 or null too)
    tgt_vocab = integer("decoder_vocab_size", None) if hf.get("decoder_vocab_size") else vocab
    if shared and tgt_vocab != vocab:
        raise ConversionError(
            f"{where}: vocab_size={vocab} but decoder_vocab_size={tgt_vocab}, and the weights "
            "share one embedding table"
        )
    d_model = integer("d_model", 1024)
    heads = same("encoder_attention_heads", "decoder_attention_heads")
    if d_model % heads:
        raise ConversionError(
            f"{where}: d_model={d_model} is not divisible by encoder_attention_heads={heads}"
        )
    last = min(vocab, tgt_vocab) - 1  # the special ids are in both vocabularies
    pad = integer("pad_token_id", 58100, low=0, high=last)
    start = integer("decoder_start_token_id", pad, low=0, high=last)  # (pad: Marian's)
    eos = integer(eos_key, 0, low=0, high=last)
    if eos in (pad, start):
        key = "decoder_start_token_id" if start == eos and start != pad else "pad_token_id"
        raise ConversionError(f"{where}: {key}={eos} is also {eos_key}; EOS needs its own id")
    layers = (integer("encoder_layers", 12), integer("decoder_layers", 12))
    fields: dict[str, Any] = dict(
        src_vocab_size=vocab,
        tgt_vocab_size=tgt_vocab,
        d_model=d_model,
        n_heads=heads,
        n_layers=layers[0],
        n_decoder_layers=layers[1] if layers[1] != layers[0] else None,
        d_ff=same("encoder_ffn_dim", "decoder_ffn_dim"),
        dropout=number("dropout", 0.1),
        attention_dropout=number("attention_dropout", 0.0),
        activation_dropout=number("activation_dropout", 0.0),
        max_len=integer("max_position_embeddings", 1024, high=MAX_POSITIONS),
        pad_id=pad,
        bos_id=start,
        eos_id=eos,
        share_embeddings=shared,
        tie_output=tied,
        layer_norm_eps=LAYER_NORM_EPS,
        activation=ACTIVATIONS[activation],
        output_bias=output_bias,
        scale_embeddings=flag(hf, "scale_embedding", False, where),
    )
    try:
        return TransformerConfig(**fields)
    except (TypeError, ValueError) as e:  # checked above; ConfigError names aiayn's field
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
