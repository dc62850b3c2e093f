"""Export a trained model to another inference runtime; for now CTranslate2.

``export_ctranslate2(model_dir, out_dir)`` writes a CTranslate2 Transformer model directory
(``model.bin``, ``config.json``, the vocabularies) plus ``spm.model``, the SentencePiece
model the checkpoint was trained with, so the folder is self-contained. CTranslate2 is an
optional dependency (``pip install ctranslate2``, or the ``export`` extra): importing this
module does not need it; exporting raises :class:`ExportError` naming the install command.

What the export guarantees (tests/test_export.py checks each against our model):

* The same function: every weight is mapped one to one (the fused W^Q|W^K|W^V of
  self-attention as CTranslate2's fused projection, encoder-decoder attention as W^Q and
  the fused W^K|W^V), post-LN or pre-LN as ``norm_first`` (pre-LN with the final
  LayerNorms), our LayerNorm epsilon, embeddings scaled by sqrt(d_model), our position
  table written out explicitly (the interleaved sin/cos of Section 3.5, or the learned
  one; CTranslate2's built-in table has another layout), shared embeddings and a tied
  output projection. In float32, CTranslate2's scores equal ours to float rounding.
* The FFN activation (relu, swish or gelu), unscaled embeddings and the output bias of
  pretrained Marian models are mapped too, so an imported or fine-tuned OPUS-MT model
  goes on to CTranslate2 as well.
* The vocabulary is the SentencePiece pieces in id order; CTranslate2's ``<s>`` (decoder
  start), ``</s>`` and ``<unk>`` are our ids 1, 2, 3. Sources get no BOS/EOS, as ours.
  Feed CTranslate2 the pieces of ``spm.model``: ``sp.encode(text, out_type=str)``.
  A Marian model's vocabularies are its ``vocab.json`` pieces in id order (source and
  target, when separate), its decoder starts from ``<pad>`` as ours does, and CTranslate2
  appends ``</s>`` to each source as its tokenizer does: feed it the pieces of
  ``source.spm`` (with a leading ``>>xx<<`` language token where the model has them).
  The folder holds the tokenizer's files (``spm.model``, or ``source.spm``,
  ``target.spm``, ``vocab.json``, ...).

Decoding differences (the model is the same; the search options are CTranslate2's):

* CTranslate2 does not forbid ``<pad>`` and ``<s>`` as outputs, which our decoders do,
  and by default forbids ``</s>`` as the first output, which ours allow: pass
  ``translate_batch(..., **MATCH_AIAYN)`` (``suppress_sequences=[["<pad>"], ["<s>"]]``,
  ``min_decoding_length=0``) to decode as ``aiayn`` does; for any model (a Marian one has
  no ``<s>``), ``**match_aiayn(tokenizer, cfg)``.
* Its ``length_penalty`` divides by length**penalty, not by GNMT's ((5 + length) / 6)**alpha
  used by ``aiayn`` (and it stops the search by another rule). With ``length_penalty=0``
  and our ``alpha=0`` both rank by total log-probability and the 1-best agrees; greedy
  (``beam_size=1``) agrees exactly. An output that reaches the length limit is the
  exception: our beam search ends it with EOS in its last slot (one token shorter, see
  :class:`aiayn.decode.DecodeOptions`), CTranslate2's fills every slot with tokens.
* Positions past the model's ``max_len`` do not exist. Our decoders stop there;
  CTranslate2 raises a RuntimeError ("No position encodings are defined for positions
  >= max_len"), so keep ``max_decoding_length`` <= max_len (and ``max_input_length``
  <= max_len, as our Translator truncates sources to max_len, a Marian source's EOS
  included).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.data.folders import busy, clear_leftovers, held_output, replaceable_folder, staged_folder
from aiayn.data.marian_tokenizer import MarianTokenizer
from aiayn.data.tokenizer import SPM_FILE
from aiayn.errors import AiaynError

if TYPE_CHECKING:
    from torch import Tensor

    from aiayn.data.tokenizer import Tokenizer
    from aiayn.model.transformer import Transformer

# Weight types CTranslate2 can store (its converters' --quantization choices).
CT2_QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)
# ctranslate2.Translator.translate_batch options that make it decode as aiayn's decoders.
MATCH_AIAYN: dict[str, Any] = {"suppress_sequences": [["<pad>"], ["<s>"]], "min_decoding_length": 0}
INSTALL_HINT = "pip install ctranslate2 (or pip install 'aiayn[export]')"


def match_aiayn(tokenizer: Tokenizer, cfg: Any) -> dict[str, Any]:
    """:data:`MATCH_AIAYN` for any model: the pieces of its pad and decoder-start ids (what
    our decoders never output) suppressed, an immediate EOS allowed."""
    banned = dict.fromkeys([tokenizer.id_to_piece(cfg.pad_id), tokenizer.id_to_piece(cfg.bos_id)])
    return {"suppress_sequences": [[p] for p in banned], "min_decoding_length": 0}


class ExportError(AiaynError):
    """An export that cannot be done as asked (missing package, output folder in the way)."""


class ExportExistsError(ExportError):
    """The output folder holds an earlier export, which is replaced only when forced."""


def _ctranslate2() -> Any:  # the module (untyped)
    try:
        import ctranslate2
        import ctranslate2.converters
        import ctranslate2.specs
    except ImportError:
        raise ExportError(f"CTranslate2 is not installed: {INSTALL_HINT}") from None
    return ctranslate2


def _t(tensor: Tensor) -> Tensor:
    """A detached, contiguous float32 CPU copy, as CTranslate2's spec expects."""
    return tensor.detach().float().cpu().contiguous().clone()


