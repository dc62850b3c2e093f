"""The checks of single recipe values, as reading a file, an override or a recipe built
in code makes them: each is a RecipeError naming where the value came from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from aiayn.config import TransformerConfig
from aiayn.errors import AiaynError, RecipeError
from aiayn.model.device import named_device


def number(kind: type, value: Any, what: str) -> int | float:
    """``value`` as a finite ``kind`` (int or float); a string is read as a number (YAML
    reads 1e-9 as one). RecipeError naming ``what`` for a boolean, a fraction for an int
    (no silent truncation) and infinity or NaN."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = int(value) if kind is int else float(value)
        except ValueError:
            parsed = None
    if isinstance(parsed, bool) or not isinstance(parsed, (int, float)):
        raise RecipeError(f"{what} must be {kind.__name__}, got {value!r}")
    if isinstance(parsed, int) and abs(parsed) >= 2**63:  # past int64, and float's range
        raise RecipeError(f"{what} is out of range (at most 2**63 - 1 in size)")
    if not math.isfinite(parsed):
        raise RecipeError(f"{what} must be a finite number, got {value!r}")
    if kind is int and parsed != int(parsed):
        raise RecipeError(f"{what} must be int (a whole number), got {value!r}")
    return kind(parsed)


def check_names(data: Mapping, source: str) -> None:
    """RecipeError unless every key of ``data`` is a field name (text, not ``1`` or ``true``)."""
    for key in data:
        if not isinstance(key, str):
            raise RecipeError(f"{source}: field names are text, got {key!r}")


# Each model field's type as TransformerConfig annotates it ("int", "float", "bool", "str";
# "int | None" may be null).
MODEL_TYPES = {f.name: str(f.type) for f in fields(TransformerConfig)}
# The model fields a new run takes from its tokenizer, each with what the tokenizer gives
# (a recipe that sets one is refused where the model is made: model_checks).
SET_BY_TOKENIZER = {
    "src_vocab_size": "its vocabulary's size, from the recipe's vocab_size",
    "tgt_vocab_size": "its vocabulary's size, from the recipe's vocab_size",
    "pad_id": "its padding token's id",
    "bos_id": "its start-of-sentence token's id",
    "eos_id": "its end-of-sentence token's id",
}


def check_model_names(data: Mapping, source: str) -> None:
    """RecipeError naming ``source`` unless every key of ``data`` is a model field (the
    model's own check of ranges comes later, where no file is known to name)."""
    check_names(data, source)
    if unknown := sorted(set(data) - MODEL_TYPES.keys()):
        raise RecipeError(f"{source}: unknown field(s): {', '.join(unknown)}")


def model_value(key: str, value: Any, source: str) -> Any:
    """``value`` of model field ``key`` as its type, a number read from text as the other
    number fields are (YAML reads 1e-6 as text, which TransformerConfig would refuse):
    RecipeError naming ``source`` and the field for a value of another type."""
    kind = MODEL_TYPES[key].removesuffix(" | None")
    what = f"{source}: field 'model.{key}'"
    # A field the tokenizer sets is left as given: its own refusal says so, which a type
    # error here would hide.
    if key in SET_BY_TOKENIZER or (value is None and MODEL_TYPES[key].endswith(" | None")):
        return value
    if kind in ("int", "float"):
        return number(int if kind == "int" else float, value, what)
    if kind == "bool" and not isinstance(value, bool):
        raise RecipeError(f"{what} must be true or false, got {value!r}")
    if kind == "str" and not isinstance(value, str):
        raise RecipeError(f"{what} must be a string, got {value!r}")
    return value


def adam_betas(value: Any, source: str) -> tuple[float, float]:
    """``value`` as Adam's (beta1, beta2): exactly two numbers, each in [0, 1)."""
    words = f"{source}: 'adam_betas' must be two numbers in [0, 1)"
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or len(value) != 2:
        raise RecipeError(f"{words}, got {value!r}")
    try:
        betas = tuple(number(float, v, "") for v in value)
    except RecipeError:
        raise RecipeError(f"{words}, got {value!r}") from None
    if not all(0 <= b < 1 for b in betas):
        raise RecipeError(f"{words}, got {value!r}")
    return betas[0], betas[1]


def device_name(value: str, what: str) -> None:
    """RecipeError naming ``what`` unless ``value`` names a device aiayn runs on by its form
    (:func:`~aiayn.model.device.named_device`); whether this machine has it is for the run
    to find, so that a recipe written on a GPU machine still reads on a CPU one."""
    try:
        named_device(value)
    except AiaynError:
        raise RecipeError(
            f"{what} must name a device (auto, cpu, cuda, cuda:N or mps), got {value!r}"
        ) from None


def model_fields(value: Any, source: str) -> dict[str, Any]:
    """``value`` as a recipe's ``model``, a new dict: a mapping whose keys are all
    TransformerConfig field names (:func:`check_model_names`), each value of its field's
    type (:func:`model_value`); RecipeError naming ``source`` otherwise."""
    if not isinstance(value, Mapping):
        raise RecipeError(f"{source}: 'model' must be a mapping of model fields, got {value!r}")
    check_model_names(value, f"{source}: model")
    return {key: model_value(key, v, source) for key, v in value.items()}
