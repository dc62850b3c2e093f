"""Training recipes: one dataclass of everything a run needs, read from YAML with
command-line overrides (``key=value``, ``model.d_model=512``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml

from aiayn.config import TransformerConfig
from aiayn.distributed import COLLECTIVE_TIMEOUT_MINUTES
from aiayn.errors import RecipeError

# The model fields a fine-tuning recipe may change: regularisation, which only training
# sees, and the length of a position table that is computed rather than learned.
FINE_TUNE_FIELDS = ("dropout", "attention_dropout", "activation_dropout", "max_len")
# The fields a recipe may leave unset (null) for the device to decide (step_settings): on
# CUDA bf16 autocast and a compiled step (1.56x eager on an H200, issue 43), with fused
# AdamW; elsewhere fp32 and eager, since compiling loses on a CPU (BENCHMARKS.md).
DEVICE_DEFAULTS = ("precision", "compile")


@dataclass
class Recipe:
    # Data: a directory from `aiayn prepare` or parallel text, one sentence per line, plain
    # or .gz (prepared into the run's data/ directory; the fields below apply to it).
    data: str = ""
    # A named data set instead of paths: NAME or NAME/SRC-TGT (multi30k, multi30k/en-de,
    # wmt14-en-de), read from the cache of `aiayn data get`, which fetches what it lacks.
    # Fills the train_* and valid_* fields left empty (fetched only when one is).
    dataset: str = ""
    train_src: str = ""  # training source text (or --train-src)
    train_tgt: str = ""  # training target text, line i translating train_src's line i
    valid_src: str = ""  # validation source text: loss and BLEU while training
    valid_tgt: str = ""  # validation target text (the BLEU references)
    max_len_words: int = 100  # longer training pairs are dropped (and counted)
    vocab_size: int = 8000  # joint SentencePiece vocabulary over source + target
    spm_model_type: str = "bpe"  # bpe | unigram (SentencePiece's model types)
    # Fine-tuning: a model directory (MODEL_DIR, or MODEL_DIR:CHECKPOINT with CHECKPOINT
    # auto|best|last|averaged|a file) to start from: its config, weights and tokenizer
    # (the data is encoded with it; vocab_size and spm_model_type are unused), with a fresh
    # optimizer and schedule. The model fields below may then only set dropout,
    # attention_dropout, activation_dropout and (sinusoidal positions) max_len; any other
    # field the recipe sets must equal the model's.
    init_from: str = ""
    # Model: any TransformerConfig field except vocabulary sizes and special ids.
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "d_model": 512,
            "n_heads": 8,
            "n_layers": 6,
            "d_ff": 2048,
            "dropout": 0.1,
            "share_embeddings": True,
            "tie_output": True,
            "max_len": 256,
        }
    )
    # Optimisation (Section 5.3, 5.4).
    max_tokens: int = 4096  # per batch, source or target side incl. padding (fairseq's)
    update_freq: int = 1  # accumulate gradients over this many batches per update
    label_smoothing: float = 0.1  # epsilon_ls of Section 5.4
    warmup: int = 4000  # warmup_steps of Eq. 3: updates of rising learning rate
    lr_scale: float = 1.0  # multiplies the Noam rate (and its peak, for every schedule)
    # noam (Eq. 3) | linear | cosine | noam_cooldown: the last three decay to 0 at the end
    # of the budget (max_steps or time_limit_minutes); see aiayn/train/schedule.py
    schedule: str = "noam"
    cooldown: float = 0.2  # noam_cooldown: the final fraction of the budget it decays over
    adam_betas: tuple[float, float] = (0.9, 0.98)  # Adam's beta1, beta2 (Section 5.3)
    adam_eps: float = 1e-9  # Adam's epsilon (Section 5.3)
    weight_decay: float = 0.0  # decoupled (AdamW) on the matrices; 0 = the paper's Adam
    clip_norm: float = 0.0  # 0 = no clipping
    max_epochs: int = 100  # stop after this many passes over the training data
    max_steps: int = 0  # 0 = no limit
    time_limit_minutes: float = 0.0  # 0 = no limit; stop cleanly (checkpoint) after this
    # Validation and checkpoints.
    valid_every_steps: int = 0  # 0 = at the end of every epoch
    valid_beam: int = 1  # beam for validation BLEU during training (1 = greedy, fast)
    save_every_steps: int = 500  # checkpoint_last.pt, for --resume mid-epoch
    save_every_minutes: float = 0.0  # 0 = off; else also checkpoint_stepNNNNNNN.pt this often
    keep_last: int = 5  # epoch (and timed) checkpoints kept, for averaging
    log_every: int = 10  # progress-bar refresh, in updates
    seed: int = 1  # the run's random seed (initialisation, batch order, dropout)
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    device: str = "auto"  # auto | cpu | cuda
    # Unset (null): the device's default, DEVICE_DEFAULTS; a value given always wins.
    precision: str | None = None  # fp32 | bf16 | fp16 (autocast; fp16 with a loss scale)
    compile: bool | None = None  # the training step through torch.compile (inductor)
    max_skipped_updates: int = 20  # stop after this many non-finite updates in a row
    # Several processes: a rank that waits longer than this in a collective (for a rank
    # that hangs or is gone) fails the job, naming the collective, instead of hanging it.
    collective_timeout_minutes: float = COLLECTIVE_TIMEOUT_MINUTES
    # The model fields this recipe sets (in its file or by an override), not defaults:
    # what a run with init_from checks against its model. Not a recipe field itself.
    given_model_fields: set[str] = field(default_factory=set, repr=False, compare=False)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> Recipe:
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"{path}: no such recipe file")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise RecipeError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise RecipeError(f"{path}: a recipe is a mapping of field: value")
        for key in ("data", "train_src", "train_tgt", "valid_src", "valid_tgt", "init_from"):
            value = data.get(key)  # relative paths are relative to the recipe file
            if isinstance(value, str) and value and not Path(value).is_absolute():
                data[key] = str((path.parent / value).resolve())
        return cls.from_dict(data, source=str(path)).override(overrides or [])

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "recipe") -> Recipe:
        known = {f.name for f in fields(cls)} - {"given_model_fields"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecipeError(f"{source}: unknown field(s): {', '.join(unknown)}")
        recipe = cls()
        for key, value in data.items():
            recipe._set(key, value, source)
        return recipe

    def override(self, items: list[str]) -> Recipe:
        """Apply ``key=value`` strings; values are parsed as YAML (numbers, booleans),
        except those of text fields (paths, names), which are taken as given: YAML would
        read ``dir:`` as a mapping and ``1e3`` as a number."""
        for item in items:
            if "=" not in item:
                raise RecipeError(f"override {item!r}: expected key=value")
            key, raw = item.split("=", 1)
            text = isinstance(getattr(type(self)(), key, None), str)  # a path or a name
            try:
                value = raw if text or not raw else yaml.safe_load(raw)
            except yaml.YAMLError:
                raise RecipeError(f"override {item!r}: the value is not valid YAML") from None
            if key.startswith("model."):
                self.model = {**self.model, key[len("model.") :]: value}
                self.given_model_fields.add(key[len("model.") :])
            else:
                if key not in {f.name for f in fields(self)} - {"given_model_fields"}:
                    raise RecipeError(f"override {item!r}: unknown field {key!r}")
                self._set(key, value, "override")
        return self

    def _set(self, key: str, value: Any, source: str) -> None:
        default = getattr(type(self)(), key)
        if key == "model":
            if not isinstance(value, dict):
                raise RecipeError(f"{source}: 'model' must be a mapping")
            self.given_model_fields.update(value)
            value = {**default, **value}
        elif key == "adam_betas":
            try:
                value = tuple(float(v) for v in value)
            except (TypeError, ValueError):
                raise RecipeError(f"{source}: 'adam_betas' must be two numbers") from None
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise RecipeError(f"{source}: field {key!r} must be true or false, got {value!r}")
        elif key in DEVICE_DEFAULTS:  # None: unset, the device decides
            kind = bool if key == "compile" else str
            if value is not None and not isinstance(value, kind):
                what = "true or false" if kind is bool else "a string"
                raise RecipeError(f"{source}: field {key!r} must be {what} or null, got {value!r}")
        elif default is None:
            pass
        elif isinstance(default, (int, float, str)):
            if isinstance(value, (dict, list)):  # str() would make a path of its repr
                wanted = type(default).__name__
                raise RecipeError(f"{source}: field {key!r} must be {wanted}, got {value!r}")
            try:
                value = type(default)(value)
            except (TypeError, ValueError):
                raise RecipeError(
                    f"{source}: field {key!r} must be {type(default).__name__}, got {value!r}"
                ) from None
        setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        del data["given_model_fields"]
        return data

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")


def step_settings(recipe: Recipe, device_type: str) -> dict[str, Any]:
    """The training step's ``precision`` and ``compile`` on ``device_type`` ("cuda",
    "cpu", ...): the recipe's where it gives them, else the device's default (see
    :data:`DEVICE_DEFAULTS`; fp32 on a GPU without bfloat16)."""
    cuda = device_type == "cuda"
    bf16 = cuda and torch.cuda.is_bf16_supported()
    return {
        "precision": recipe.precision
        if recipe.precision is not None
        else ("bf16" if bf16 else "fp32"),
        "compile": recipe.compile if recipe.compile is not None else cuda,
    }


def fine_tune_config(recipe: Recipe, source: TransformerConfig, origin: str) -> TransformerConfig:
    """The config of a run that starts from a model whose config is ``source`` (read from
    ``origin``): the source's, with the recipe's :data:`FINE_TUNE_FIELDS`. Any other model
    field the recipe sets must equal the source's: RecipeError naming it otherwise."""
    data = source.to_dict()
    for key in sorted(recipe.given_model_fields):
        value = recipe.model[key]
        if key not in data:
            raise RecipeError(f"recipe field model.{key}: not a model field")
        learned = key == "max_len" and source.learned_positions  # a table of trained weights
        if key in FINE_TUNE_FIELDS and not learned:
            data[key] = value
        elif value != data[key]:
            raise RecipeError(
                f"recipe field model.{key}={value!r} contradicts the model being fine-tuned "
                f"({origin} has {key}={data[key]!r}); leave it out of the recipe"
            )
    return TransformerConfig.from_dict(data)