def _linear(spec: Any, weight: Tensor, bias: Tensor | None = None) -> None:
    spec.weight = _t(weight)
    if bias is not None:
        spec.bias = _t(bias)


def _layer_norm(spec: Any, norm: Any) -> None:
    spec.gamma, spec.beta = _t(norm.weight), _t(norm.bias)


def _attention(spec: Any, mha: Any, cross: bool, norm: Any) -> None:
    """Self-attention: linear[0] is the fused W^Q|W^K|W^V (our in_proj, same row order).
    Encoder-decoder attention: linear[0] is W^Q, linear[1] the fused W^K|W^V."""
    w, b, d = mha.in_proj.weight, mha.in_proj.bias, mha.d_model
    if cross:
        _linear(spec.linear[0], w[:d], b[:d])
        _linear(spec.linear[1], w[d:], b[d:])
    else:
        _linear(spec.linear[0], w, b)
    _linear(spec.linear[-1], mha.out_proj.weight, mha.out_proj.bias)
    _layer_norm(spec.layer_norm, norm)


def _ffn(spec: Any, ffn: Any, norm: Any) -> None:
    _linear(spec.linear_0, ffn.w_1.weight, ffn.w_1.bias)
    _linear(spec.linear_1, ffn.w_2.weight, ffn.w_2.bias)
    _layer_norm(spec.layer_norm, norm)


def _positions(pos: Any) -> Tensor:
    return _t(pos.learned if pos.learned is not None else pos.table)  # [max_len, d_model]


