"""One set of decoding options for every search: greedy, beam, sampling, the Translator, the
command line and the server all take a :class:`DecodeOptions`.

The object is frozen and checks itself when made, so a setting out of range (a NaN, a
top-p of 0) or two that contradict each other (sampling with a beam) is one clear
:class:`~aiayn.errors.DecodeError` before any decoding starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from aiayn.errors import DecodeError

# Length penalties (the score a finished hypothesis is ranked by is log p / lp):
#   gnmt: lp = ((5 + |Y|) / 6) ** alpha    Wu et al. 2016, used by the paper (Section 6.1)
#   hf:   lp = |Y| ** alpha                Hugging Face's generate() (and Marian, OPUS-MT)
LENGTH_PENALTIES = ("gnmt", "hf")


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: search, length rule, sampling and forced prefix.

    ``beam`` 1 is greedy decoding (or sampling, with ``sampling``); ``n_best`` outputs per
    sentence (with sampling: that many samples). A sentence of n real source tokens gets at
    most ``max_len_a * n + max_len_b`` output tokens, EOS included, at most
    ``max_new_tokens`` when set, never past the model's ``max_len``. ``alpha`` is the
    length-penalty exponent of the ``length_penalty`` formula ("gnmt" or "hf"). A beam
    search sentence ends once ``beam`` hypotheses finished and no active beam can beat them
    at the longest length it may reach (``early_stopping="never"``, as Hugging Face names
    it: exact), at its current length (False: Hugging Face's default heuristic), or at once
    (True). At its length limit beam search ends every hypothesis with EOS, scored with its
    log-prob (fairseq's rule); with ``cut_at_limit`` it chooses the last token freely and
    ends there without EOS, as greedy decoding and sampling do (``generate()`` without
    ``forced_eos_token_id``, CTranslate2). With ``forced_eos`` (Hugging Face's
    ``forced_eos_token_id``) every search ends an output that reaches its limit with EOS,
    scored 0, as ``generate()`` does.
    Sampling draws each token from the model's distribution at ``temperature``, restricted
    to the ``top_k`` most likely tokens (0: no limit) and to the nucleus of probability
    ``top_p`` (1: no limit); with ``seed`` set, each line's samples are drawn from its own
    stream of (seed, line index, sample index), not from the batch's or the other lines'
    (up to float rounding: :mod:`aiayn.decode.sampling`). ``prefix`` is text every
    output starts with (forced, and counted in the score); the id-level searches take
    per-sentence prefix ids instead.
    """

    beam: int = 4
    alpha: float = 0.6
    n_best: int = 1
    max_len_a: float = 1.0
    max_len_b: int = 50
    max_new_tokens: int | None = None
    length_penalty: str = "gnmt"
    early_stopping: bool | str = "never"
    forced_eos: bool = False
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    prefix: str = ""
    cut_at_limit: bool = False

    def __post_init__(self) -> None:
        _check_int("beam", self.beam, 1)
        _check_int("n_best", self.n_best, 1)
        _check_int("max_len_b", self.max_len_b, 0)
        if self.max_new_tokens is not None:
            _check_int("max_new_tokens", self.max_new_tokens, 0)
        _check_int("top_k", self.top_k, 0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0)
        _check_number("alpha", self.alpha, 0.0)
        _check_number("max_len_a", self.max_len_a, 0.0)
        if not (_is_number(self.temperature) and self.temperature > 0):
            raise DecodeError(f"temperature must be a finite number > 0, got {self.temperature}")
        if not (_is_number(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise DecodeError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise DecodeError(
                f"early_stopping must be true, false or 'never', got {self.early_stopping!r}"
            )
        if self.length_penalty not in LENGTH_PENALTIES:
            raise DecodeError(
                f"length_penalty must be one of {', '.join(LENGTH_PENALTIES)}, "
                f"got {self.length_penalty!r}"
            )
        for name in ("sampling", "forced_eos", "cut_at_limit"):
            if not isinstance(getattr(self, name), bool):
                raise DecodeError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.forced_eos and self.cut_at_limit:
            raise DecodeError(
                "forced_eos ends an output at its length limit with EOS and cut_at_limit "
                "without one: set at most one"
            )
        if not isinstance(self.prefix, str):
            raise DecodeError(f"prefix must be text, got {type(self.prefix).__name__}")
        if self.sampling:
            if self.beam != 1:
                raise DecodeError(
                    f"sampling draws one token at a time and takes no beam: got beam "
                    f"{self.beam} (use beam 1, and n_best for several samples)"
                )
        else:
            if self.n_best > self.beam:
                raise DecodeError(
                    f"n_best must be <= beam (a search keeps only beam hypotheses), "
                    f"got n_best {self.n_best} and beam {self.beam}"
                )
            changed = [
                f"{name}={getattr(self, name)}"
                for name, neutral in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0))
                if getattr(self, name) != neutral
            ]
            if changed:
                verb = "applies" if len(changed) == 1 else "apply"
                raise DecodeError(f"{', '.join(changed)} only {verb} with sampling, which is off")

    @property
    def greedy(self) -> bool:
        """One candidate per step, the most likely one (beam 1 without sampling)."""
        return self.beam == 1 and not self.sampling

    def replace(self, **changes: Any) -> DecodeOptions:
        """A copy with ``changes`` (any field, to any value, None included), checked like a
        new one; DecodeError naming a field it does not have."""
        if unknown := sorted(changes.keys() - self.__dataclass_fields__.keys()):
            raise DecodeError(f"DecodeOptions has no field {', '.join(unknown)}")
        return replace(self, **changes) if changes else self

    def given(self, **settings: Any) -> DecodeOptions:
        """A copy with the ``settings`` that are not None (flags, request fields or keywords
        that were given; the others keep these options' values, e.g. a model's defaults),
        checked like a new one. A setting given replaces the rule it is part of: sampling
        turned on without a beam samples (beam 1); sampling turned off, or a beam over 1
        without sampling given, turns these options' sampling off with its temperature,
        top_k, top_p and number of samples (n_best, at most the beam then); forced_eos and
        cut_at_limit each turn the other off."""
        given = {k: v for k, v in settings.items() if v is not None}
        if given.get("sampling") and "beam" not in given:
            given["beam"] = 1
        beams = given.get("beam", 1)
        if "sampling" not in given and isinstance(beams, int) and beams > 1:
            given["sampling"] = False
        if self.sampling and given.get("sampling") is False:
            beam = given.get("beam", self.beam)
            n_best = min(self.n_best, beam) if isinstance(beam, int) else self.n_best
            given = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "n_best": n_best, **given}
        for rule, other in (("forced_eos", "cut_at_limit"), ("cut_at_limit", "forced_eos")):
            if given.get(rule) is True and other not in given:
                given[other] = False
        return self.replace(**given)

    @classmethod
    def from_generation(cls, settings: dict[str, Any]) -> DecodeOptions:
        """The options that decode as Hugging Face's ``generate()`` does with these
        generation settings (a ``generation_config.json``; missing or null keys take
        transformers' defaults): ``num_beams``, ``length_penalty`` (its formula,
        |Y|^alpha), ``max_length`` (which counts the decoder's start token) or
        ``max_new_tokens``, ``early_stopping``, ``forced_eos_token_id`` (without it, outputs
        are cut at the limit: ``cut_at_limit``), ``num_return_sequences``, and sampling
        (``do_sample``, ``temperature``, ``top_k``, ``top_p``). The pad id is always
        banned, as Marian's ``bad_words_ids`` do.

        Settings that give no length (neither ``max_length`` nor ``max_new_tokens``) take
        aiayn's own length rule (``max_len_a * source + max_len_b``), not transformers'
        "model-agnostic" default of 20 positions, which would cut every longer translation
        silently (transformers warns against relying on it; see :func:`length_rule`)."""
        if not isinstance(settings, dict):
            raise DecodeError(f"generation settings: a mapping, not {type(settings).__name__}")
        try:
            return cls._from_generation(settings)
        except (TypeError, ValueError) as e:  # a setting of the wrong type (DecodeError too)
            raise DecodeError(f"generation settings: {e}") from None

    @classmethod
    def _from_generation(cls, settings: dict[str, Any]) -> DecodeOptions:
        get = {k: v for k, v in settings.items() if v is not None}.get  # null: left unset
        sampling = bool(get("do_sample", False))
        max_new = get("max_new_tokens")
        rule: dict[str, Any] = {}
        if sampling and int(get("num_beams", 1)) > 1:  # generate()'s beam sampling
            raise DecodeError(
                f"num_beams {get('num_beams')!r} with do_sample: aiayn samples without a beam"
            )
        if sets_length(settings):
            tokens = int(max_new) if max_new is not None else int(get("max_length", 0)) - 1
            if tokens < 1:  # generate() refuses a max_new_tokens of 0 or less
                key = "max_new_tokens" if max_new is not None else "max_length"
                raise DecodeError(
                    f"{key} {settings[key]!r} leaves no room for an output token"
                    + (" (it counts the decoder's start token)" if key == "max_length" else "")
                )
            rule = {"max_len_a": 0.0, "max_len_b": tokens}
        return cls(
            beam=1 if sampling else int(get("num_beams", 1)),
            alpha=float(get("length_penalty", 1.0)),
            n_best=int(get("num_return_sequences", 1)),
            **rule,
            length_penalty="hf",
            early_stopping=get("early_stopping", False),
            forced_eos=get("forced_eos_token_id") is not None,
            cut_at_limit=get("forced_eos_token_id") is None,
            sampling=sampling,
            temperature=float(get("temperature", 1.0)) if sampling else 1.0,
            top_k=int(get("top_k", 50)) if sampling else 0,
            top_p=float(get("top_p", 1.0)) if sampling else 1.0,
        )


