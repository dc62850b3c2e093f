"""`aiayn import marian`: a transformers MarianMTModel folder (made here with
save_pretrained: shared and tied, untied, separate vocabularies, fp16, gelu without
embedding scaling) becomes an aiayn model directory whose logits equal transformers' in
float64 at every non-pad position, whose greedy output is generate(num_beams=1)'s, and
that every aiayn command takes. Bad folders stop with one line naming the file, and
nothing is written."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from transformers import MarianMTModel

from aiayn.checkpoint import (
    BEST,
    generation_settings,
    load_checkpoint,
    load_inference,
    load_model,
)
from aiayn.cli import main
from aiayn.decode import DecodeOptions, search
from aiayn.errors import ConversionError
from aiayn.inspect.maps import add_alignments
from aiayn.marian import import_marian
from aiayn.translator import Translator
from marian_util import corpus_lines, make_marian, write_tokenizer

pytestmark = [pytest.mark.multi30k, pytest.mark.timeout(300)]

VARIANTS = {
    "shared_tied": {},
    "shared_untied": dict(tied=False),  # transformers 5 then ties none of the tables
    "separate": dict(shared=False, separate=True),
    "fp16": dict(dtype=torch.float16),
    "gelu_unscaled": dict(activation="gelu", scale_embedding=False),
    "gelu_python": dict(activation="gelu_python"),  # transformers' exact gelu, in Python
    "relu_6_layers": dict(activation="relu", encoder_layers=3, decoder_layers=1),
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    write_tokenizer(root / "shared")
    write_tokenizer(root / "separate", separate=True)
    return root


@pytest.fixture(scope="module")
def folders(tokenizers, tmp_path_factory):
    """name -> (the Marian folder, the aiayn model directory imported from it)."""
    root, out = tmp_path_factory.mktemp("marian"), {}
    for i, (name, options) in enumerate(VARIANTS.items()):
        options = dict(options)
        tok = tokenizers / ("separate" if options.pop("separate", False) else "shared")
        make_marian(root / name, tok, seed=i, **options)
        out[name] = root / name, import_marian(root / name, root / f"{name}_aiayn")
    return out


def batch(tokenizer, n: int = 6, offset: int = 0):
    """Source ids (EOS last) and teacher-forced decoder inputs (the start id, then the
    target) of ``n`` real pairs, right-padded; and the mask of real target positions."""
    de, en = corpus_lines("val", offset + n)
    src = [tokenizer.encode(s) for s in de[offset:]]
    tgt = [[tokenizer.bos_id, *tokenizer.encode_target(t)] for t in en[offset:]]
    pad = tokenizer.pad_id

    def padded(rows):
        out = torch.full((len(rows), max(map(len, rows))), pad)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out

    tgt_in = padded(tgt)
    real = torch.zeros_like(tgt_in, dtype=torch.bool)
    for i, r in enumerate(tgt):
        real[i, : len(r)] = True
    return padded(src), tgt_in, real


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_equal_transformers_in_float64(folders, name):
    folder, model_dir = folders[name]
    # float32 first: loaded as fp16, transformers would compute its position table in fp16
    hf = MarianMTModel.from_pretrained(folder, dtype=torch.float32).double().eval()
    ours, tokenizer = load_model(model_dir / BEST)
    ours = ours.double()
    src, tgt_in, real = batch(tokenizer)
    assert real.sum() > 50 and (tgt_in == tokenizer.pad_id).any()  # padding on both sides
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src != tokenizer.pad_id, decoder_input_ids=tgt_in)
        logits = ours(src, tgt_in)
    assert logits.shape == theirs.logits.shape
    diff = (logits - theirs.logits)[real].abs().max().item()
    assert diff < 1e-10, diff
    assert theirs.logits[real].std() > 0.5  # logits that mean something, not near zero
    cfg = ours.cfg
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (cfg.src_vocab_size - 1,) * 2 + (0,)
    assert cfg.output_bias and cfg.share_embeddings == (name not in ("separate", "shared_untied"))


def test_the_imported_config(folders):
    cfg = load_model(folders["shared_tied"][1] / BEST)[0].cfg
    assert (cfg.activation, cfg.scale_embeddings, cfg.tie_output, cfg.norm_first) == (
        "swish", True, True, False
    )  # fmt: skip
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.max_len) == (16, 4, 32, 256)
    cfg = load_model(folders["relu_6_layers"][1] / BEST)[0].cfg
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.activation) == (3, 1, "relu")
    cfg = load_model(folders["separate"][1] / BEST)[0].cfg
    assert cfg.src_vocab_size < cfg.tgt_vocab_size and not cfg.share_embeddings


@pytest.mark.parametrize("name", ["shared_tied", "separate"])
def test_greedy_equals_generate_with_one_beam(folders, name):
    """The same ids as generate(num_beams=1) with the pad banned (Marian's bad_words_ids),
    sentence by sentence, up to the same length limit (generate's forced EOS at
    max_length is off: aiayn's greedy search does not force one)."""
    folder, model_dir = folders[name]
    hf = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()
    model, tokenizer = load_model(model_dir / BEST)
    src, _, _ = batch(tokenizer, n=8)
    steps = 12
    found = search(model, src, DecodeOptions(beam=1, max_len_a=0, max_len_b=steps))
    ours = [[h.tokens for h in hyps] for hyps in found]
    pad, eos = tokenizer.pad_id, tokenizer.eos_id
    with torch.no_grad():
        out = hf.generate(
            input_ids=src, attention_mask=src != pad, num_beams=1, do_sample=False,
            max_new_tokens=steps, bad_words_ids=[[pad]], forced_eos_token_id=None,
        )  # fmt: skip
    theirs = []
    for row in out[:, 1:].tolist():  # after the decoder start
        theirs.append(row[: row.index(eos)] if eos in row else row)
    assert [o[0] for o in ours] == theirs  # (sentences that stop at EOS: test_marian_export)


def test_bin_and_sharded_weights_import_alike(folders, tmp_path):
    """pytorch_model.bin as transformers 4 wrote it (every key: tied copies, positions)
    and sharded safetensors give the weights the single safetensors file gives."""
    folder, model_dir = folders["shared_tied"]
    want = load_checkpoint(model_dir / BEST)["model"]
    hf = MarianMTModel.from_pretrained(folder, dtype=torch.float32)
    old = tmp_path / "bin"
    shutil.copytree(folder, old)
    (old / "model.safetensors").unlink()
    state = hf.state_dict()
    assert "model.encoder.embed_positions.weight" in state and "lm_head.weight" in state
    torch.save(state, old / "pytorch_model.bin")
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(folder / name, sharded / name)
    for source in (old, sharded):
        got = load_checkpoint(import_marian(source, tmp_path / f"{source.name}_aiayn") / BEST)
        assert got["model"].keys() == want.keys()
        assert all(torch.equal(got["model"][k], v) for k, v in want.items()), source.name
    # A training checkpoint's nesting, or a value that is no tensor: named, not an
    # AttributeError ('dict' object has no attribute 'is_floating_point').
    nested = {"state_dict": state}
    for wrong, named in (
        (nested, "'state_dict' is not a tensor \\(OrderedDict"),
        ({"x": 1}, "'x'"),
    ):
        torch.save(wrong, old / "pytorch_model.bin")
        with pytest.raises(ConversionError, match=f"pytorch_model.bin: {named}"):
            import_marian(old, tmp_path / "nested")


def test_generation_settings_are_kept(folders, tmp_path):
    folder, model_dir = folders["shared_tied"]
    written = json.loads((folder / "generation_config.json").read_text())
    kept = json.loads((model_dir / "generation_config.json").read_text())
    assert kept == written == generation_settings(load_checkpoint(model_dir / BEST))
    # An older folder without generation_config.json: the settings in its config.json.
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    (old / "generation_config.json").unlink()
    config = json.loads((old / "config.json").read_text())
    config.update(num_beams=6, max_length=512, bad_words_ids=[[config["pad_token_id"]]])
    # the neutral values transformers 4 wrote into config.json: no refusal
    config.update(min_length=0, no_repeat_ngram_size=0, repetition_penalty=1.0, num_beam_groups=1)
    config.update(diversity_penalty=0.0, eos_token_id=[config["eos_token_id"]])
    (old / "config.json").write_text(json.dumps(config))
    settings = json.loads(
        (import_marian(old, tmp_path / "m") / "generation_config.json").read_text()
    )
    assert settings["num_beams"] == 6 and settings["max_length"] == 512
    assert settings["bad_words_ids"] == [[config["pad_token_id"]]]


def test_the_checkpoint_alone_translates(folders, tmp_path):
    _, model_dir = folders["shared_tied"]
    lone = tmp_path / "alone.pt"
    shutil.copy(model_dir / BEST, lone)
    lines = ["Ein Mann fährt Fahrrad.", "", ">>fra<< Zwei Hunde spielen im Schnee."]
    alone = Translator(*load_inference(lone)).translate(lines, beam=2)  # settings too
    assert alone == Translator.from_dir(model_dir).translate(lines, beam=2)
    assert alone[1] == [""] and alone[0][0]


def test_prefixes_are_target_text_and_alignments_source_pieces(folders):
    """A forced prefix is encoded as target text (no EOS appended, the target vocabulary)
    and alignments read the source ids as source pieces (separate vocabularies here)."""
    translator = Translator.from_dir(folders["separate"][1])
    tokenizer = translator.tokenizer
    prefix = "A man"
    found = translator.translations(["Ein Mann fährt."], beam=1, prefixes=[prefix])
    add_alignments(translator, [translator.encode("Ein Mann fährt.")], found, -1)
    ids = found[0][0].ids
    assert ids[: len(tokenizer.encode_target(prefix))] == tokenizer.encode_target(prefix)
    assert tokenizer.eos_id not in ids and found[0][0].text.startswith(prefix)
    words = 3  # "Ein", "Mann", "fährt." (the EOS joins the last word)
    assert found[0][0].alignment and all(0 <= i < words for i, _ in found[0][0].alignment)


def test_every_command_takes_the_model_directory(folders, tmp_path, capsys):
    _, model_dir = folders["shared_tied"]
    de, en = corpus_lines("val", 4)
    (tmp_path / "in.de").write_text("\n".join(de) + "\n")
    (tmp_path / "ref.en").write_text("\n".join(en) + "\n")
    model = str(model_dir)
    out = tmp_path / "out.en"
    assert (
        main(["translate", "--model", model, str(tmp_path / "in.de"), "-o", str(out), "--quiet"])
        == 0
    )
    assert len(out.read_text().splitlines()) == 4
    evaluate = ["evaluate", "--model", model, "--src", str(tmp_path / "in.de")]
    assert main([*evaluate, "--ref", str(tmp_path / "ref.en"), "--quiet"]) == 0
    assert main(["attention", "--model", model, de[0], "--beam", "1"]) == 0
    assert main(["summary", "--model", model]) == 0
    assert main(["export", "ctranslate2", "--model", model, "--out", str(tmp_path / "ct2")]) == 0
    printed = capsys.readouterr().out
    assert "BLEU" in printed and "translation:" in printed
    assert {"model.bin", "source.spm", "target.spm", "vocab.json"} <= {
        p.name for p in (tmp_path / "ct2").iterdir()
    }


def test_serve_translates_with_the_imported_tokenizer(folders):
    from fastapi.testclient import TestClient

    from aiayn.serve import ServeConfig, create_app
    from serve_util import wait_for

    translator = Translator.from_dir(folders["shared_tied"][1])
    lines = ["Ein Mann fährt Fahrrad.", ">>fra<< Zwei Hunde."]
    with TestClient(create_app(translator, ServeConfig(worker="thread"))) as client:
        wait_for(lambda: client.get("/ready").status_code == 200, "/ready say 200", 30)
        r = client.post("/translate", json={"src": lines, "beam": 2, "attention": True})
    assert r.status_code == 200, r.text
    want = translator.translate(lines, beam=2)  # the model's own settings, beam aside
    assert r.json()["translations"] == [c[0] for c in want]
    attention = r.json()["attention"][0]
    assert attention["source"][-1] == "</s>" and attention["target_in"][0] == "<pad>"


def test_ctranslate2_scores_equal_ours(folders, tmp_path):
    """The CTranslate2 export of an imported model (swish, output bias, EOS appended to
    the source by CTranslate2, the decoder starting from <pad>) scores as ours does."""
    import ctranslate2

    from aiayn.export import export_ctranslate2

    _, model_dir = folders["shared_tied"]
    model, tokenizer = load_model(model_dir / BEST)
    export_ctranslate2(model_dir, tmp_path / "ct2")
    src, tgt_in, real = batch(tokenizer, n=3)
    with torch.no_grad():
        logp = torch.log_softmax(model(src, tgt_in), dim=-1)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    piece = tokenizer.id_to_piece
    for i in range(3):
        n = int(real[i].sum())  # start + target: scores of target + EOS
        target = tgt_in[i, 1:n].tolist()
        source = [piece(t, source=True) for t in src[i].tolist() if t != tokenizer.pad_id]
        scored = translator.score_batch([source[:-1]], [[piece(t) for t in target]])[0]
        ours = logp[i, torch.arange(n), torch.tensor([*target, tokenizer.eos_id])]
        torch.testing.assert_close(torch.tensor(scored.log_probs), ours, atol=1e-4, rtol=1e-4)


# -- bad folders -----------------------------------------------------------------------------


def _break(folder, what):
    if what == "no config":
        (folder / "config.json").unlink()
    elif what in ("t5", "bart"):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": what}))
    elif what == "no spm":
        (folder / "target.spm").unlink()
    elif what == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif what == "vocab size":
        vocab = json.loads((folder / "vocab.json").read_text())
        del vocab[next(p for p in vocab if p.startswith("▁"))]
        vocab = {p: i for i, p in enumerate(sorted(vocab, key=vocab.get))}
        (folder / "vocab.json").write_text(json.dumps(vocab))


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("no config", r"config\.json: missing"),
        ("t5", r"config\.json: model_type 't5'; aiayn imports Marian models"),
        ("bart", r"config\.json: model_type 'bart'"),
        ("no spm", r"target\.spm: missing"),
        (
            "truncated weights",
            r"model\.safetensors: cannot read the weights, the file is truncated",
        ),
        ("vocab size", r"vocab\.json: \d+ pieces, but the model's source embedding has \d+ rows"),
    ],
)
def test_bad_folders_one_line_naming_the_file_and_nothing_written(
    folders, tmp_path, capsys, what, message
):
    folder = tmp_path / "hf"
    shutil.copytree(folders["shared_tied"][0], folder)
    _break(folder, what)
    out = tmp_path / "runs" / "imported"
    assert main(["import", "marian", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert str(folder) in err
    assert not (tmp_path / "runs").exists()  # nothing written, not even the parent


def test_an_existing_output_is_never_overwritten(folders, tmp_path, capsys):
    folder, _ = folders["shared_tied"]
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["import", "marian", str(folder), "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
