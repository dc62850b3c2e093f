"""Data: parallel text in, token-budget batches of ids out (and the built-in demo task)."""

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.data.batching import (
    Batch,
    ParallelDataset,
    collate,
    pad,
    shift_target,
    sorted_batches,
    token_batches,
)
from aiayn.data.corpus import ParallelCorpus, decode_lines, normalize, read_lines, read_parallel
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import CorpusError

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
    "decode_lines",
    "normalize",
    "pad",
    "read_lines",
    "read_parallel",
    "shift_target",
    "sorted_batches",
    "token_batches",
]
