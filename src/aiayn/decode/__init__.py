"""Autoregressive decoding: greedy and beam search, both with an incremental cache."""

from aiayn.decode.beam import Hypothesis, beam_search, length_penalty
from aiayn.decode.greedy import greedy

__all__ = ["Hypothesis", "beam_search", "greedy", "length_penalty"]
