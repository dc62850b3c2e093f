"""`aiayn export marian`: an aiayn model directory -> a transformers MarianMTModel folder
that ``AutoModelForSeq2SeqLM.from_pretrained`` and ``MarianTokenizer.from_pretrained``
load with no aiayn code: ``model.safetensors``, ``config.json``, ``generation_config.json``
and the tokenizer files (``source.spm``, ``target.spm``, ``vocab.json``,
``tokenizer_config.json``).

A model aiayn trained itself has one joint SentencePiece model, whose ids are its ids: it
becomes both spm files and an identity ``vocab.json``. Two differences stay, both on the
transformers side: MarianTokenizer ends every source with EOS, which aiayn's own models
never saw in training (call it with ``add_special_tokens=False`` to give the model what
aiayn gives it), and it drops ``<unk>`` when decoding where SentencePiece writes " ⁇ ".
Imported (and fine-tuned) Marian models go back as they came, with their generation
settings.

What Marian cannot hold is refused with one line: pre-LN layers, learned positions, a
LayerNorm epsilon other than 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiayn.checkpoint import (
    generation_settings,
    load_checkpoint,
    model_from_state,
    resolve_checkpoint,
)
from aiayn.config import TransformerConfig
from aiayn.data.folders import (
    busy,
    clear_leftovers,
    held_output,
    new_file_mode,
    replaceable_folder,
    staged_folder,
)
from aiayn.data.marian_tokenizer import AIAYN_KEY, MarianTokenizer
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import ConversionError
from aiayn.marian.folder import CONFIG, GENERATION_CONFIG
from aiayn.marian.weights import config_to_marian, from_aiayn

WEIGHTS = "model.safetensors"
# What an export may hold (a model of separate vocabularies has target_vocab.json too):
# --force replaces these from an earlier export even where the new one has none.
EXPORT_FILES = (CONFIG, GENERATION_CONFIG, WEIGHTS, *MarianTokenizer.FILES)


class ExportExistsError(ConversionError):
    """The output folder holds an earlier export, which is replaced only when forced."""


def marian_tokenizer(tokenizer: Tokenizer, cfg: TransformerConfig) -> MarianTokenizer:
    """``tokenizer`` as a Marian tokenizer (itself if it is one): aiayn's joint
    SentencePiece model as both sides, with an identity vocabulary and no EOS appended."""
    if isinstance(tokenizer, MarianTokenizer):
        return tokenizer
    spm_bytes = tokenizer.to_bytes()
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    config: dict[str, Any] = {
        "eos_token": pieces[cfg.eos_id],
        "unk_token": pieces[tokenizer.unk_id],
        "pad_token": pieces[cfg.pad_id],
        "separate_vocabs": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_len,
        "tokenizer_class": "MarianTokenizer",
        AIAYN_KEY: {"add_source_eos": False, "decoder_start_id": cfg.bos_id},
    }
    if cfg.bos_id != cfg.pad_id:  # <s>: never an output, dropped when decoding
        config["bos_token"] = pieces[cfg.bos_id]
    return MarianTokenizer(spm_bytes, spm_bytes, {p: i for i, p in enumerate(pieces)}, None, config)


def generation_defaults(cfg: TransformerConfig) -> dict[str, Any]:
    """generation_config.json for a model aiayn trained: its special ids, its banned
    outputs (pad and BOS), beam 4 and at most max_len positions."""
    banned = [[cfg.pad_id]] + ([[cfg.bos_id]] if cfg.bos_id != cfg.pad_id else [])
    return {
        "decoder_start_token_id": cfg.bos_id,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "forced_eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "bad_words_ids": banned,
        "num_beams": 4,
        "max_length": cfg.max_len,
    }


def within_positions(generation: dict[str, Any], max_len: int) -> dict[str, Any]:
    """``generation`` with ``max_length`` cut to ``max_len + 1`` and ``max_new_tokens`` to
    ``max_len``: the longest output whose tokens fit the model's positions (what aiayn's
    decoders stop at). A model fine-tuned with a smaller ``max_len`` than it was imported
    with keeps the imported length, and ``generate()`` would run past its positions (an
    IndexError inside transformers) where aiayn stops."""
    limits = {"max_length": max_len + 1, "max_new_tokens": max_len}
    cut = {k: n for k, n in limits.items() if isinstance(generation.get(k), int)}
    return {**generation, **{k: min(generation[k], n) for k, n in cut.items()}}


def export_marian(
    model_dir: str | Path, out_dir: str | Path, checkpoint: str = "auto", force: bool = False
) -> Path:
    """Write the checkpoint ``checkpoint`` (auto, best, last, averaged or a file) of
    ``model_dir`` as a MarianMTModel folder ``out_dir``. ``force`` replaces an earlier
    export there: a folder that aiayn wrote (its config.json says so). Any other
    non-empty folder is never overwritten, nor is the folder the model was imported from
    (or the one a model it was fine-tuned from was), even if aiayn wrote it, nor the
    model directory, a folder holding it or a training run, nor the current directory.
    Returns ``out_dir``."""
    target = replaceable_folder(out_dir, model_dir)  # before anything is read or written
    out_dir = Path(out_dir)
    path = resolve_checkpoint(model_dir, checkpoint)
    state = load_checkpoint(path, map_location="cpu")
    for source in _origins(state.get("origin")):
        if target == source:
            raise ConversionError(
                f"{out_dir}: is the folder this model was imported from; choose another folder"
            )

    def check_replaceable() -> None:
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            if not _is_aiayn_export(out_dir):
                raise ConversionError(
                    f"{out_dir}: exists and is not an earlier aiayn export; choose another folder"
                )
            if not force:
                raise ExportExistsError(f"{out_dir}: already holds an export, kept unless forced")

    check_replaceable()
    model, tokenizer = model_from_state(state, path)
    try:  # refuses what Marian cannot hold, before writing
        config = config_to_marian(model.cfg)
    except ConversionError as e:
        raise ConversionError(f"{path}: {e}") from None
    config[AIAYN_KEY] = {"output_bias": model.cfg.output_bias}  # transformers ignores it
    tokenizer = marian_tokenizer(tokenizer, model.cfg)
    generation = within_positions(
        generation_settings(state) or generation_defaults(model.cfg), model.cfg.max_len
    )
    files = {CONFIG: config, GENERATION_CONFIG: generation}
    try:  # a damaged entry (a tensor among the settings) fails here, not half-written
        texts = {name: json.dumps(data, indent=2) + "\n" for name, data in files.items()}
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{path}: checkpoint entry 'generation': {e}") from None
    tensors = from_aiayn(model)

    from safetensors.torch import save_file

    with held_output(out_dir, busy(out_dir)):
        clear_leftovers(out_dir)  # a killed export's: its moved-aside output put back
        check_replaceable()  # again: another export may have written it since
        with staged_folder(out_dir, replace=True, ours=EXPORT_FILES) as tmp:
            try:
                save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
                (tmp / WEIGHTS).chmod(new_file_mode())  # safetensors makes it private (0600)
            except Exception as e:  # safetensors' own error type, a full disk among its causes
                raise ConversionError(f"{out_dir}: cannot write {WEIGHTS} ({e})") from None
            for name, text in texts.items():
                (tmp / name).write_text(text, encoding="utf-8")
            tokenizer.save(tmp)
    return out_dir


def _is_aiayn_export(path: Path) -> bool:
    """A Marian folder that :func:`export_marian` wrote (its config.json has aiayn's key)."""
    try:
        config = json.loads((path / CONFIG).read_text("utf-8"))
        return config.get("model_type") == "marian" and AIAYN_KEY in config
    except (OSError, ValueError, AttributeError):
        return False


def _origins(origin: Any) -> list[Path]:
    """The folders a model came from: the one it was imported from, through every model
    it was fine-tuned from (``origin`` as the checkpoint records it)."""
    found = []
    while isinstance(origin, dict):
        if origin.get("path"):
            found.append(Path(origin["path"]).resolve())
        origin = origin.get("origin")
    return found
