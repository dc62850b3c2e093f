"""The generation settings of a Marian folder, checked against what aiayn's searches do.

An imported model decodes with its folder's settings as transformers' ``generate()``
does (:meth:`aiayn.decode.DecodeOptions.from_generation`): beam size, length penalty,
output length, early stopping, forced EOS, n-best, sampling. aiayn's searches always ban
the pad id and the decoder's start id and stop at one EOS id; settings that would make
``generate()`` decode otherwise (another ban list, logits processors aiayn does not have,
a second EOS, another start token) are refused at import, one line naming the field,
instead of translating differently without a word.
"""

from __future__ import annotations

from math import isfinite
from typing import Any

from aiayn.config import TransformerConfig
from aiayn.decode import DecodeOptions
from aiayn.errors import ConversionError, DecodeError

# Settings whose processors aiayn's searches lack, with the values that leave generate()
# unchanged (transformers' defaults; min_length counts the decoder's start token).
# Not among them: renormalize_logits, which OPUS-MT folders set to true. generate() then
# normalises the log-probs again after banning the pad (and start) id, aiayn before the
# ban (DecodeStep.normalise): each step's log-prob differs by log(1 - p(banned)), which
# for a trained model (never taught to output the pad) is 0 to float precision.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "min_length": (None, 0, 1),
    "min_new_tokens": (None, 0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "repetition_penalty": (None, 1, 1.0),
    "encoder_repetition_penalty": (None, 1, 1.0),
    "forced_bos_token_id": (None,),
    "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []),
    "sequence_bias": (None, {}, []),
    "exponential_decay_length_penalty": (None,),
    "num_beam_groups": (None, 1),
    "diversity_penalty": (None, 0, 0.0),
    "penalty_alpha": (None, 0, 0.0),
    "force_words_ids": (None, []),
    "constraints": (None, []),
    "guidance_scale": (None, 1, 1.0),
    "typical_p": (None, 1, 1.0),
    "epsilon_cutoff": (None, 0, 0.0),
    "eta_cutoff": (None, 0, 0.0),
    "min_p": (None, 0, 0.0),
    "top_h": (None,),
    "watermarking_config": (None,),
    "dola_layers": (None,),
    "token_healing": (None, False),
    "stop_strings": (None,),  # "" and [] too: generate() stops after a token, or raises
    "max_time": (None,),  # generate() stops when the time is up, aiayn at its length limit
}
# The type of each number or switch generate() reads (a JSON "4" is no number to it, nor
# true: int("4") or float(True) would decode with a setting the file does not hold); a
# null is a field left unset, as in transformers' GenerationConfig.
INTEGERS = (
    "num_beams", "num_return_sequences", "top_k", "max_length", "max_new_tokens",
    "min_length", "min_new_tokens", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "num_beam_groups",
)  # fmt: skip
NUMBERS = (
    "length_penalty", "temperature", "top_p", "repetition_penalty",
    "encoder_repetition_penalty", "diversity_penalty", "penalty_alpha", "guidance_scale",
    "typical_p", "epsilon_cutoff", "eta_cutoff", "min_p",
)  # fmt: skip
SWITCHES = ("do_sample",)


