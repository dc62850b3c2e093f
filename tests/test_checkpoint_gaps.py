"""Gaps that a mutation run of aiayn.checkpoint found: each side's vocabulary size and each
special id of the tokenizer a model was built for, the entries a checkpoint must have and
their kinds, and which files count as a run's epoch or timed checkpoints."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from aiayn.checkpoint import (
    CheckpointError,
    check_entries,
    check_vocab,
    epoch_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from conftest import tiny_config


def cfg(**overrides) -> dict:
    return tiny_config(**overrides).to_dict()  # 23 source, 29 target tokens


def tokenizer(src=23, tgt=29, pad=0, bos=1, eos=2):
    return SimpleNamespace(
        src_vocab_size=src, tgt_vocab_size=tgt, pad_id=pad, bos_id=bos, eos_id=eos
    )


def test_a_tokenizer_must_fit_both_vocabularies_and_every_special_id(tmp_path):
    state, path = {"config": cfg(pad_id=0, bos_id=1, eos_id=2)}, tmp_path / "c.pt"
    check_vocab(state, tokenizer(), path, "the tokenizer")
    for wrong in (tokenizer(src=24), tokenizer(tgt=30)):
        with pytest.raises(CheckpointError, match="vocabulary size"):
            check_vocab(state, wrong, path, "the tokenizer")
    for name, wrong in [
        ("pad_id", tokenizer(pad=5)),
        ("bos_id", tokenizer(bos=5)),
        ("eos_id", tokenizer(eos=5)),
    ]:
        with pytest.raises(
            CheckpointError, match=f"the model's {name} is .* but the tokenizer says 5"
        ):
            check_vocab(state, wrong, path, "the tokenizer")


@pytest.mark.parametrize("missing", ["model", "config"])
def test_a_checkpoint_without_its_model_or_config_is_named(tmp_path, missing):
    state = {"model": {"w": torch.ones(2)}, "config": cfg()}
    del state[missing]
    path = save_checkpoint(state, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=f"checkpoint has no '{missing}' entry"):
        load_checkpoint(path)


def test_malformed_entries_are_named(tmp_path):
    path = tmp_path / "c.pt"
    with pytest.raises(CheckpointError, match="entry 'model' is malformed"):
        check_entries({"config": cfg(), "model": {1: torch.ones(2)}}, path)  # a name not text
    with pytest.raises(CheckpointError, match="entry 'generation' is malformed"):
        check_entries({"config": cfg(), "model": {}, "generation": ["num_beams", 4]}, path)
    with pytest.raises(CheckpointError, match="entry 'config' is malformed"):
        check_entries({"config": {**cfg(), 1: 2}, "model": {}}, path)  # a field name not text


def test_a_directory_is_not_a_checkpoint_file(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        load_checkpoint(tmp_path)


def test_only_the_names_a_run_writes_are_its_epoch_and_timed_checkpoints(tmp_path):
    kept = ["checkpoint_epoch001.pt", "checkpoint_step0000100.pt"]
    others = [
        "checkpoint_epoch01.pt",
        "checkpoint_step000010.pt",
        "checkpoint_epoch002.pt.bak",
        "checkpoint_epoch003.ptx",
        "checkpoint_epoch004_copy.pt",
    ]
    for step, name in enumerate(kept + others):
        save_checkpoint({"model": {}, "config": cfg(), "step": step}, tmp_path / name)
    assert [p.name for p in epoch_checkpoints(tmp_path)] == kept


def test_a_pruned_checkpoint_is_left_out_and_a_broken_link_refused(tmp_path):
    save_checkpoint({"model": {}, "config": cfg(), "step": 1}, tmp_path / "checkpoint_epoch001.pt")
    os.symlink(tmp_path / "gone.pt", tmp_path / "checkpoint_epoch002.pt")
    with pytest.raises(CheckpointError, match="a broken link to"):
        epoch_checkpoints(tmp_path)


def test_an_unreadable_epoch_checkpoint_is_listed_newest(tmp_path):
    save_checkpoint({"model": {}, "config": cfg(), "step": 5}, tmp_path / "checkpoint_epoch002.pt")
    (tmp_path / "checkpoint_epoch001.pt").write_bytes(b"not a checkpoint")  # damaged
    names = [p.name for p in epoch_checkpoints(tmp_path)]
    assert names == ["checkpoint_epoch002.pt", "checkpoint_epoch001.pt"]  # for an average to name


def test_model_specs_with_colons(tmp_path):
    from aiayn.checkpoint import split_model_spec

    run = tmp_path / "run:1"  # an existing path is taken whole, colon and all
    run.mkdir()
    assert split_model_spec(str(run)) == (run, "auto")
    assert split_model_spec(f"{tmp_path}/a:b:best") == (tmp_path / "a:b", "best")  # the last ':'


def test_generation_settings_are_a_copy(tmp_path):
    from aiayn.checkpoint import generation_settings

    state = {"generation": {"num_beams": 4}}
    settings = generation_settings(state)
    settings["num_beams"] = 1
    assert state["generation"] == {"num_beams": 4}


def test_int8_may_ask_for_the_auto_device():
    from aiayn.checkpoint import check_inference_settings

    check_inference_settings("auto", True, "fp32")  # auto: int8 runs on the CPU anyway


def test_a_loaded_model_is_in_eval_mode(sample_model_dir):
    from aiayn.checkpoint import load_model, resolve_checkpoint

    model, _ = load_model(resolve_checkpoint(sample_model_dir()))
    assert not model.training and not any(m.training for m in model.modules())


def test_a_model_built_for_other_special_ids_than_its_tokenizers_is_refused(
    sample_model_dir, tmp_path
):
    from aiayn.checkpoint import BEST, load_model

    state = load_checkpoint(sample_model_dir() / BEST)
    state["config"]["bos_id"] = state["config"]["eos_id"] + 1  # the weights still fit
    path = save_checkpoint(state, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"the model's bos_id is .* its tokenizer says"):
        load_model(path)
