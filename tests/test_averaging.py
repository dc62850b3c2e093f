"""Gaps a mutation run found in train/averaging.py: which checkpoint's state an average
keeps, what it drops, and the refusals' messages."""

from __future__ import annotations

import pytest
import torch

from aiayn.checkpoint import CheckpointError, save_checkpoint
from aiayn.data.tokenizer import Tokenizer
from aiayn.train.averaging import average_checkpoints
from sample_data import PAIRS


def state(value: float, **extra) -> dict:
    """A checkpoint's state: two weights, a config and whatever else ``extra`` holds."""
    return {
        "model": {"w": torch.full((2, 3), value), "steps": torch.tensor(1)},
        "config": {"src_vocab_size": 10, "tgt_vocab_size": 10},
        **extra,
    }


def test_the_average_keeps_the_state_of_the_highest_step_in_any_order(tmp_path):
    """The newest checkpoint is the one of the highest step, wherever it is in the list
    (``--last`` lists by name, and an epoch's checkpoint may come after a later timed one)."""
    steps = {"a.pt": 30, "b.pt": 10, "c.pt": 20}
    paths = [
        save_checkpoint(state(float(i), step=s, epoch=i), tmp_path / name)
        for i, (name, s) in enumerate(steps.items())
    ]
    avg = average_checkpoints(paths)
    assert (avg["step"], avg["epoch"]) == (30, 0)
    assert avg["model"]["w"][0, 0].item() == 1.0
    assert avg["averaged_from"] == [str(p) for p in paths]


def test_checkpoints_without_a_step_average(tmp_path):
    """Bare weights (no step recorded) average too, the newest being a checkpoint that
    records one, if any does."""
    bare = [save_checkpoint(state(v), tmp_path / f"bare{v}.pt") for v in (1.0, 3.0)]
    avg = average_checkpoints(bare)
    assert avg["model"]["w"][0, 0].item() == 2.0 and "step" not in avg
    stepped = save_checkpoint(state(5.0, step=1), tmp_path / "stepped.pt")
    for paths in ([bare[0], stepped], [stepped, bare[0]]):
        avg = average_checkpoints(paths)
        assert avg["step"] == 1 and avg["model"]["w"][0, 0].item() == 3.0


def test_an_average_holds_no_training_state_to_resume(tmp_path):
    """Averaging makes the optimizer's moments, the schedule's position and the random
    generators' states meaningless: the average holds none of them (and so is not taken
    for a run to resume), only the weights, config and the newest one's other entries."""
    training = {
        "step": 3,
        "optimizer": {"state": {}},
        "schedule": {"step": 3},
        "rng": {"torch": torch.zeros(4, dtype=torch.uint8)},
        "note": "kept",
    }
    paths = [save_checkpoint(state(v, **training), tmp_path / f"{v}.pt") for v in (1.0, 2.0)]
    avg = average_checkpoints(paths)
    assert not {"optimizer", "schedule", "rng"} & avg.keys()
    assert avg["note"] == "kept" and avg["step"] == 3 and avg["config"]["src_vocab_size"] == 10


def test_refusals_name_the_checkpoint_and_the_one_it_differs_from(tmp_path):
    """A checkpoint that differs is named with the first one, the checkpoint it is
    compared with (not its neighbour), and the error says why averaging needs them alike."""
    with pytest.raises(CheckpointError, match=r"^no checkpoints to average$"):
        average_checkpoints([])
    a, b = (save_checkpoint(state(v), tmp_path / f"{n}.pt") for v, n in ((1.0, "a"), (2.0, "b")))
    other = state(3.0)
    other["config"] = {"src_vocab_size": 12, "tgt_vocab_size": 12}
    c = save_checkpoint(other, tmp_path / "c.pt")
    with pytest.raises(CheckpointError) as e:
        average_checkpoints([a, b, c])
    assert str(e.value) == f"{c}: model config differs from {a}; cannot average"
    # Integer weights: averaged, then cast back, they made a model of nonsense (exit 0).
    ints = state(3.0)
    ints["model"]["w"] = ints["model"]["w"].long()
    save_checkpoint(ints, c)
    with pytest.raises(CheckpointError) as e:
        average_checkpoints([a, b, c])
    assert str(e.value) == (
        f"{c}: weight 'w' has dtype torch.int64, but torch.float32 in {a}; cannot average"
    )
    real = state(1.0)  # a weight of the model itself, integer in the first checkpoint
    real["model"]["src_embed.weight"] = torch.zeros(10, 512, dtype=torch.long)
    first = save_checkpoint(real, tmp_path / "first.pt")
    with pytest.raises(CheckpointError, match=r"'src_embed\.weight' holds int64 values, not float"):
        average_checkpoints([first, b])
    words = [s for p in PAIRS for s in p]
    tokenizer = Tokenizer.train(words, tmp_path / "spm", 60, num_threads=1).to_bytes()
    save_checkpoint(state(3.0, tokenizer=tokenizer), c)
    with pytest.raises(CheckpointError, match=r"must share one vocabulary$"):
        average_checkpoints([a, b, c])