def check_generation(settings: dict[str, Any], cfg: TransformerConfig, where: str) -> None:
    """ConversionError naming ``where`` (the file the settings came from) and the field
    unless aiayn decodes with ``settings`` as ``generate()`` does for the model of ``cfg``
    (a null field as one left out)."""
    settings = {key: value for key, value in settings.items() if value is not None}

    def refuse(key: str, why: str) -> ConversionError:
        return ConversionError(f"{where}: {key} {settings[key]!r}: {why}")

    for key in (*INTEGERS, *NUMBERS, *SWITCHES):
        value = settings.get(key)
        if value is None:
            continue
        if key in SWITCHES and not isinstance(value, bool):
            raise refuse(key, "must be true or false")
        if key in INTEGERS and (isinstance(value, bool) or not isinstance(value, int)):
            raise refuse(key, "must be an integer")
        if key in NUMBERS and not (
            isinstance(value, (int, float)) and not isinstance(value, bool) and isfinite(value)
        ):
            raise refuse(key, "must be a finite number")
    # What DecodeOptions would refuse under its own names (beam, n_best)
    for key in ("num_beams", "num_return_sequences"):
        if settings.get(key) is not None and settings[key] < 1:
            raise refuse(key, "must be at least 1")
    beams, outputs = settings.get("num_beams") or 1, settings.get("num_return_sequences") or 1
    if not settings.get("do_sample") and outputs > beams:
        raise refuse("num_return_sequences", f"more outputs than num_beams ({beams}) keeps")
    for key, neutral in NEUTRAL.items():
        if key in settings and not any(_same(settings[key], v) for v in neutral):
            raise refuse(key, "aiayn's searches have no such setting; remove it to import")
    # generate() takes its start and stop ids from these settings alone, never from
    # config.json, and starts from bos_token_id where no decoder_start_token_id is set.
    start = "decoder_start_token_id" if "decoder_start_token_id" in settings else "bos_token_id"
    for key in (start, "eos_token_id", "forced_eos_token_id"):
        if settings.get(key) == []:  # generate() stops at no EOS, or raises
            raise refuse(key, "an empty list; aiayn decodes with one id")
    if start not in settings:
        raise ConversionError(
            f"{where}: no decoder_start_token_id or bos_token_id, so generate() has no id to "
            f"start from; aiayn starts from the model's {cfg.bos_id} (add "
            f"decoder_start_token_id {cfg.bos_id})"
        )
    if "eos_token_id" not in settings:
        raise ConversionError(
            f"{where}: no eos_token_id, so generate() never stops at an EOS; aiayn stops at "
            f"the model's {cfg.eos_id} (add eos_token_id {cfg.eos_id})"
        )
    ids = {"eos_token_id": cfg.eos_id, "forced_eos_token_id": cfg.eos_id, start: cfg.bos_id}
    for key, want in ids.items():
        value = settings.get(key)
        found = value if isinstance(value, list) else [value]
        if value is not None and any(v != want for v in found):
            why = f"aiayn decodes with the config's id {want} only"
            if key == "bos_token_id":  # the start id: no decoder_start_token_id is set
                why = f"generate() starts from it (no decoder_start_token_id); {why}"
            raise refuse(key, why)
    # aiayn always bans the pad and start ids; a folder that bans fewer (none: an older or
    # re-saved folder; the pad only, where the start id is another) differs only where
    # generate() would output one of them, which training never made a target (a model
    # barely trained may still). One that bans other ids or sequences aiayn would output.
    banned = settings.get("bad_words_ids") or []
    ours = {cfg.pad_id, cfg.bos_id}
    found_ids = [_id(w) for w in banned] if isinstance(banned, list) else [None]
    if None in found_ids or not set(found_ids) <= ours:
        raise ConversionError(
            f"{where}: bad_words_ids {banned!r}: aiayn's searches ban the pad and decoder "
            f"start ids {sorted(ours)} and no others ({[[i] for i in sorted(ours)]}, as "
            "OPUS-MT models have)"
        )
    if settings.get("length_penalty", 1.0) < 0:
        raise refuse("length_penalty", "aiayn's length penalty exponent is >= 0")
    if settings.get("do_sample") and beams > 1:
        raise refuse("num_beams", "aiayn samples without a beam (do_sample is true)")
    try:
        DecodeOptions.from_generation(settings)
    except DecodeError as e:
        raise ConversionError(f"{where}: {e}") from None


def _id(words: Any) -> int | None:
    """The id of a one-token bad word; None for anything else (a longer sequence)."""
    if isinstance(words, list) and len(words) == 1 and isinstance(words[0], int):
        return words[0]
    return None


def _same(value: Any, neutral: Any) -> bool:
    """``value == neutral`` with True never equal to 1 (JSON's true is not a number)."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)
