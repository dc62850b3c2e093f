"""Bad arguments to the model, its config, checkpoints, the tokenizer and the alignment
layer: each refused with one AiaynError naming the argument and what is wrong with it,
never a torch or Python error from deep inside, a misleading message, or wrong numbers."""

from __future__ import annotations

import pytest
import torch

from aiayn import Transformer, TransformerConfig
from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode.alignment import cross_attention, layer_index
from aiayn.errors import (
    CheckpointError,
    ConfigError,
    DecodeError,
    ModelInputError,
    TokenizerError,
)
from conftest import random_batch, tiny_config
from sample_data import PAIRS


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


@pytest.fixture(scope="module")
def batch(tiny):
    src, tgt = random_batch(tiny.cfg, [3, 5], [4, 2])
    with torch.no_grad():
        return src, tgt, tiny.encode(src)


def refusal(call) -> str:
    with pytest.raises(ModelInputError) as e:
        call()
    return str(e.value)


# -- 1. devices: every tensor on the model's device ------------------------------------------
@pytest.mark.parametrize("moved", ["tgt_in", "memory", "src"])
def test_decode_names_a_tensor_on_another_device(tiny, batch, moved):
    """A src on "meta" gave wrong logits silently (its mask read uninitialised memory); a
    tgt_in there a RuntimeError from Tensor.item(), a memory there torch's device error."""
    src, tgt, memory = batch
    args = {"tgt_in": tgt, "memory": memory, "src": src}
    args[moved] = args[moved].to("meta")
    with torch.no_grad():
        message = refusal(lambda: tiny.decode(args["tgt_in"], args["memory"], args["src"]))
    assert message == f"{moved} is on device meta but the model is on cpu; move one of them"


def test_a_state_and_forward_with_attention_check_devices_too(tiny, batch):
    src, tgt, memory = batch
    message = refusal(lambda: tiny.start_state(memory.to("meta")))
    assert message.startswith("memory is on device meta but the model is on cpu")
    message = refusal(lambda: tiny.forward_with_attention(src, tgt.to("meta")))
    assert message == "tgt_in is on device meta but src is on cpu; move one of them"
    message = refusal(lambda: tiny.forward_with_attention(src.to("meta"), tgt.to("meta")))
    assert message.startswith("src is on device meta but the model is on cpu")
    state = tiny.start_state(memory)  # a state's steps are checked like the first
    with torch.no_grad():
        tiny.decode(tgt[:, :1], memory, src, state)
        message = refusal(lambda: tiny.decode(tgt[:, 1:2].to("meta"), memory, src, state))
    assert message.startswith("tgt_in is on device meta")


def test_good_inputs_give_the_same_logits_as_before(tiny, batch):
    src, tgt, memory = batch
    with torch.no_grad():
        full = tiny(src, tgt)
        state, steps = tiny.start_state(memory), []
        for t in range(tgt.size(1)):
            steps.append(tiny.decode(tgt[:, t : t + 1], memory, src, state))
        with_attention, _ = tiny.forward_with_attention(src, tgt)
    torch.testing.assert_close(torch.cat(steps, dim=1)[0], full[0])  # row 0 has no padding
    torch.testing.assert_close(with_attention, full)


# -- 2. ranks: not called batch sizes ------------------------------------------------------
def test_one_dimensional_inputs_are_named_by_their_shape(tiny, batch):
    """model(src_1d, tgt_1d) said "batch sizes differ: src has 5 rows, tgt_in 4"."""
    src, tgt, _ = batch
    for call in (lambda: tiny(src[1], tgt[0]), lambda: tiny.forward_with_attention(src[1], tgt[0])):
        assert refusal(call) == "src must have shape [batch, length], got (5,)"
    assert refusal(lambda: tiny(src, tgt[0])) == "tgt_in must have shape [batch, length], got (4,)"
    assert refusal(lambda: tiny(src[:1], tgt)) == "batch sizes differ: src has 1 rows, tgt_in 2"
    message = refusal(lambda: tiny.forward_with_attention(src[:1], tgt))
    assert message == "batch sizes differ: src has 1 rows, tgt_in 2"


# -- 3. a state for other rows -------------------------------------------------------------
def test_a_state_started_for_other_rows_is_named(tiny, batch):
    """A state of 2 rows fed 1 gave torch's "expanded size of the tensor" error."""
    src, tgt, memory = batch
    state = tiny.start_state(memory)
    with torch.no_grad():
        message = refusal(lambda: tiny.decode(tgt[:1, :1], memory[:1], src[:1], state))
    assert message.startswith("state holds 2 target rows but tgt_in has 1;")
    state.reorder(torch.tensor([1]))  # reordered to one row: it takes that row
    with torch.no_grad():
        tiny.decode(tgt[1:, :1], memory[1:], src[1:], state)
    grouped = tiny.start_state(memory[:1], group=2)  # 2 target rows of 1 source
    grouped.reorder(torch.tensor([0, 1, 0, 1]), cross=False)  # 4 rows, of the 1 source
    with torch.no_grad():
        message = refusal(lambda: tiny.decode(tgt[[0, 1, 0, 1], :1], memory, src, grouped))
    assert message.startswith("state holds the encoder-decoder keys of 1 source rows, 2 target")


