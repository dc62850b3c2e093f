"""aiayn.data.batching behaviour the other tests leave loose: a batch moved to a device
keeps its counts, padding to a multiple adds nothing to a length already one, the weightless
second row of a one-row bucketed batch, length sorting past 16-bit lengths, and the
max_positions filter's boundaries."""

from __future__ import annotations

import pytest

from aiayn.data.batching import ParallelDataset, collate, token_batches

PAD, BOS, EOS = 7, 8, 9  # a vocabulary whose pad is not 0


def test_a_batch_moved_to_a_device_keeps_its_counts_and_pad_id():
    batch = collate([[5, 6, 3], [4]], [[10, 11], [12]], PAD, BOS, EOS)
    moved = batch.to("cpu")
    assert (moved.n_src_tokens, moved.n_tgt_tokens, moved.pad_id) == (4, 5, PAD)
    assert moved.src.equal(batch.src) and moved.tgt_out.equal(batch.tgt_out)


def test_padded_to_multiple_leaves_a_length_already_a_multiple():
    batch = collate([[5, 6, 3, 4]], [[10, 11, 12]])  # S 4, T 4 (BOS + 3)
    padded = batch.padded_to_multiple(4)
    assert padded.src.shape == padded.tgt_in.shape == padded.tgt_out.shape == (1, 4)
    assert padded.padded_to_multiple(2).src.shape == (1, 4)


def test_the_second_row_of_a_one_row_bucketed_batch_weighs_nothing():
    """torch.compile needs two rows: the second is the first one's source and decoder input
    (never an all-pad source, which would leave cross-attention without a key) and an
    all-pad target, so the loss and token counts are the first row's alone."""
    batch = collate([[5, 6]], [[10, 11, 12]], PAD, BOS, EOS)
    padded = batch.padded_to_bucket(64)
    assert padded.src.tolist() == [[5, 6] + [PAD] * 6] * 2
    assert padded.tgt_in.tolist() == [[BOS, 10, 11, 12] + [PAD] * 4] * 2
    assert padded.tgt_out.tolist() == [[10, 11, 12, EOS] + [PAD] * 4, [PAD] * 8]
    assert (padded.n_src_tokens, padded.n_tgt_tokens, padded.pad_id) == (2, 4, PAD)


def test_batches_sort_by_target_length_past_16_bit_lengths():
    """Lengths of 2**16 and more are sorted by np.lexsort, not the uint16 radix passes
    (where 65536 would wrap to 0 and sort first); target length first, then source."""
    assert token_batches([1, 1, 1], [5, 1 << 16, 3], 10**6, 0, 0) == [[2, 0, 1]]
    assert token_batches([1 << 16, 1], [1, 2], 10**6, 0, 0) == [[0, 1]]
    assert token_batches([(1 << 16) - 1, 1], [1, 2], 10**6, 0, 0) == [[0, 1]]


class WordTokenizer:
    """Each word one id (5), no model: what from_texts needs of a tokenizer."""

    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def encode_batch(self, texts):
        return [[5] * len(t.split()) for t in texts]

    encode_target_batch = encode_batch


@pytest.mark.parametrize(
    ("src_words", "tgt_words", "kept"),
    [(4, 3, True), (5, 3, False), (4, 4, False), (1, 1, True)],
)
def test_max_positions_counts_the_targets_bos_or_eos(src_words, tgt_words, kept):
    """A source may use all max_positions positions; a target one fewer (its decoder input
    and labels each gain BOS or EOS)."""
    src, tgt = ["a " * src_words], ["b " * tgt_words]
    data = ParallelDataset.from_texts(WordTokenizer(), src, tgt, max_positions=4)
    assert (len(data), data.dropped_long) == ((1, 0) if kept else (0, 1))
    assert data.special == (PAD, BOS, EOS)


def test_max_positions_none_or_0_keeps_every_pair():
    for limit in (None, 0):
        data = ParallelDataset.from_texts(WordTokenizer(), ["a " * 50], ["b " * 50], limit)
        assert (len(data), data.dropped_long) == (1, 0)


def test_dataset_batches_default_to_seed_0_epoch_0():
    lens = [[5] * (1 + i % 7) for i in range(40)]
    data = ParallelDataset(lens, lens[::-1])
    default = [b.src.tolist() for b in data.batches(30)]
    assert default == [b.src.tolist() for b in data.batches(30, seed=0, epoch=0)]
    assert default != [b.src.tolist() for b in data.batches(30, seed=1, epoch=0)]


def test_a_dataset_refuses_sides_of_different_lengths():
    from aiayn.errors import CorpusError

    with pytest.raises(CorpusError, match="2 source but 1 target sentences"):
        ParallelDataset([[5], [6]], [[7]])
