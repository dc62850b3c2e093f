"""Batches by token budget (fairseq's ``--max-tokens``), bucketed by length, seeded.

A batch of n sentences costs n * (longest sentence) padded tokens on each side; grouping
sentences of similar length keeps that close to the real token count.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import CorpusError

# The lengths a compiled training step pads batches to (Batch.padded_to_bucket): from 16
# on, each a quarter to a third above the one before, which bounds the padding a batch
# gains; an epoch of Multi30k (sentences of 8-50 tokens) meets 8 of them (BENCHMARKS.md).
# Past the last, its multiples.
BUCKETS = (8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)


def bucket_length(length: int, max_len: int, buckets: Sequence[int] = BUCKETS) -> int:
    """The smallest of ``buckets`` >= ``length`` (past the last: its next multiple),
    capped at ``max_len`` (but never below ``length``)."""
    fits = [b for b in buckets if b >= length]
    padded = fits[0] if fits else -(-length // buckets[-1]) * buckets[-1]
    return max(length, min(padded, max_len))


@dataclass
class Batch:
    """src ``[B, S]``; tgt_in = BOS + target ``[B, T]``; tgt_out = target + EOS ``[B, T]``
    (teacher forcing, Section 3.1); all right-padded with pad_id."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    n_src_tokens: int
    n_tgt_tokens: int  # real target tokens incl. EOS: what the loss is averaged over
    pad_id: int = PAD_ID  # the id the three tensors are padded with

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.src.to(device, non_blocking=True),
            self.tgt_in.to(device, non_blocking=True),
            self.tgt_out.to(device, non_blocking=True),
            self.n_src_tokens,
            self.n_tgt_tokens,
            self.pad_id,
        )

    def padded_to_multiple(self, multiple: int) -> Batch:
        """The same batch with both lengths rounded up to a multiple of ``multiple`` (more
        pad columns), so a compiled step meets few distinct shapes."""
        S, T = self.src.size(1), self.tgt_in.size(1)
        return self.padded_to(-(-S // multiple) * multiple, -(-T // multiple) * multiple)

    def padded_to_bucket(self, max_len: int, buckets: Sequence[int] = BUCKETS) -> Batch:
        """The same batch with source and target both padded to one length, the smallest
        of ``buckets`` that holds the longer side (at most ``max_len``), and to at least
        two rows (torch.compile specialises a dimension of size 1, and the compiled step
        marks rows and length dynamic, for one graph whatever the batch). Every sum over the
        real target tokens stays as it was."""
        length = bucket_length(max(self.src.size(1), self.tgt_in.size(1)), max_len, buckets)
        batch = self.padded_to(length, length)
        if batch.src.size(0) >= 2:
            return batch
        # A second row that weighs nothing: the first one's input with no target. (An
        # all-pad source would leave its cross-attention with no key at all.)
        no_target = torch.full_like(batch.tgt_out, self.pad_id)
        return Batch(
            batch.src.repeat(2, 1), batch.tgt_in.repeat(2, 1),
            torch.cat([batch.tgt_out, no_target]), self.n_src_tokens, self.n_tgt_tokens,
            self.pad_id,
        )  # fmt: skip

    def padded_to(self, src_len: int, tgt_len: int) -> Batch:
        """The same batch right-padded with ``pad_id`` to ``src [B, src_len]``,
        ``tgt_in`` and ``tgt_out [B, tgt_len]`` (lengths at least the current ones)."""

        def widen(t: Tensor, length: int) -> Tensor:
            extra = length - t.size(1)
            return torch.nn.functional.pad(t, (0, extra), value=self.pad_id) if extra else t

        return Batch(
            widen(self.src, src_len), widen(self.tgt_in, tgt_len), widen(self.tgt_out, tgt_len),
            self.n_src_tokens, self.n_tgt_tokens, self.pad_id,
        )  # fmt: skip


def pad(rows: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> Tensor:
    """Right-pad lists of ids into a LongTensor ``[len(rows), longest]``: the one padding
    helper of the package (fairseq's ``collate_tokens``)."""
    out = torch.full((len(rows), max(map(len, rows), default=0)), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


def shift_target(
    tgt_ids: Sequence[Sequence[int]], bos_id: int = BOS_ID, eos_id: int = EOS_ID
) -> tuple[list[list[int]], list[list[int]]]:
    """Teacher forcing (Section 3.1): decoder inputs BOS + y and labels y + EOS, so position
    t is trained to predict token t+1 from the tokens before it."""
    return [[bos_id, *t] for t in tgt_ids], [[*t, eos_id] for t in tgt_ids]


def check_batch_size(batch_size: object) -> None:
    """CorpusError unless ``batch_size`` is an int >= 1 (a negative one would make no
    batch at all, and every output empty)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise CorpusError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def sorted_batches(
    rows: Sequence[Sequence[int]], batch_size: int, pad_id: int = PAD_ID
) -> Iterator[tuple[list[int], Tensor]]:
    """Non-empty ``rows`` in batches of up to ``batch_size``, sorted by length so a batch
    holds little padding: yields (row indices, right-padded ``[n, longest]`` ids). Empty
    rows are skipped; the caller maps results back through the indices. Rows may be
    lists, arrays or 1-D tensors (as :func:`pad` takes them)."""
    check_batch_size(batch_size)
    order = sorted((i for i in range(len(rows)) if len(rows[i])), key=lambda i: len(rows[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        yield chunk, pad([rows[i] for i in chunk], pad_id)


def collate(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Batch:
    """A :class:`Batch` of source and target id lists (no BOS/EOS in either)."""
    src = pad(src_ids, pad_id)
    dec_in, labels = shift_target(tgt_ids, bos_id, eos_id)
    tgt_in, tgt_out = pad(dec_in, pad_id), pad(labels, pad_id)
    n_src = sum(map(len, src_ids))
    return Batch(src, tgt_in, tgt_out, n_src, sum(map(len, tgt_ids)) + len(tgt_ids), pad_id)


def plan_batches(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
) -> list[np.ndarray]:
    """Token-budget batches as arrays of indices (int64): each batch's padded size (count *
    longest, source and target side each, the target counted with its BOS/EOS) stays
    within ``max_tokens``. Every index appears exactly once; a single pair over the budget
    gets a batch of its own.

    Sorting by length with a seeded random tie-break makes buckets of similar lengths that
    differ from epoch to epoch; the batch order is then shuffled. Same (seed, epoch), same
    batches. Vectorised with numpy (a loop per batch, not per pair): one epoch of millions
    of pairs plans in seconds.
    """
    src = np.asarray(src_lens, dtype=np.int64)
    tgt = np.asarray(tgt_lens, dtype=np.int64)
    # The stream of Python's random.Random(seed * 1_000_003 + epoch), drawn by numpy: both
    # are MT19937 with the same 53-bit doubles, so the order is the one the pure-Python
    # planner of earlier versions gave (a run resumed across versions keeps its batches).
    rng = random.Random(seed * 1_000_003 + epoch)
    mt = np.random.RandomState()
    words = rng.getstate()[1]
    mt.set_state(("MT19937", np.array(words[:-1], dtype=np.uint32), words[-1], 0, 0.0))
    keys = mt.random_sample(len(src))
    order = _sort_by_length(src, tgt, keys)
    cost = np.maximum(np.maximum(src, 1), tgt + 1)[order]  # padded size per sentence
    batches: list[np.ndarray] = []
    i, n = 0, len(order)
    while i < n:
        # The batch's longest sentence costs at least cost[i], so it holds at most
        # max_tokens // cost[i] pairs: look no further than that.
        window = cost[i : i + max(1, max_tokens // int(cost[i]))]
        longest = np.maximum.accumulate(window)
        fits = longest * np.arange(1, len(window) + 1) <= max_tokens  # True..True False..
        count = max(1, int(np.count_nonzero(fits)))
        batches.append(order[i : i + count])
        i += count
    state = mt.get_state(legacy=False)["state"]
    rng.setstate((3, (*(int(w) for w in state["key"]), int(state["pos"])), None))
    rng.shuffle(batches)
    return batches


def _sort_by_length(src: np.ndarray, tgt: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Indices sorted by target length, then source length, then key, ties by index (as
    Python's stable ``sorted``). Three stable passes, the last two radix sorts on uint16:
    about twice as fast as ``np.lexsort`` on millions of pairs."""
    if len(src) and max(src.max(), tgt.max()) >= 1 << 16:
        return np.lexsort((keys, src, tgt))
    order = np.argsort(keys, kind="stable")
    order = order[np.argsort(src[order].astype(np.uint16), kind="stable")]
    return order[np.argsort(tgt[order].astype(np.uint16), kind="stable")]


def token_batches(
    src_lens: Sequence[int], tgt_lens: Sequence[int], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """:func:`plan_batches` as lists of ints."""
    return [b.tolist() for b in plan_batches(src_lens, tgt_lens, max_tokens, seed, epoch)]


class ParallelDataset:
    """Encoded sentence pairs, served as token-budget batches; ``special`` holds the pad,
    BOS and EOS ids the batches are made with (those of the tokenizer)."""

    def __init__(
        self,
        src_ids: list[list[int]],
        tgt_ids: list[list[int]],
        dropped_long: int = 0,
        special: tuple[int, int, int] = (PAD_ID, BOS_ID, EOS_ID),
    ):
        if len(src_ids) != len(tgt_ids):
            raise CorpusError(f"{len(src_ids)} source but {len(tgt_ids)} target sentences")
        self.src_ids, self.tgt_ids, self.dropped_long = src_ids, tgt_ids, dropped_long
        self.special = special

    @classmethod
    def from_texts(
        cls,
        tokenizer: Tokenizer,
        src: Sequence[str],
        tgt: Sequence[str],
        max_positions: int | None = None,
    ) -> ParallelDataset:
        """Encode both sides; pairs that need more than ``max_positions`` positions (target
        + BOS/EOS) are dropped and counted in ``dropped_long``."""
        src_ids, tgt_ids = tokenizer.encode_batch(src), tokenizer.encode_target_batch(tgt)
        keep_src, keep_tgt, dropped = [], [], 0
        for s, t in zip(src_ids, tgt_ids):
            if max_positions and (len(s) > max_positions or len(t) + 1 > max_positions):
                dropped += 1
            else:
                keep_src.append(s)
                keep_tgt.append(t)
        return cls(keep_src, keep_tgt, dropped, special_ids(tokenizer))

    def __len__(self) -> int:
        return len(self.src_ids)

    @property
    def n_tgt_tokens(self) -> int:
        return sum(len(t) + 1 for t in self.tgt_ids)

    def batches(self, max_tokens: int, seed: int = 0, epoch: int = 0) -> Iterator[Batch]:
        src_lens = [len(s) for s in self.src_ids]
        tgt_lens = [len(t) for t in self.tgt_ids]
        for index in token_batches(src_lens, tgt_lens, max_tokens, seed, epoch):
            src, tgt = [self.src_ids[i] for i in index], [self.tgt_ids[i] for i in index]
            yield collate(src, tgt, *self.special)


def special_ids(tokenizer: Tokenizer) -> tuple[int, int, int]:
    """The (pad, BOS, EOS) ids of ``tokenizer``, as :func:`collate` takes them."""
    return tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
