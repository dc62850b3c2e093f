"""Autoregressive decoding: greedy and beam search over one incremental decode step, and
beam search with continuous batching (sentences join and leave between steps)."""

from aiayn.decode.beam import Hypothesis, beam_search, length_penalty
from aiayn.decode.continuous import ContinuousBeamSearch
from aiayn.decode.core import DecodeStep, inference, length_limits
from aiayn.decode.generate import generate
from aiayn.decode.greedy import greedy

__all__ = [
    "ContinuousBeamSearch",
    "DecodeStep",
    "Hypothesis",
    "beam_search",
    "generate",
    "greedy",
    "inference",
    "length_limits",
    "length_penalty",
]
