"""Data: parallel text in, token-budget batches of ids out (and the built-in demo task)."""

from aiayn.data.batching import Batch, ParallelDataset, collate, pad, token_batches
from aiayn.data.corpus import CorpusError, ParallelCorpus, normalize, read_lines, read_parallel
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Batch",
    "CorpusError",
    "ParallelCorpus",
    "ParallelDataset",
    "Tokenizer",
    "collate",
    "normalize",
    "pad",
    "read_lines",
    "read_parallel",
    "token_batches",
]
