"""Autoregressive decoding: greedy, beam search and sampling over one incremental decode
step (one model or an ensemble), all set by one :class:`DecodeOptions`, all run by one
:class:`BeamEngine` that sentences join and leave between steps: offline (every sentence
at once) and in the server (continuous batching) alike."""

from aiayn.decode.beam import Hypothesis, length_penalty
from aiayn.decode.core import DecodeStep, inference, length_limits
from aiayn.decode.engine import BeamEngine
from aiayn.decode.options import LENGTH_PENALTIES, DecodeOptions
from aiayn.decode.search import beam_search, greedy, search

__all__ = [
    "LENGTH_PENALTIES",
    "BeamEngine",
    "DecodeOptions",
    "DecodeStep",
    "Hypothesis",
    "beam_search",
    "greedy",
    "inference",
    "length_limits",
    "length_penalty",
    "search",
]