def sets_length(settings: dict[str, Any] | None) -> bool:
    """Whether generation settings give an output length (``max_length`` or
    ``max_new_tokens``); without one, :meth:`DecodeOptions.from_generation` takes aiayn's
    length rule."""
    return any((settings or {}).get(k) is not None for k in ("max_length", "max_new_tokens"))


def length_rule(
    options: DecodeOptions, max_len: int, generation: dict[str, Any] | None = None
) -> str:
    """One line saying how long an output may get under ``options`` in a model of
    ``max_len`` positions, and where the rule comes from (``generation``: the settings the
    model was imported with, if any)."""
    a, b, most = options.max_len_a, options.max_len_b, options.max_new_tokens
    if a == 0 or (most is not None and most <= b):  # then the same for every source
        text = f"at most {b if most is None else min(b, most)} tokens"
    else:  # the least of the two, as length_limits takes it
        text = f"{a:g} x source + {b} tokens" + ("" if most is None else f", at most {most}")
    text += f", within the model's {max_len} positions"
    if not generation:
        return f"{text} (aiayn's rule)"
    if sets_length(generation):
        return f"{text} (generation_config.json)"
    return f"{text} (aiayn's rule: generation_config.json sets no max_length)"


def resolve(options: object, **overrides: Any) -> DecodeOptions:
    """``options`` (default: ``DecodeOptions()``) with the keyword settings that are not
    None applied (:meth:`DecodeOptions.given`): what the keyword conveniences do, once per
    call. Any ``options`` but a DecodeOptions or None (an int, a bool) is a DecodeError."""
    if options is not None and not isinstance(options, DecodeOptions):
        raise DecodeError(f"options must be a DecodeOptions, got {type(options).__name__}")
    return (options or DecodeOptions()).given(**overrides)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise DecodeError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_number(name: str, value: Any, low: float) -> None:
    # NaN compares false with everything: a NaN alpha would leave every hypothesis looking
    # unbeaten and run the search to its length limit.
    if not (_is_number(value) and value >= low):
        raise DecodeError(f"{name} must be a finite number >= {low:g}, got {value!r}")
