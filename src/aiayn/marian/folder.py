"""`aiayn import marian`: a local transformers MarianMTModel folder -> an aiayn model
directory (no network, no transformers needed).

The folder holds ``config.json``; the weights as ``model.safetensors`` or
``pytorch_model.bin`` (either possibly sharded with an ``.index.json``; fp16, bf16 or fp32);
``source.spm``, ``target.spm``, ``vocab.json`` (``target_vocab.json`` with separate
vocabularies) and ``tokenizer_config.json`` when present; ``generation_config.json`` when
present. Everything is read and checked before anything is written, and the model
directory is written into a temporary folder renamed into place at the end: a folder that
cannot be imported leaves nothing behind.

The model directory holds ``checkpoint_best.pt`` (model, config, tokenizer, the
generation settings and the origin: what every aiayn command loads, and all a translation
needs), the tokenizer's files (``source.spm``, ``target.spm``, ``vocab.json``, ...,
``tokenizer_config.json``) and ``generation_config.json`` (the model's generation
settings as published: ``num_beams``, ``max_length``, ``length_penalty``,
``bad_words_ids``, ...; taken from ``config.json`` when the folder has no
``generation_config.json``, as transformers does).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.checkpoint import BEST, finite, save_checkpoint
from aiayn.config import TransformerConfig
from aiayn.data.folders import busy, clear_leftovers, held_output, staged_folder
from aiayn.data.marian_tokenizer import (
    AIAYN_KEY,
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB,
    VOCAB,
    MarianTokenizer,
)
from aiayn.errors import ConversionError
from aiayn.marian.generation import NEUTRAL, check_generation
from aiayn.marian.weights import GENERATION_KEYS, config_from_marian, flag, to_aiayn
from aiayn.model.transformer import Transformer

CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
LAYER_WEIGHT = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.")
# Weights a Marian model holds that no MarianMTModel computes with: the sinusoidal position
# tables (recomputed) and the tables transformers does not use (the shared one beside
# untied tables, the copies of a tied one); final_logits_bias, when all zeros.
UNUSED = (
    "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight",
    "model.shared.weight", "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight", "lm_head.weight",
)  # fmt: skip


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ConversionError naming it otherwise."""
    if not path.is_file():
        raise ConversionError(f"{path}: missing")
    try:
        data = json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConversionError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: not a JSON object")
    return data


