"""What `aiayn import marian` and `aiayn export marian` refuse, each in one line that
names the file and the field (test_marian_import.py has the folders that are not Marian
models at all): a config aiayn's model cannot express, a tokenizer that disagrees with
its config, weights of the wrong shape or missing, and on export a LayerNorm epsilon
Marian cannot hold."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from aiayn import Transformer, TransformerConfig
from aiayn.checkpoint import BEST, load_checkpoint, save_checkpoint
from aiayn.cli import main
from cli_util import one_line_error
from marian_util import make_marian, write_tokenizer

pytestmark = [pytest.mark.multi30k, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    write_tokenizer(root / "tok")
    make_marian(root / "hf", root / "tok")
    return root / "hf"


def _config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _weights(folder, change) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _shards(folder) -> None:
    """Sharded weights with their second shard gone."""
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder, dtype=torch.float32)
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    second = sorted(set(index["weight_map"].values()))[1]
    (folder / second).unlink()


def _index_of_numbers(folder) -> None:
    """A shard index whose weight_map gives a number, not a file."""
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"a": 5}}')


def _tokenizer_config(folder, **changes) -> None:
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _generation(folder, **changes) -> None:
    """generation_config.json with ``changes`` (a None value removes the key)."""
    path = folder / "generation_config.json"
    settings = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in settings.items() if v is not None}))


def _config_without(folder, key: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    del config[key]
    (folder / "config.json").write_text(json.dumps(config))


def _null(path, key: str) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), key: None}))


def _pad(folder) -> int:
    return json.loads((folder / "config.json").read_text())["pad_token_id"]


def _settings_in_config(folder) -> None:
    """An older folder: no generation_config.json, config.json without bad_words_ids."""
    (folder / "generation_config.json").unlink()
    _config(folder, num_beams=4, max_length=20)


def _as_older_transformers_saved(folder) -> None:
    """Weights no MarianMTModel needs (position tables, tied copies, a zero final_logits_bias),
    transformers 3's BartConfig fields at Marian's values, a null generate() reads as unset."""

    def older(tensors: dict) -> None:
        for side in ("encoder", "decoder"):
            tensors[f"model.{side}.embed_positions.weight"] = torch.randn(256, 16)  # recomputed
            tensors[f"model.{side}.embed_tokens.weight"] = tensors["model.shared.weight"].clone()
        tensors["lm_head.weight"] = tensors["model.shared.weight"].clone()
        tensors["final_logits_bias"] = torch.zeros_like(tensors["final_logits_bias"])

    _weights(folder, older)
    _config(folder, normalize_before=False, normalize_embedding=False)
    _config(folder, add_final_layer_norm=False, static_position_embeddings=True)
    # null: unset, as in transformers' GenerationConfig (num_beams was int()'s TypeError;
    # temperature, top_k and top_p, which silence transformers 4's warnings, were refused)
    for key in ("max_length", "num_beams", "temperature", "top_k", "top_p", "length_penalty"):
        _null(folder / "generation_config.json", key)


def _cut(name: str, tensors: dict) -> None:
    tensors[name] = tensors[name][..., :-1].contiguous()


def _as(tensors: dict, name: str, dtype: torch.dtype) -> None:
    tensors[name] = tensors[name].to(dtype)


def _embedding_norms(tensors: dict) -> None:
    """LayerNorms on the embeddings (a BART's layernorm_embedding), which Marian has not."""
    for side in ("encoder", "decoder"):
        for kind in ("weight", "bias"):
            tensors[f"model.{side}.layernorm_embedding.{kind}"] = torch.ones(16)


BREAKS = {
    "dropout of text": (  # was float()'s "could not convert string to float: 'abc'"
        lambda f: _config(f, dropout="abc"),
        r"config\.json: dropout must be a number, got 'abc'",
    ),
    # Weights of layers the config leaves out were dropped without a word.
    "fewer encoder layers": (
        lambda f: _config(f, encoder_layers=1),
        r"model\.safetensors: \d+ layer weights that config\.json leaves out "
        r"\(model\.encoder\.layers\.1\..*\): it gives 1 encoder and 2 decoder layers",
    ),
    "fewer decoder layers": (
        lambda f: _config(f, decoder_layers=1),
        r"layer weights that config\.json leaves out \(model\.decoder\.layers\.1\.",
    ),
    "heads": (
        lambda f: _config(f, decoder_attention_heads=2),
        r"config\.json: encoder_attention_heads=4 but decoder_attention_heads=2",
    ),
    "ffn": (
        lambda f: _config(f, decoder_ffn_dim=64),
        r"config\.json: encoder_ffn_dim=32 but decoder_ffn_dim=64",
    ),
    "activation": (
        lambda f: _config(f, activation_function="tanh"),
        r"config\.json: activation_function 'tanh' is not supported",
    ),
    "eos ids": (
        lambda f: _config(f, eos_token_id=[0, 1]),
        r"config\.json: eos_token_id \[0, 1\]: aiayn stops at one EOS id",
    ),
    "pad": (
        lambda f: _config(f, pad_token_id=5),
        r"vocab\.json: the tokenizer's pad_id is \d+, config\.json's pad_token_id is 5",
    ),
    "eos": (
        lambda f: _config(f, eos_token_id=5, forced_eos_token_id=5),
        r"vocab\.json: the tokenizer's eos_id is 0, config\.json's eos_token_id is 5",
    ),
    "embedding": (
        lambda f: _weights(f, lambda t: _cut("model.shared.weight", t)),
        r"model\.safetensors: the source embedding has shape \(\d+, 15\), config\.json's "
        r"vocab_size and d_model make it \(\d+, 16\)",
    ),
    # Weights the model has no place for were dropped, integers cast, without a word.
    "embedding LayerNorms": (
        lambda f: _weights(f, _embedding_norms),
        r"model\.safetensors: 4 weights that aiayn's model \(and a MarianMTModel\) has no "
        r"place for: model\.decoder\.layernorm_embedding\.bias, model\.decoder\.layernorm_"
        r"embedding\.weight, model\.encoder\.layernorm_embedding\.bias and 1 more; importing",
    ),
    "a final LayerNorm": (
        lambda f: _weights(
            f, lambda t: t.update({"model.decoder.layer_norm.weight": torch.ones(16)})
        ),
        r"model\.safetensors: 1 weight that aiayn's model \(and a MarianMTModel\) has no place "
        r"for: model\.decoder\.layer_norm\.weight; importing would drop it",
    ),
    "integer weight": (
        lambda f: _weights(f, lambda t: _as(t, "model.encoder.layers.0.fc1.weight", torch.long)),
        r"model\.safetensors: weight model\.encoder\.layers\.0\.fc1\.weight holds int64 values",
    ),
    "bool weight": (
        lambda f: _weights(f, lambda t: _as(t, "model.shared.weight", torch.bool)),
        r"model\.safetensors: weight model\.shared\.weight holds bool values",
    ),
    "a tied copy that differs": (  # transformers 5 unties it and computes with it
        lambda f: _weights(f, lambda t: t.update({"lm_head.weight": t["model.shared.weight"] + 1})),
        r"model\.safetensors: lm_head\.weight differs from model\.shared\.weight, which config",
    ),
    "output bias said to be none": (
        lambda f: _config(f, aiayn={"output_bias": False}),
        r"model\.safetensors: final_logits_bias is not all zeros, but config\.json's aiayn\.",
    ),
    "weight": (
        lambda f: _weights(f, lambda t: _cut("model.encoder.layers.1.fc1.weight", t)),
        r"model\.safetensors: weight model\.encoder\.layers\.1\.fc1\.weight has shape "
        r"\(32, 15\), the config makes it \(32, 16\)",
    ),
    "attention weight": (
        lambda f: _weights(f, lambda t: _cut("model.decoder.layers.0.encoder_attn.k_proj.bias", t)),
        r"model\.safetensors: weight model\.decoder\.layers\.0\.encoder_attn\.k_proj\.bias has "
        r"shape \(15,\), the config makes it \(16,\)",
    ),
    "shard": (_shards, r"model-00002-of-\d+\.safetensors: missing \(listed in model\.safetensors"),
    "shard index": (  # was a TypeError from deep inside pathlib
        _index_of_numbers,
        r"model\.safetensors\.index\.json: weight_map\['a'\] is not a file name",
    ),
    "a weight missing": (  # the file was named twice
        lambda f: _weights(f, lambda t: t.pop("model.decoder.layers.1.encoder_attn.k_proj.weight")),
        r"error: [^:]+/model\.safetensors: no weight model\.decoder\.layers\.1\.encoder_attn",
    ),
    "NaN weight": (  # imported into a model that nothing could load
        lambda f: _weights(f, lambda t: t["model.encoder.layers.0.fc1.bias"].fill_(float("nan"))),
        r"model\.safetensors: weight model\.encoder\.layers\.0\.fc1\.bias holds NaN or inf",
    ),
    "separate vocabularies": (
        lambda f: _tokenizer_config(f, separate_vocabs=True),
        r"/tokenizer_config\.json: separate_vocabs is set, but there is no target_vocab\.json",
    ),
    "source.spm": (lambda f: (f / "source.spm").unlink(), r"source\.spm: missing"),
    # Generation settings generate() would decode otherwise with than aiayn's searches do.
    "more bad_words_ids": (
        lambda f: _generation(f, bad_words_ids=[[_pad(f)], [5]]),
        r"generation_config\.json: bad_words_ids \[\[\d+\], \[5\]\]: aiayn's searches ban",
    ),
    "a bad word sequence": (
        lambda f: _generation(f, bad_words_ids=[[_pad(f)], [5, 6]]),
        r"generation_config\.json: bad_words_ids \[\[\d+\], \[5, 6\]\]: aiayn's searches",
    ),
    "settings in config.json": (
        lambda f: (_settings_in_config(f), _config(f, no_repeat_ngram_size=3)),
        r"config\.json: no_repeat_ngram_size 3: aiayn's searches have no such",
    ),
    "no_repeat_ngram_size": (
        lambda f: _generation(f, no_repeat_ngram_size=3),
        r"generation_config\.json: no_repeat_ngram_size 3: aiayn's searches have no such",
    ),
    "repetition_penalty": (
        lambda f: _generation(f, repetition_penalty=1.2),
        r"generation_config\.json: repetition_penalty 1\.2: aiayn's searches have no such",
    ),
    "forced_bos_token_id": (
        lambda f: _generation(f, forced_bos_token_id=5),
        r"generation_config\.json: forced_bos_token_id 5",
    ),
    "two eos ids": (
        lambda f: _generation(f, eos_token_id=[0, 5]),
        r"generation_config\.json: eos_token_id \[0, 5\]: aiayn decodes with the config's id 0",
    ),
    "another decoder start": (
        lambda f: _generation(f, decoder_start_token_id=5),
        r"generation_config\.json: decoder_start_token_id 5: aiayn decodes with the config's",
    ),
    # generate() reads its start and stop ids from generation_config.json alone, and
    # starts from bos_token_id without a decoder_start_token_id; aiayn took config.json's.
    "start from bos_token_id": (
        lambda f: _generation(f, decoder_start_token_id=None, bos_token_id=5),
        r"generation_config\.json: bos_token_id 5: generate\(\) starts from it",
    ),
    "no start id": (  # generate() raises; aiayn translated
        lambda f: _generation(f, decoder_start_token_id=None, bos_token_id=None),
        r"generation_config\.json: no decoder_start_token_id or bos_token_id, so generate",
    ),
    "no eos id": (  # generate() runs every output to its length limit
        lambda f: _generation(f, eos_token_id=None),
        r"generation_config\.json: no eos_token_id, so generate\(\) never stops at an EOS",
    ),
    "empty eos list": (  # generate() stops at no EOS
        lambda f: _generation(f, eos_token_id=[]),
        r"generation_config\.json: eos_token_id \[\]: an empty list; aiayn decodes with one",
    ),
    "empty start list": (  # generate() raises
        lambda f: _generation(f, decoder_start_token_id=[]),
        r"generation_config\.json: decoder_start_token_id \[\]: an empty list",
    ),
    "config.json only, no eos id": (  # transformers 5 reads config.json's as they are
        lambda f: (_settings_in_config(f), _config_without(f, "eos_token_id")),
        r"config\.json: no eos_token_id, so generate\(\) never stops at an EOS",
    ),
    # transformers 5's processors and stopping rules that aiayn lacks (they were ignored)
    "top_h": (
        lambda f: _generation(f, do_sample=True, top_h=0.2),
        r"generation_config\.json: top_h 0\.2: aiayn's searches have no such setting",
    ),
    "watermarking_config": (
        lambda f: _generation(f, watermarking_config={"greenlist_ratio": 0.25, "bias": 8.0}),
        r"generation_config\.json: watermarking_config \{.*\}: aiayn's searches have no",
    ),
    "max_time": (
        lambda f: _generation(f, max_time=0.5),
        r"generation_config\.json: max_time 0\.5: aiayn's searches have no such setting",
    ),
    "stop_strings": (
        lambda f: _generation(f, stop_strings=["."]),
        r"generation_config\.json: stop_strings \['\.'\]: aiayn's searches have no such",
    ),
    "empty stop_strings": (  # generate() stops after the first token
        lambda f: _generation(f, stop_strings=""),
        r"generation_config\.json: stop_strings '': aiayn's searches have no such setting",
    ),
    "negative length_penalty": (
        lambda f: _generation(f, length_penalty=-1.0),
        r"generation_config\.json: length_penalty -1\.0: aiayn's length penalty exponent",
    ),
    "negative max_length": (  # every translation came out empty
        lambda f: _generation(f, max_length=-5),
        r"generation_config\.json: .*max_length -5 leaves no room for an output token",
    ),
    "max_new_tokens 0": (
        lambda f: _generation(f, max_new_tokens=0),
        r"generation_config\.json: .*max_new_tokens 0 leaves no room for an output token",
    ),
    "beam sampling": (
        lambda f: _generation(f, do_sample=True, num_beams=4),
        r"generation_config\.json: num_beams 4: aiayn samples without a beam",
    ),
    "more outputs than beams": (  # was DecodeOptions' "n_best must be <= beam"
        lambda f: _generation(f, num_beams=2, num_return_sequences=3),
        r"generation_config\.json: num_return_sequences 3: more outputs than num_beams \(2\)",
    ),
}
# config.json fields named as aiayn's TransformerConfig names them (a start id equal to
# EOS was "TransformerConfig.eos_id"), taken as true ("false" is truthy), or a traceback.
for change, message in [
    (dict(decoder_start_token_id=0), "decoder_start_token_id=0 is also eos_token_id; EOS"),
    (dict(decoder_start_token_id=999), r"decoder_start_token_id must be in \[0, \d+\], got 999"),
    (dict(encoder_attention_heads=3, decoder_attention_heads=3), "d_model=16 is not divisible "),
    (dict(max_position_embeddings="512"), "max_position_embeddings must be an integer, got '5"),
    (dict(encoder_layers=0), "encoder_layers must be >= 1, got 0"),
    (dict(scale_embedding="false"), "scale_embedding must be true or false, got 'false'"),
    (dict(tie_word_embeddings="false"), "tie_word_embeddings must be true or false, got 'f"),
    (dict(activation_function=["relu"]), r"activation_function \['relu'\] is not supported"),
    (dict(normalize_before=True), "normalize_before True: Marian models have false"),  # BART's
]:
    name = "config " + " ".join(f"{k}={v!r}" for k, v in change.items())
    BREAKS[name] = (lambda f, c=change: _config(f, **c), r"config\.json: " + message)
# Numbers and switches of another JSON type were decoded with as int("4"), int(4.5),
# float(True) and bool("false") (true) make them, or refused without naming the field.
for key, value, kind in [
    ("num_beams", "4", "an integer"),
    ("num_beams", 4.5, "an integer"),
    ("max_length", True, "an integer"),
    ("length_penalty", "x", "a finite number"),
    ("temperature", "0.7", "a finite number"),
    ("do_sample", "false", "true or false"),
]:
    BREAKS[f"{key} {value!r}"] = (
        lambda f, setting={key: value}: _generation(f, **setting),
        rf"generation_config\.json: {key} {re.escape(repr(value))}: must be {kind}",
    )


@pytest.mark.parametrize("what", list(BREAKS))
def test_import_refusals_are_one_line_naming_file_and_field(marian, tmp_path, capsys, what):
    folder = tmp_path / "hf"
    shutil.copytree(marian, folder)
    change, message = BREAKS[what]
    change(folder)
    capsys.readouterr()  # transformers' progress bars, when it rewrote the weights
    out = tmp_path / "runs" / "imported"
    assert main(["import", "marian", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err
    assert str(folder) in err
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_model_an_older_aiayn_imported_with_settings_now_refused_is_noted(
    marian, tmp_path, capsys
):
    """An older aiayn imported settings generate() decodes otherwise with (here
    no_repeat_ngram_size) without a word; its model translated so, unsaid."""
    out = tmp_path / "imported"
    assert main(["import", "marian", str(marian), "--out", str(out)]) == 0
    (tmp_path / "in.txt").write_text("Ein Hund.\n", encoding="utf-8")
    translate = ["translate", "--model", str(out), "--quiet", str(tmp_path / "in.txt")]
    capsys.readouterr()
    assert main(translate) == 0
    assert "note:" not in capsys.readouterr().err  # a model imported now
    state = load_checkpoint(out / BEST)
    state["generation"]["no_repeat_ngram_size"] = 2  # as an older aiayn imported it
    save_checkpoint(state, out / BEST)
    assert main(translate) == 0
    err = capsys.readouterr().err
    assert "the model's generation settings: no_repeat_ngram_size 2: aiayn's searches" in err
    assert "imported by an older aiayn" in err and err.count("note:") == 1


def test_the_unbroken_folder_imports(marian, tmp_path, capsys):
    """The refusals above come from each break, not from the folder they start from. An
    --out that is a file is called one (it was "exists and is not empty")."""
    (tmp_path / "file").write_bytes(b"")
    err = one_line_error(["import", "marian", str(marian), "--out", str(tmp_path / "file")], capsys)
    assert f"{tmp_path / 'file'}: is a file, not a folder" in err
    assert main(["import", "marian", str(marian), "--out", str(tmp_path / "ok")]) == 0


def test_an_import_into_a_folder_another_is_writing_is_refused(marian, tmp_path, monkeypatch):
    """Two imports into one new --out at once: the second was a traceback (ENOTEMPTY from
    its rename) or replaced the first. The writing is held: an import meeting another is
    refused in one line, and one that finds --out written since it looked is refused."""
    import re

    from aiayn.data.folders import busy, held_output
    from aiayn.errors import AiaynError, ConversionError
    from aiayn.marian import folder as marian_folder
    from aiayn.marian import import_marian

    out = tmp_path / "out"
    held = pytest.raises(AiaynError, match=re.escape(busy(out)))
    with held_output(out, "the test's"), held:  # another import, writing
        import_marian(marian, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    real = marian_folder.MarianFolder

    def another_import_writes_meanwhile(folder):
        out.mkdir()
        (out / "theirs.pt").write_text("kept")
        return real(folder)

    monkeypatch.setattr(marian_folder, "MarianFolder", another_import_writes_meanwhile)
    with pytest.raises(ConversionError, match="exists and is not empty"):
        import_marian(marian, out)
    assert [p.name for p in out.iterdir()] == ["theirs.pt"]


@pytest.mark.parametrize(
    "change",
    [
        lambda f: _generation(f, renormalize_logits=True),  # as OPUS-MT folders have
        lambda f: _generation(f, bad_words_ids=None),  # an older or re-saved folder
        lambda f: _generation(f, bad_words_ids=[]),
        lambda f: _generation(f, decoder_start_token_id=None, bos_token_id=_pad(f)),
        _settings_in_config,  # no generation_config.json, no bad_words_ids in config.json
        _as_older_transformers_saved,
    ],
    ids=[
        "renormalize_logits",
        "no bad_words_ids",
        "empty bad_words_ids",
        "start id as bos_token_id",
        "config.json only",
        "older transformers",
    ],
)
def test_folders_as_published_import(marian, tmp_path, change):
    """What real folders carry is no reason to refuse: renormalize_logits true (its
    scores differ by log(1 - p(pad)) per step, 0 for a trained model), and no ban list
    (aiayn bans the pad anyway, which a trained model never outputs)."""
    folder = tmp_path / "hf"
    shutil.copytree(marian, folder)
    change(folder)
    assert main(["import", "marian", str(folder), "--out", str(tmp_path / "ok")]) == 0


# The GenerationConfig fields that cannot change which tokens generate() outputs (what
# it returns beside them, caches, speed-ups that keep the output, metadata), and
# renormalize_logits (see test_folders_as_published_import).
HARMLESS = {
    "_from_model_config", "transformers_version", "output_attentions", "output_hidden_states",
    "output_logits", "output_scores", "return_dict_in_generate", "use_cache", "cache_config",
    "cache_implementation", "compile_config", "disable_compile", "low_memory", "max_cache_len",
    "prefill_chunk_size", "continuous_batching_config", "remove_invalid_values",
    "renormalize_logits", "is_assistant", "assistant_confidence_threshold",
    "assistant_early_exit", "assistant_ensemble_weight", "assistant_lookbehind",
    "target_lookbehind", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "max_matching_ngram_size", "prompt_lookup_num_tokens", "speculation_type", "use_mtp",
}  # fmt: skip


def test_every_generation_field_is_read_refused_or_harmless():
    """Each field of the installed transformers' GenerationConfig is one aiayn reads
    (GENERATION_KEYS), refuses unless neutral (NEUTRAL) or knows cannot change the output:
    a field added by a newer transformers fails here until it is sorted (top_h,
    watermarking_config and max_time were ignored, and changed or cut outputs)."""
    from transformers import GenerationConfig

    from aiayn.marian.generation import NEUTRAL
    from aiayn.marian.weights import GENERATION_KEYS

    fields = set(GenerationConfig().to_dict())
    assert {"num_beams", "top_h", "bad_words_ids"} <= fields  # what the test reads
    sorted_out = {*GENERATION_KEYS, *NEUTRAL, *HARMLESS}
    assert fields - sorted_out == set()


def test_export_refuses_another_layer_norm_epsilon(sample_model_dir, tmp_path, capsys):
    state = load_checkpoint(sample_model_dir() / BEST)
    cfg = TransformerConfig.from_dict({**state["config"], "layer_norm_eps": 1e-6})
    model_dir = tmp_path / "eps"
    path = save_checkpoint(
        {**state, "config": cfg.to_dict(), "model": Transformer(cfg).state_dict()},
        model_dir / BEST,
    )
    out = tmp_path / "hf"
    assert main(["export", "marian", "--model", str(model_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    want = f"{path}: layer_norm_eps: Marian's LayerNorm epsilon is 1e-5, not 1e-06"
    assert want in err, err
    assert not out.exists()


def test_export_refuses_generation_settings_json_cannot_hold(sample_model_dir, tmp_path, capsys):
    """A damaged checkpoint (a tensor among its generation settings) is one line naming
    the file and the entry, and an earlier export in --out survives it."""
    model_dir = tmp_path / "model"
    state = load_checkpoint(sample_model_dir() / BEST)
    path = save_checkpoint(
        {**state, "generation": {"max_length": torch.tensor(5)}}, model_dir / BEST
    )
    out = tmp_path / "hf"
    good = ["export", "marian", "--model", str(sample_model_dir()), "--out", str(out)]
    assert main(good) == 0
    before = (out / "generation_config.json").read_text()
    assert main(["export", "marian", "--model", str(model_dir), "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: checkpoint entry 'generation'" in err, err
    assert (out / "generation_config.json").read_text() == before