# -- 4. memory in another dtype ------------------------------------------------------------
def test_memory_of_another_dtype_is_named_outside_autocast(tiny, batch):
    """bf16 memory into a float32 model gave torch's "mat1 and mat2 must have the same dtype"."""
    src, tgt, memory = batch
    want = (
        "memory has dtype torch.bfloat16 but the model's weights are torch.float32; "
        "cast one of them (or run under torch.autocast)"
    )
    with torch.no_grad():
        assert refusal(lambda: tiny.decode(tgt, memory.bfloat16(), src)) == want
        assert refusal(lambda: tiny.start_state(memory.bfloat16())) == want
        with torch.autocast("cpu", dtype=torch.bfloat16):  # where the dtypes may differ
            logits = tiny.decode(tgt, memory.bfloat16(), src)
    assert logits.shape == (2, 4, tiny.cfg.tgt_vocab_size)


# -- 5. alignment layers ------------------------------------------------------------------
@pytest.mark.parametrize("layer", [1.0, "1", True, None])
def test_a_layer_that_is_no_integer_is_named(tiny, batch, layer):
    """layer=1.0 or "1" gave "list indices must be integers" from add_alignments; True
    read as layer 1."""
    with pytest.raises(DecodeError, match=rf"^layer {layer!r}: not an integer; the model has 2"):
        layer_index(layer, 2)
    src, tgt, _ = batch
    with pytest.raises(DecodeError, match=rf"^layer {layer!r}: not an integer"):
        cross_attention(tiny, src, tgt, layer)


def test_integer_layers_still_work():
    assert [layer_index(i, 3) for i in (1, 3, -1, -3)] == [0, 2, 2, 0]
    assert layer_index(torch.tensor(2), 3) == 1  # anything with __index__
    with pytest.raises(DecodeError, match=r"^layer 4: the model has 3 decoder layers"):
        layer_index(4, 3)


# -- 6. configs ----------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "kind"), [(None, "NoneType"), ([("d_model", 8)], "list")])
def test_from_dict_names_what_it_needs(data, kind):
    with pytest.raises(ConfigError, match=rf"^TransformerConfig.from_dict needs a dict .*{kind}$"):
        TransformerConfig.from_dict(data)
    with pytest.raises(ConfigError, match=r"unknown field\(s\) 1, x"):
        TransformerConfig.from_dict({1: 2, "x": 3, "src_vocab_size": 10, "tgt_vocab_size": 10})


def test_a_model_of_a_dict_points_to_from_dict():
    cfg = {"src_vocab_size": 10, "tgt_vocab_size": 10}
    with pytest.raises(ConfigError) as e:
        Transformer(cfg)  # type: ignore[arg-type]
    assert str(e.value) == (
        "cfg must be a TransformerConfig, got dict; make one with TransformerConfig.from_dict"
    )
    with pytest.raises(ConfigError, match=r"^cfg must be a TransformerConfig, got NoneType$"):
        Transformer(None)  # type: ignore[arg-type]
    assert Transformer(TransformerConfig.from_dict(cfg)).cfg.src_vocab_size == 10


# -- 7. map_location ----------------------------------------------------------------------
def test_a_bad_map_location_is_named_not_a_corrupt_file(tmp_path, monkeypatch):
    state = {"model": {"w": torch.ones(2)}, "config": {"src_vocab_size": 10, "tgt_vocab_size": 10}}
    path = save_checkpoint(state, tmp_path / "c.pt")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, map_location="nope")
    assert str(e.value) == (
        "map_location: device 'nope': not a device name (cpu, cuda, cuda:N, auto)"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CheckpointError, match=r"^map_location: device cuda: this machine has no"):
        load_checkpoint(path, map_location=torch.device("cuda"))
    for good in ("cpu", "auto", torch.device("cpu"), {"cpu": "cpu"}):
        assert load_checkpoint(path, map_location=good)["model"]["w"].device.type == "cpu"


def test_resolve_device_is_still_importable_from_checkpoint():
    from aiayn.checkpoint import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")


# -- 9. Tokenizer.decode takes one sequence ------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("spm")
    return Tokenizer.train([s for p in PAIRS for s in p], folder / "t", 60, num_threads=1)


def test_tokenizer_decode_refuses_a_batch(tokenizer):
    """A 2-D tensor gave a list of strings (and no cut at EOS) instead of a str."""
    ids = tokenizer.encode(PAIRS[0][0])[:4]
    want = tokenizer.decode(ids)
    assert isinstance(want, str) and want
    assert tokenizer.decode(torch.tensor(ids)) == tokenizer.decode(tuple(ids)) == want
    with pytest.raises(TokenizerError) as e:
        tokenizer.decode(torch.tensor([ids, ids]))
    assert str(e.value) == (
        "ids: one sequence of token ids (1-D), got a 2-D Tensor; decode_batch takes a batch"
    )
    with pytest.raises(TokenizerError, match=r"^ids: one sequence of token ids \(1-D\), got a 0-D"):
        tokenizer.decode(torch.tensor(5))
    with pytest.raises(TokenizerError, match=r"^ids\[0\]: \[.*\] is not a token id \(an int\)$"):
        tokenizer.decode([ids, ids])
    assert tokenizer.decode_batch(torch.tensor([ids, ids])) == [want, want]


def test_average_checkpoints_refuses_one_path_given_as_the_list(tmp_path):
    """A str was iterated character by character ("/: is a directory")."""
    from aiayn.train.averaging import average_checkpoints

    for one in (str(tmp_path / "ckpt.pt"), tmp_path / "ckpt.pt"):
        with pytest.raises(CheckpointError, match=r"paths: a list of checkpoint paths, not one"):
            average_checkpoints(one)
