"""Autoregressive decoding: greedy, beam search and sampling over one incremental decode
step (one model or an ensemble), all set by one :class:`DecodeOptions`; and beam search
with continuous batching (sentences join and leave between steps)."""

from aiayn.decode.beam import Hypothesis, beam_search, length_penalty
from aiayn.decode.continuous import ContinuousBeamSearch
from aiayn.decode.core import DecodeStep, inference, length_limits
from aiayn.decode.generate import generate, search
from aiayn.decode.greedy import greedy
from aiayn.decode.options import LENGTH_PENALTIES, DecodeOptions

__all__ = [
    "LENGTH_PENALTIES",
    "ContinuousBeamSearch",
    "DecodeOptions",
    "DecodeStep",
    "Hypothesis",
    "beam_search",
    "generate",
    "greedy",
    "inference",
    "length_limits",
    "length_penalty",
    "search",
]
