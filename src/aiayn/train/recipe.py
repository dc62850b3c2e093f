"""Training recipes: one dataclass of everything a run needs, read from YAML with
command-line overrides (``key=value``, ``model.d_model=512``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml

from aiayn.data.datasets import parse_spec
from aiayn.data.folders import replace_file
from aiayn.distributed import COLLECTIVE_TIMEOUT_MINUTES
from aiayn.errors import DownloadError, RecipeError
from aiayn.metrics.bleu import TOKENIZERS
from aiayn.train import recipe_values as values
from aiayn.train.schedule import SCHEDULES
from aiayn.train.update import PRECISIONS

# The model fields a fine-tuning recipe may change: regularisation, which only training
# sees, and the length of a position table that is computed rather than learned.
FINE_TUNE_FIELDS = ("dropout", "attention_dropout", "activation_dropout", "max_len")
# The fields a recipe may leave unset (null) for the device to decide (step_settings): on
# CUDA bf16 autocast and a compiled step (1.46x-1.78x eager per update on an H200, issue
# 43; its first batch compiles it, for a minute or two), with fused AdamW;
# elsewhere fp32 and eager, since compiling loses on a CPU (BENCHMARKS.md).
DEVICE_DEFAULTS = ("precision", "compile")

_AT_LEAST_0 = (lambda v: v >= 0, ">= 0")
_AT_LEAST_1 = (lambda v: v >= 1, ">= 1")
_ABOVE_0 = (lambda v: v > 0, "> 0")
_FRACTION = (lambda v: 0 <= v < 1, "in [0, 1)")
# What each number field accepts, as a test and in words. A field whose comment gives 0 a
# meaning (no limit, off, keep every length, none kept, torch's default) takes 0.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_len_words": _AT_LEAST_0,
    "vocab_size": _AT_LEAST_1,
    "max_tokens": _AT_LEAST_1,
    "update_freq": _AT_LEAST_1,
    "label_smoothing": _FRACTION,
    "warmup": _AT_LEAST_1,
    "lr_scale": _ABOVE_0,
    "cooldown": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "adam_eps": _ABOVE_0,  # 0 divides 0 by 0 for a parameter without gradient
    "weight_decay": _AT_LEAST_0,
    "clip_norm": _AT_LEAST_0,
    "max_epochs": _AT_LEAST_1,
    "max_steps": _AT_LEAST_0,
    "time_limit_minutes": _AT_LEAST_0,
    "valid_every_steps": _AT_LEAST_0,
    "valid_beam": _AT_LEAST_1,
    "save_every_steps": _AT_LEAST_0,
    "save_every_minutes": _AT_LEAST_0,
    "keep_last": _AT_LEAST_0,
    "log_every": _AT_LEAST_1,
    # torch takes 64-bit seeds; other ranks add their rank and step to it
    "seed": (lambda v: abs(v) < 2**62, "between -2**62 and 2**62"),
    # torch starts them all (100000 crashed it); aiayn serve --threads has the same bound
    "threads": (lambda v: 0 <= v <= 1024, "in 0..1024"),
    "max_skipped_updates": _AT_LEAST_1,
    # timedelta and gloo's millisecond timeouts overflow far above it (1e12: every job fails)
    "collective_timeout_minutes": (lambda v: 0 < v <= 1e6, "in (0, 1e6] (1e6: two years)"),
}
CHOICES = {"spm_model_type": ("bpe", "unigram"), "schedule": SCHEDULES,
           "precision": PRECISIONS, "valid_tokenize": tuple(TOKENIZERS)}  # fmt: skip
# The fields a resumed run takes from its checkpoint whatever the recipe says: Adam's
# settings, which loading the optimizer's state restores (the model is the checkpoint's too).
RESUME_FIXED = ("adam_betas", "adam_eps", "weight_decay")
# The fields that make a run's data and tokenizer, which a resumed run keeps as prepared.
PREPARED_FIXED = ("vocab_size", "spm_model_type", "max_len_words")
# A run's text files (its data, else named by data: a prepared directory, or dataset).
TEXT_FIELDS = ("train_src", "train_tgt", "valid_src", "valid_tgt")
# The model of a recipe that sets no model field: the paper's base model (Table 3). The
# fields a recipe sets are merged onto these, whether read from a file or given in code.
MODEL_DEFAULTS: dict[str, Any] = {
    "d_model": 512,
    "n_heads": 8,
    "n_layers": 6,
    "d_ff": 2048,
    "dropout": 0.1,
    "share_embeddings": True,
    "tie_output": True,
    "max_len": 256,
}


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
    # Model: any TransformerConfig field except vocabulary sizes and special ids; a field
    # left out keeps its default here.
    model: dict[str, Any] = field(default_factory=lambda: dict(MODEL_DEFAULTS))
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
    valid_tokenize: str = "13a"  # BLEU's tokenization (sacreBLEU's -tok; zh for Chinese)
    save_every_steps: int = 500  # checkpoint_last.pt, for --resume mid-epoch
    save_every_minutes: float = 0.0  # 0 = off; else also checkpoint_stepNNNNNNN.pt this often
    keep_last: int = 5  # epoch (and timed) checkpoints kept, for averaging
    log_every: int = 10  # progress-bar refresh, in updates
    seed: int = 1  # the run's random seed (initialisation, batch order, dropout)
    threads: int = 0  # torch intra-op threads, at most 1024; 0 = torch's default
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    # Unset (null): the device's default, DEVICE_DEFAULTS; a value given always wins.
    precision: str | None = None  # fp32 | bf16 | fp16 (autocast; fp16 with a loss scale)
    compile: bool | None = None  # the training step through torch.compile (inductor)
    max_skipped_updates: int = 20  # stop after this many non-finite updates in a row
    # Several processes: a rank that waits longer than this in a collective (for a rank
    # that hangs or is gone) fails the job, naming the collective, instead of hanging it.
    collective_timeout_minutes: float = COLLECTIVE_TIMEOUT_MINUTES
    # The model fields this recipe sets (in its file, by an override or in code), not
    # defaults: what a run with init_from checks against its model. Not a recipe field.
    given_model_fields: set[str] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        """A recipe built in code has the model :meth:`from_dict` makes of the same fields:
        ``model`` must name model fields (RecipeError otherwise), and is merged onto
        :data:`MODEL_DEFAULTS`; see :meth:`_merge_model` for the fields it sets."""
        # Where a file or an override set a field (model.KEY for a model field): not a
        # field itself, a copy (dataclasses.replace) is made without it (see source_of).
        self._sources: dict[str, str] = {}
        self._merge_model("recipe")

    def source_of(self, key: str) -> str | None:
        """Where field ``key`` (``model.KEY`` for a model field) was set last: the recipe
        file (or the ``source`` given to :meth:`from_dict`), or ``override 'KEY=VALUE'``;
        None for a field left at its default or set in code, as by ``Recipe(key=...)``."""
        return self._sources.get(key)

    def _merge_model(self, source: str) -> None:
        """``model`` merged onto :data:`MODEL_DEFAULTS`, and the fields it sets added to
        ``given_model_fields``: all those it names when it leaves a default out; when it
        names every default field (the default itself, or a copy of a recipe's model, as
        ``dataclasses.replace`` passes it), those whose value is not the default's."""
        model = values.model_fields(self.model, source)
        if MODEL_DEFAULTS.keys() <= model.keys():
            given = {
                k for k, v in model.items() if k not in MODEL_DEFAULTS or v != MODEL_DEFAULTS[k]
            }
        else:
            given = set(model)
        self.model = {**MODEL_DEFAULTS, **model}
        self.given_model_fields = {*self.given_model_fields, *given}  # not the caller's set

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> Recipe:
        """The recipe in the YAML file ``path`` with ``overrides`` applied. RecipeError,
        naming the file (and the line or field), for a file that is missing, not UTF-8,
        empty, not YAML, gives a key twice, or has a field of the wrong type or range."""
        path = Path(path)
        if not path.is_file():
            what = "a folder, not a recipe file" if path.is_dir() else "not a regular file"
            raise RecipeError(f"{path}: {what if path.exists() else 'no such recipe file'}")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecipeError(f"{path}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise RecipeError(f"{path}: cannot read ({e.strerror or e})") from None
        try:
            data = yaml.load(text, Loader=_RecipeLoader)
        except _DuplicateKey as e:
            raise RecipeError(f"{path}, line {e.line}: {e}") from None
        except yaml.MarkedYAMLError as e:
            line = f", line {e.problem_mark.line + 1}" if e.problem_mark else ""
            raise RecipeError(f"{path}{line}: not valid YAML: {e.problem}") from None
        except yaml.YAMLError as e:
            raise RecipeError(f"{path}: not valid YAML: {e}") from None
        except RecursionError:  # [[[...]]] hundreds deep: YAML's reader recurses
            raise RecipeError(f"{path}: nested too deeply to be a recipe") from None
        if _values_past(data, 10_000):  # a few dozen in a recipe: aliases (*a) nested
            raise RecipeError(f"{path}: holds over 10,000 values (YAML aliases nested?)")
        if data is None:  # nothing but comments: no silent run of the defaults
            raise RecipeError(f"{path}: holds no recipe (no field: value in it)")
        if not isinstance(data, dict):
            raise RecipeError(f"{path}: a recipe is a mapping of field: value")
        for key in ("data", *TEXT_FIELDS, "init_from"):
            value = data.get(key)  # relative paths are relative to the recipe file
            if isinstance(value, str) and value and not Path(value).is_absolute():
                data[key] = str((path.parent / value).resolve())
        return cls.from_dict(data, source=str(path)).override(overrides or []).check(str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "recipe") -> Recipe:
        """The recipe of the fields in ``data``, each checked (see :meth:`check`); those it
        leaves out keep their defaults, model fields included. RecipeError naming
        ``source`` for what is not a mapping, an unknown field, or a value of the wrong
        type or range."""
        given: object = data  # typed callers aside: a notebook passes anything
        if not isinstance(given, dict):
            raise RecipeError(
                f"{source}: a recipe is a mapping of field: value, got {type(given).__name__}"
            )
        known = {f.name for f in fields(cls)} - {"given_model_fields"}
        values.check_names(data, source)
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecipeError(f"{source}: unknown field(s): {', '.join(unknown)}")
        recipe = cls()
        for key, value in data.items():
            recipe._set(key, value, source)
            recipe._sources[key] = source  # a model's fields: each by _set
        return recipe

    def override(self, items: list[str]) -> Recipe:
        """Apply ``key=value`` strings in order (a later one for a key wins: code may put
        its defaults first; the command line refuses a key given twice); values are parsed
        as YAML (numbers, booleans), except those of text fields (paths, names), which are
        taken as given: YAML would read ``dir:`` as a mapping and ``1e3`` as a number."""
        for item in items:
            if "=" not in item:
                raise RecipeError(f"override {item!r}: expected key=value")
            key, raw = item.split("=", 1)
            text = isinstance(getattr(type(self)(), key, None), str)  # a path or a name
            try:
                value = raw if text or not raw else yaml.safe_load(raw)
            except (yaml.YAMLError, RecursionError):  # the latter: nested hundreds deep
                raise RecipeError(f"override {item!r}: the value is not valid YAML") from None
            model: dict[str, Any] | None = None
            if key.startswith("model."):
                model = {key[len("model.") :]: value}
            elif key == "model" and isinstance(value, dict):
                model = value
            if model is not None:
                # Onto the recipe's model, as model.KEY=VALUE each: the class default (the
                # base model) would drop the fields the recipe file set.
                model = values.model_fields(model, f"override {item!r}")
                self.model = {**self.model, **model}
                self.given_model_fields.update(model)
                self._sources.update({f"model.{k}": f"override {item!r}" for k in model})
            else:
                if key not in {f.name for f in fields(self)} - {"given_model_fields"}:
                    raise RecipeError(f"override {item!r}: unknown field {key!r}")
                self._set(key, value, f"override {item!r}")
                self._sources[key] = f"override {item!r}"
        return self

    def check(self, source: str = "recipe") -> Recipe:
        """``self``, once every field is of its type and in its range (as reading a file
        or an override checks it: this catches fields set in code) and the fields agree:
        RecipeError naming the field otherwise. The model fields are checked where the
        model is known (:func:`check_new_model`, :func:`check_resume`)."""
        for f in fields(self):
            if f.name not in ("model", "given_model_fields"):
                self._set(f.name, getattr(self, f.name), source)
        self._merge_model(source)  # a model assigned since it was made
        if self.dataset:  # checked whether or not the text fields leave it anything to fill
            try:
                parse_spec(self.dataset)
            except DownloadError as e:
                where = self._sources.get("dataset", source)  # the file, or an override
                raise RecipeError(f"{where}: field dataset: {e}") from None
        others = [k for k in ("dataset", *TEXT_FIELDS) if getattr(self, k)]
        if self.data and others:  # the prepared directory would be read, the rest unused
            raise RecipeError(
                f"{self._sources.get('data', source)}: fields data and {', '.join(others)} "
                "both name the training data (data, a prepared directory, would leave the "
                "others unused): give one"
            )
        if self.schedule != "noam" and not (self.max_steps or self.time_limit_minutes):
            raise RecipeError(
                f"{source}: schedule {self.schedule!r} decays to 0 at the end of the run: it "
                "needs a budget (max_steps or time_limit_minutes)"
            )
        return self

    def _set(self, key: str, value: Any, source: str) -> None:
        """Set field ``key`` to ``value`` once it has the field's type (a whole number for
        an int, a finite one for a float) and is in its range: RecipeError otherwise."""
        default = getattr(type(self)(), key)
        if key == "model":
            value = values.model_fields(value, source)
            self.given_model_fields.update(value)
            self._sources.update({f"model.{k}": source for k in value})
            value = {**default, **value}
        elif key == "adam_betas":
            value = values.adam_betas(value, source)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise RecipeError(f"{source}: field {key!r} must be true or false, got {value!r}")
        elif key in DEVICE_DEFAULTS:  # None: unset, the device decides
            kind = bool if key == "compile" else str
            if value is not None and not isinstance(value, kind):
                what = "true or false" if kind is bool else "a string"
                raise RecipeError(f"{source}: field {key!r} must be {what} or null, got {value!r}")
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise RecipeError(f"{source}: field {key!r} must be a string, got {value!r}")
            if key == "device":
                values.device_name(value, f"{source}: field 'device'")
        elif isinstance(default, (int, float)):
            value = values.number(type(default), value, f"{source}: field {key!r}")
        if key in RANGES and not RANGES[key][0](value):
            raise RecipeError(f"{source}: field {key!r} must be {RANGES[key][1]}, got {value!r}")
        if key in CHOICES and value is not None and value not in CHOICES[key]:
            choices = " | ".join(CHOICES[key])
            raise RecipeError(f"{source}: field {key!r} must be {choices}, got {value!r}")
        setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        del data["given_model_fields"]
        return data

    def save(self, path: str | Path) -> None:
        """Write the recipe to ``path`` whole or not at all (a temp file renamed over it): a
        half-written recipe.yaml (a full disk) would not be recognised as a run's."""
        text = yaml.safe_dump(self.to_dict(), sort_keys=False).encode("utf-8")
        replace_file(path, lambda f: f.write(text))


def _values_past(data: object, limit: int) -> bool:
    """Whether ``data`` holds more than ``limit`` values, aliases counted each time they
    appear: 300 bytes of nested aliases stand for 10^9 (105 s and 10 GB to refuse)."""
    todo, seen = [data], 0
    while todo and seen <= limit:
        value = todo.pop()
        seen += 1
        todo.extend(value if isinstance(value, list) else [])
        todo.extend([*value.keys(), *value.values()] if isinstance(value, dict) else [])
    return seen > limit


class _DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping of a recipe file, on ``line``."""

    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error
    (PyYAML keeps the last, and a recipe's first setting would be lost without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # a merge (<<) may repeat keys; other keys PyYAML itself checks
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in first:
                raise _DuplicateKey(f"key {key!r} given twice (first on line {first[key]})", line)
            first[key] = line
        return super().construct_mapping(node, deep)


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
