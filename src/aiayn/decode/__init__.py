"""Autoregressive decoding: greedy and beam search over one incremental decode step."""

from aiayn.decode.beam import Hypothesis, beam_search, length_penalty
from aiayn.decode.core import DecodeStep, inference, length_limits
from aiayn.decode.generate import generate
from aiayn.decode.greedy import greedy

__all__ = [
    "DecodeStep",
    "Hypothesis",
    "beam_search",
    "generate",
    "greedy",
    "inference",
    "length_limits",
    "length_penalty",
]