def build_spec(model: Transformer, tokenizer: Tokenizer) -> Any:
    """The ``ctranslate2.specs.TransformerSpec`` of ``model`` with its weights and vocabulary
    (not yet validated, optimized or saved; :func:`export_ctranslate2` does that)."""
    ct2 = _ctranslate2()
    cfg = model.cfg
    sizes = (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    if (cfg.src_vocab_size, cfg.tgt_vocab_size) != sizes:
        raise ExportError(
            f"model vocabulary ({cfg.src_vocab_size}, {cfg.tgt_vocab_size}) does not match "
            f"the tokenizer's {sizes} pieces"
        )
    if not cfg.encoder_layers:  # CTranslate2 loads its encoder from layer 0's weights
        raise ExportError("n_encoder_layers 0: CTranslate2's Transformer needs an encoder layer")
    activations = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}  # gelu: the exact one
    spec = ct2.specs.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_first,  # post-LN (the paper) otherwise: LN(x + sublayer(x))
        activation=getattr(ct2.specs.Activation, activations[cfg.activation]),
    )
    enc, dec = spec.encoder, spec.decoder
    # x * sqrt(d_model), Section 3.4 (unless a Marian model says otherwise)
    enc.scale_embeddings = dec.scale_embeddings = cfg.scale_embeddings
    enc.embeddings[0].weight = _t(model.src_embed.weight)
    dec.embeddings.weight = _t(model.tgt_embed.weight)
    enc.position_encodings.encodings = _positions(model.src_pos)
    dec.position_encodings.encodings = _positions(model.tgt_pos)
    for layer_spec, layer in zip(enc.layer, model.encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, False, layer.self_attn_norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_norm)
    for layer_spec, layer in zip(dec.layer, model.decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, False, layer.self_attn_norm)
        _attention(layer_spec.attention, layer.cross_attn, True, layer.cross_attn_norm)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_norm)
    if cfg.norm_first:  # pre-LN stacks end with a LayerNorm
        _layer_norm(enc.layer_norm, model.encoder.norm)
        _layer_norm(dec.layer_norm, model.decoder.norm)
    out = model.tgt_embed.weight if model.out_proj is None else model.out_proj.weight
    _linear(dec.projection, out, model.out_bias)  # tied or not; a bias in Marian models

    source = [tokenizer.id_to_piece(i, source=True) for i in range(cfg.src_vocab_size)]
    pieces = [tokenizer.id_to_piece(i) for i in range(cfg.tgt_vocab_size)]
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token = pieces[tokenizer.unk_id]
    spec.config.bos_token = pieces[cfg.bos_id]
    spec.config.eos_token = pieces[cfg.eos_id]
    spec.config.decoder_start_token = pieces[cfg.bos_id]  # our decoder starts from BOS
    spec.config.add_source_bos = False
    spec.config.add_source_eos = tokenizer.add_source_eos  # Marian's sources end with EOS
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    return spec


# What an export may hold: CTranslate2's files (one shared vocabulary or two) and either
# tokenizer's. --force replaces these from an earlier export even where the new one has none.
CT2_FILES = (
    "model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json",
    "target_vocabulary.json", SPM_FILE, *MarianTokenizer.FILES,
)  # fmt: skip


def export_ctranslate2(
    model_dir: str | Path,
    out_dir: str | Path,
    checkpoint: str = "auto",
    quantization: str = "float32",
    force: bool = False,
) -> Path:
    """Convert the checkpoint ``checkpoint`` (auto, best, last, averaged or a file) of
    ``model_dir`` into a CTranslate2 model directory ``out_dir``, weights stored as
    ``quantization``. ``force`` replaces an earlier export there (a folder holding
    ``model.bin``); any other non-empty folder is never overwritten, nor the model
    directory, a folder holding it or a training run, nor the current directory.
    Returns ``out_dir``."""
    ct2 = _ctranslate2()
    if quantization not in CT2_QUANTIZATIONS:
        raise ExportError(f"quantization {quantization!r}: choose one of {CT2_QUANTIZATIONS}")
    replaceable_folder(out_dir, model_dir)  # before anything is read or written
    out_dir = Path(out_dir)

    def check_replaceable() -> None:
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            if not (out_dir / "model.bin").is_file():
                raise ExportError(
                    f"{out_dir}: exists and is not an earlier export; choose another folder"
                )
            if not force:
                raise ExportExistsError(f"{out_dir}: already holds an export, kept unless forced")

    check_replaceable()
    model, tokenizer = load_model(resolve_checkpoint(model_dir, checkpoint), "cpu")

    Converter: Any = ct2.converters.Converter

    class AiaynConverter(Converter):
        def _load(self) -> Any:
            return build_spec(model, tokenizer)

    with held_output(out_dir, busy(out_dir)):
        clear_leftovers(out_dir)  # a killed export's: its moved-aside output put back
        check_replaceable()  # again: another export may have written it since
        with staged_folder(out_dir, replace=True, ours=CT2_FILES) as tmp:
            AiaynConverter().convert(str(tmp), quantization=quantization, force=True)
            tokenizer.save(tmp)  # spm.model, or a Marian model's source.spm, vocab.json, ...
    return out_dir