def _load_file(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated or damaged files fail anywhere in the readers
        raise ConversionError(
            f"{path}: cannot read the weights, the file is truncated or corrupt "
            f"({type(e).__name__})"
        ) from None
    if not isinstance(state, dict):
        raise ConversionError(f"{path}: not a state dict of named tensors")
    for key, value in state.items():  # a checkpoint of another kind: {"state_dict": {...}}
        if not isinstance(value, Tensor):
            got = type(value).__name__
            raise ConversionError(f"{path}: {str(key)[:80]!r} is not a tensor ({got})")
    return state


def read_weights(folder: Path) -> tuple[dict[str, Tensor], Path]:
    """Every weight of the folder (the floating-point ones as float32) and the file (or
    index) they came from."""
    for name in WEIGHT_FILES:
        path, index = folder / name, folder / f"{name}.index.json"
        if path.is_file():
            files = [path]
        elif index.is_file():  # sharded: the index maps each weight to its file
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ConversionError(f"{index}: no weight_map")
            if bad := [k for k, f in weight_map.items() if not (isinstance(f, str) and f)]:
                raise ConversionError(f"{index}: weight_map[{bad[0]!r}] is not a file name")
            files, path = [folder / f for f in sorted(set(weight_map.values()))], index
        else:
            continue
        tensors: dict[str, Tensor] = {}
        for file in files:
            if not file.is_file():
                raise ConversionError(f"{file}: missing (listed in {index.name})")
            tensors.update(_load_file(file))
        return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, path
    raise ConversionError(f"{folder}: no weights ({' or '.join(WEIGHT_FILES)})")


class MarianFolder:
    """A Marian model folder, read and checked: its config, weights, tokenizer and
    generation settings; ConversionError (or TokenizerError) naming the file otherwise."""

    def __init__(self, folder: str | Path):
        self.folder = folder = Path(folder)
        if not folder.is_dir():
            raise ConversionError(f"{folder}: no such folder")
        self.hf = read_json(folder / CONFIG)
        model_type = self.hf.get("model_type")
        if model_type != "marian":
            raise ConversionError(
                f"{folder / CONFIG}: model_type {model_type!r}; aiayn imports Marian models "
                "(model_type 'marian', MarianMTModel) only"
            )
        for name in (SOURCE_SPM, TARGET_SPM, VOCAB):
            if not (folder / name).is_file():
                raise ConversionError(f"{folder / name}: missing")
        self.tensors, self.weights_path = read_weights(folder)
        self._used: set[str] = set()  # the weights the model is made of
        self.tokenizer = MarianTokenizer.load_dir(folder)  # its start id set by _model
        self.model = self._model()
        self.generation = self._generation()

    def tensor(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise ConversionError(f"{self.weights_path}: no weight {name}")
        tensor = self.tensors[name]
        if not tensor.is_floating_point():  # copied into a float weight without a word
            raise ConversionError(
                f"{self.weights_path}: weight {name} holds {str(tensor.dtype).split('.')[-1]} "
                "values; a model's weights are floating point"
            )
        # What loading the imported model would refuse, found before it is written; each
        # weight once (the shared tables are asked for three times).
        if name not in self._used and not finite(tensor):
            raise ConversionError(f"{self.weights_path}: weight {name} holds NaN or infinity")
        self._used.add(name)
        return tensor

    def _first(self, *names: str) -> Tensor:
        for name in names:
            if name in self.tensors:
                return self.tensor(name)
        return self.tensor(names[0])  # names the first one as missing

    def _embeddings(self) -> tuple[dict[str, Tensor], bool, bool]:
        """The source and target tables, output projection and bias as transformers 5
        uses them, and whether aiayn shares the tables and ties the output. Shared and
        tied (the OPUS-MT default), all three are ``model.shared.weight``; otherwise
        transformers ties none of them to it, and the encoder's and decoder's own tables
        are used, the decoder's as output when tied."""
        where = str(self.folder / CONFIG)
        share = flag(self.hf, "share_encoder_decoder_embeddings", True, where)
        tie = flag(self.hf, "tie_word_embeddings", True, where)
        shared, enc, dec = (
            f"model.{k}" for k in ("shared", "encoder.embed_tokens", "decoder.embed_tokens")
        )
        if share and tie:
            source = target = output = self._first(
                f"{shared}.weight", f"{enc}.weight", f"{dec}.weight"
            )
        else:
            source = self._first(f"{enc}.weight", *([f"{shared}.weight"] if share else []))
            target = self._first(f"{dec}.weight", *([f"{shared}.weight"] if share else []))
            output = target if tie else self.tensor("lm_head.weight")
        same = source.shape == target.shape and torch.equal(source, target)
        bias = torch.zeros(output.size(0))
        if "final_logits_bias" in self.tensors:
            bias = self.tensor("final_logits_bias").flatten()
        tables = {"source": source, "target": target, "output": output, "bias": bias}
        # A copy of a tied table that differs from it: transformers 5 unties it then, and
        # computes with the copy, where aiayn would drop it.
        copies = {f"{enc}.weight": "source", f"{dec}.weight": "target", "lm_head.weight": "output"}
        for name, role in copies.items():
            if name in self.tensors and name not in self._used:
                copy, table = self.tensor(name), tables[role]
                if not (copy.shape == table.shape and torch.equal(copy, table)):
                    used = next((k for k in self._used if self.tensors[k] is table), role)
                    raise ConversionError(
                        f"{self.weights_path}: {name} differs from {used}, which {CONFIG} ties "
                        f"it to: transformers would compute with both, aiayn with {used} only"
                    )
        return tables, share and same, tie

    def _model(self) -> Transformer:
        tables, shared, tied = self._embeddings()
        tok = self.tokenizer
        rows = {"source": tables["source"].size(0), "target": tables["target"].size(0)}
        sizes = {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size}
        for side in ("source", "target"):
            if sizes[side] != rows[side]:
                name = TARGET_VOCAB if side == "target" and tok.separate_vocabs else VOCAB
                raise ConversionError(
                    f"{self.folder / name}: {sizes[side]} pieces, but the model's {side} "
                    f"embedding has {rows[side]} rows"
                )
        ours = self.hf.get(AIAYN_KEY) or {}  # written by aiayn's export
        output_bias = bool(ours.get("output_bias", bool(tables["bias"].any())))
        cfg = config_from_marian(self.hf, shared, tied, output_bias, str(self.folder / CONFIG))
        target = "decoder_vocab_size" if self.hf.get("decoder_vocab_size") else "vocab_size"
        expect = {
            "source": ((cfg.src_vocab_size, cfg.d_model), "vocab_size and d_model"),
            "target": ((cfg.tgt_vocab_size, cfg.d_model), f"{target} and d_model"),
            "output": ((cfg.tgt_vocab_size, cfg.d_model), f"{target} and d_model"),
            "bias": ((cfg.tgt_vocab_size,), target),
        }
        for role, (shape, fields) in expect.items():
            if tuple(tables[role].shape) != shape:
                raise ConversionError(
                    f"{self.weights_path}: the {role} embedding has shape "
                    f"{tuple(tables[role].shape)}, {CONFIG}'s {fields} make it {shape}"
                )
        for name, field in (("pad_id", "pad_token_id"), ("eos_id", "eos_token_id")):
            if getattr(tok, name) != getattr(cfg, name):
                raise ConversionError(
                    f"{self.folder / VOCAB}: the tokenizer's {name} is {getattr(tok, name)}, "
                    f"{CONFIG}'s {field} is {getattr(cfg, name)}"
                )
        if AIAYN_KEY not in tok.config:  # transformers' Marian: EOS ends every source
            files = {**tok.files(), **_aiayn_settings(tok, True, cfg.bos_id)}
            self.tokenizer = MarianTokenizer.from_files(files)
        elif tok.bos_id != cfg.bos_id:
            raise ConversionError(
                f"{self.folder / 'tokenizer_config.json'}: decoder start {tok.bos_id}, "
                f"{CONFIG}'s decoder_start_token_id is {cfg.bos_id}"
            )
        model = Transformer(cfg)
        try:
            to_aiayn(model, self.tensor, tables, str(self.weights_path))
        except RuntimeError as e:  # a tensor of the wrong shape
            first = str(e).strip().splitlines()[0]
            raise ConversionError(
                f"{self.weights_path}: a weight has the wrong shape ({first})"
            ) from None
        self._check_unused(cfg, output_bias)
        return model

    def _check_unused(self, cfg: TransformerConfig, output_bias: bool) -> None:
        """ConversionError naming the weights the model was not made of, unless no
        MarianMTModel computes with them (:data:`UNUSED`): dropped, they would change the
        model's outputs without a word (transformers lists them as unexpected)."""
        bias = self.tensors.get("final_logits_bias")
        if not output_bias and bias is not None and bias.any():  # aiayn's own key said so
            raise ConversionError(
                f"{self.weights_path}: final_logits_bias is not all zeros, but {CONFIG}'s "
                f"{AIAYN_KEY}.output_bias is false: the model would lose its output bias"
            )
        names = sorted(set(self.tensors) - self._used - {*UNUSED, "final_logits_bias"})
        counts = {"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers}
        layers = [k for k in names if (m := LAYER_WEIGHT.match(k)) and int(m[2]) >= counts[m[1]]]
        if layers:  # a config.json that does not describe these weights
            raise ConversionError(
                f"{self.weights_path}: {len(layers)} layer weights that {CONFIG} leaves out "
                f"({layers[0]}, ...): it gives {cfg.encoder_layers} encoder and "
                f"{cfg.decoder_layers} decoder layers"
            )
        if names:
            listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if names[3:] else "")
            what, them = ("weights", "them") if names[1:] else ("weight", "it")
            raise ConversionError(
                f"{self.weights_path}: {len(names)} {what} that aiayn's model (and a "
                f"MarianMTModel) has no place for: {listed}; importing would drop {them} and "
                "change the model's outputs"
            )

    def _generation(self) -> dict[str, Any]:
        """The folder's generation settings, refused (naming the file and field) where
        aiayn would decode otherwise than generate() with them."""
        path = self.folder / GENERATION_CONFIG
        if path.is_file():
            settings = read_json(path)
        else:  # as transformers does: the generation settings config.json holds
            path = self.folder / CONFIG
            keys = dict.fromkeys([*GENERATION_KEYS, *NEUTRAL])
            found = {k: self.hf[k] for k in keys if self.hf.get(k) is not None}
            settings = {"_from_model_config": True, **found}
        check_generation(settings, self.model.cfg, str(path))
        return settings

    def origin(self) -> dict[str, Any]:
        return {
            "format": "marian",
            "path": str(self.folder.resolve()),
            "weights": self.weights_path.name,
            "transformers_version": self.hf.get("transformers_version"),
        }


def _aiayn_settings(tokenizer: MarianTokenizer, add_source_eos: bool, start: int) -> dict:
    """The tokenizer_config.json of ``tokenizer`` with aiayn's settings set."""
    config = {
        **tokenizer.config,
        AIAYN_KEY: {"add_source_eos": add_source_eos, "decoder_start_id": int(start)},
    }
    return {"tokenizer_config.json": json.dumps(config).encode("utf-8")}


def import_marian(folder: str | Path, out_dir: str | Path) -> Path:
    """Convert the Marian model folder ``folder`` into the aiayn model directory
    ``out_dir`` (which must not exist, or be empty). Returns ``out_dir``."""
    out_dir = Path(out_dir)

    def check_new() -> None:
        if out_dir.exists() and not out_dir.is_dir():
            raise ConversionError(f"{out_dir}: is a file, not a folder; choose a new folder")
        if out_dir.is_dir() and any(out_dir.iterdir()):
            raise ConversionError(f"{out_dir}: exists and is not empty; choose another folder")

    check_new()
    source = MarianFolder(folder)  # reads and checks everything before writing
    state = {
        "model": source.model.state_dict(),
        "config": source.model.cfg.to_dict(),
        "tokenizer": source.tokenizer.to_bytes(),
        "generation": source.generation,
        "origin": source.origin(),
        "step": 0,
        "epoch": 0,
    }
    with held_output(out_dir, busy(out_dir)):
        clear_leftovers(out_dir)  # what a killed import staged
        check_new()  # again: another import may have written it since
        with staged_folder(out_dir) as tmp:
            save_checkpoint(state, tmp / BEST)
            source.tokenizer.save(tmp)
            text = json.dumps(source.generation, indent=2, sort_keys=True) + "\n"
            (tmp / GENERATION_CONFIG).write_text(text, encoding="utf-8")
    return out_dir
