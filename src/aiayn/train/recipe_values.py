"""The checks of single recipe values, as reading a file, an override or a recipe built
in code makes them: each is a RecipeError naming where the value came from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from aiayn.config import TransformerConfig
from aiayn.errors import RecipeError


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


def check_model_names(data: Mapping, source: str) -> None:
    """RecipeError naming ``source`` unless every key of ``data`` is a model field (the
    model's own check comes later, where no file is known to name)."""
    check_names(data, source)
    if unknown := sorted(set(data) - {f.name for f in fields(TransformerConfig)}):
        raise RecipeError(f"{source}: unknown field(s): {', '.join(unknown)}")


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


def model_fields(value: Any, source: str) -> dict[str, Any]:
    """``value`` as a recipe's ``model``, a new dict: a mapping whose keys are all
    TransformerConfig field names (:func:`check_model_names`); RecipeError naming
    ``source`` otherwise."""
    if not isinstance(value, Mapping):
        raise RecipeError(f"{source}: 'model' must be a mapping of model fields, got {value!r}")
    check_model_names(value, f"{source}: model")
    return dict(value)
