"""Metrics: corpus BLEU written from its definition."""

from aiayn.metrics.bleu import BLEUScore, corpus_bleu, sentence_bleu, tokenize_13a

__all__ = ["BLEUScore", "corpus_bleu", "sentence_bleu", "tokenize_13a"]
