"""aiayn.data.batching with a pad id other than 0 (Marian's), padding that must never
cut a batch, the dataset's token count and the small helpers' contracts."""

from __future__ import annotations

import pytest
import torch

from aiayn.data.batching import (
    Batch,
    ParallelDataset,
    bucket_length,
    check_batch_size,
    collate,
    sorted_batches,
)
from aiayn.errors import CorpusError

PAD, BOS, EOS = 7, 8, 9  # a vocabulary whose pad is not 0


def test_collate_pads_every_tensor_with_the_given_pad_id():
    batch = collate([[5, 6, 3], [4]], [[10, 11], [12, 13, 14]], PAD, BOS, EOS)
    assert batch.src.tolist() == [[5, 6, 3], [4, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 10, 11, PAD], [BOS, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[10, 11, EOS, PAD], [12, 13, 14, EOS]]
    assert batch.pad_id == PAD


def test_padding_a_batch_adds_pad_id_columns_and_keeps_every_token():
    batch = collate([[5, 6, 3], [4]], [[10, 11], [12, 13, 14]], PAD, BOS, EOS)
    wide = batch.padded_to(5, 6)
    assert wide.src.tolist() == [[5, 6, 3, PAD, PAD], [4, PAD, PAD, PAD, PAD]]
    assert wide.tgt_out.tolist() == [[10, 11, EOS, PAD, PAD, PAD], [12, 13, 14, EOS, PAD, PAD]]
    assert wide.tgt_in[:, 4:].eq(PAD).all()
    assert (wide.n_src_tokens, wide.n_tgt_tokens) == (batch.n_src_tokens, batch.n_tgt_tokens)


@pytest.mark.parametrize("multiple", [2, 4, 8])
def test_padded_to_multiple_rounds_up_and_never_cuts(multiple):
    batch = collate([[5, 6, 3]], [[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]])  # S 3, T 11
    padded = batch.padded_to_multiple(multiple)
    S, T = padded.src.size(1), padded.tgt_in.size(1)
    assert S % multiple == 0 and T % multiple == 0
    assert 3 <= S < 3 + multiple and 11 <= T < 11 + multiple
    assert padded.src[:, :3].equal(batch.src) and padded.tgt_out[:, :11].equal(batch.tgt_out)
    assert padded.tgt_in[:, :11].equal(batch.tgt_in)


def test_padded_to_bucket_holds_the_longer_side_whichever_it_is():
    long_target = collate([[5]], [list(range(10, 21))])  # S 1, T 12
    padded = long_target.padded_to_bucket(64)
    assert padded.src.shape == padded.tgt_in.shape == padded.tgt_out.shape == (2, 12)
    assert padded.tgt_out[0, :12].equal(long_target.tgt_out[0])
    long_source = collate([list(range(10, 23))], [[5]])  # S 13, T 2
    assert long_source.padded_to_bucket(64).src.shape == (2, 16)


def test_padded_to_bucket_of_a_batch_already_two_rows():
    batch = collate([[5, 6], [7]], [[8], [9, 10]], PAD, BOS, EOS).padded_to_bucket(64)
    assert batch.src.shape == (2, 8) and batch.tgt_out[:, 3:].eq(PAD).all()


def test_bucket_length_never_goes_below_the_length():
    assert bucket_length(300, 200) == 300
    assert bucket_length(50, 40) == 50
    assert bucket_length(13, 14) == 14  # the bucket 16 capped at max_len


def test_the_dataset_counts_each_target_with_its_eos():
    data = ParallelDataset([[5], [6, 7]], [[8, 9], [10]])
    assert data.n_tgt_tokens == 5
    assert data.n_tgt_tokens == sum(b.n_tgt_tokens for b in data.batches(1000))


def test_the_dataset_batches_with_its_own_special_ids():
    data = ParallelDataset([[5, 6], [3]], [[10], [11, 12]], special=(PAD, BOS, EOS))
    (batch,) = list(data.batches(1000))
    assert batch.pad_id == PAD
    assert sorted(batch.tgt_in.tolist()) == [[BOS, 10, PAD], [BOS, 11, 12]]
    assert sorted(batch.tgt_out.tolist()) == [[10, EOS, PAD], [11, 12, EOS]]
    assert PAD in batch.src.tolist()[0] + batch.src.tolist()[1]


def test_sorted_batches_skip_empty_rows():
    rows = [[1, 2, 3], [], [4], [5, 6]]
    got = list(sorted_batches(rows, 2, pad_id=PAD))
    assert [index for index, _ in got] == [[2, 3], [0]]
    assert got[0][1].tolist() == [[4, PAD], [5, 6]]
    assert list(sorted_batches([[], []], 4)) == []
    # Array and tensor rows (a prepared split's ids) failed in the emptiness test.
    import numpy as np

    arrays = [np.array(r, dtype=np.int64) for r in rows]
    tensors = [torch.tensor(r, dtype=torch.long) for r in rows]
    for same in (arrays, tensors):
        again = list(sorted_batches(same, 2, pad_id=PAD))
        assert [(i, t.tolist()) for i, t in again] == [(i, t.tolist()) for i, t in got]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_check_batch_size_refuses_anything_but_a_positive_int(bad):
    with pytest.raises(CorpusError, match="batch_size must be an integer >= 1"):
        check_batch_size(bad)


def test_check_batch_size_takes_1():
    check_batch_size(1)


def test_a_batch_keeps_its_pad_id_through_every_transformation():
    batch = Batch(torch.tensor([[1]]), torch.tensor([[2]]), torch.tensor([[3]]), 1, 1, PAD)
    for b in (batch.padded_to(2, 3), batch.padded_to_multiple(4), batch.padded_to_bucket(64)):
        assert b.pad_id == PAD and b.src[0, 1:].eq(PAD).all() and b.tgt_out[0, 1:].eq(PAD).all()
