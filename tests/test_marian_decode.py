"""Decoding an imported Marian model as transformers' generate() does: greedy with the
forced EOS, beam 4 and its n-best under length penalty 0 and under Hugging Face's penalty
(early_stopping "never", and generate()'s default heuristic), with the forced EOS and
without it (outputs cut at the length limit), and the generation settings
of the folder as the model's default options, through the command line too."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import MarianMTModel

from aiayn.checkpoint import BEST, load_checkpoint, load_model, save_checkpoint
from aiayn.cli import main
from aiayn.data.batching import pad
from aiayn.decode import DecodeOptions, search
from aiayn.marian import export_marian, import_marian
from aiayn.translator import Translator
from marian_util import corpus_lines, make_marian, write_tokenizer
from sample_data import PAIRS

pytestmark = [pytest.mark.multi30k, pytest.mark.timeout(300)]
STEPS = 13  # max_new_tokens: the outputs that do not stop earlier end here


@pytest.fixture(scope="module")
def trained(sample_model_dir, tmp_path_factory):
    """(transformers' copy, our model, its tokenizer) of a trained model, whose outputs end
    with EOS at many lengths (a random model's hardly ever do): the aiayn sample model
    exported as a Marian folder (equal logits: tests/test_marian_export.py)."""
    model_dir = sample_model_dir()
    folder = export_marian(model_dir, tmp_path_factory.mktemp("hf") / "de-en")
    hf = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()
    model, tok = load_model(model_dir / BEST)
    return hf, model, tok


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(transformers' model, our model directory) of a random Marian folder imported, with
    generation settings of its own."""
    root = tmp_path_factory.mktemp("marian_decode")
    write_tokenizer(root / "tok")
    hf = make_marian(root / "hf", root / "tok", seed=3)
    generation = {"num_beams": 4, "max_length": 40, "length_penalty": 1.2}
    hf.generation_config.update(**generation, bad_words_ids=[[hf.config.pad_token_id]])
    hf.save_pretrained(root / "hf")
    return hf, import_marian(root / "hf", root / "aiayn")


def sources(tok):
    return pad([tok.encode(s) for s, _ in PAIRS[:40]], tok.pad_id)


def hf_generate(hf, tok, src, forced_eos=True, **settings):
    """generate()'s sequences (after the decoder start, up to EOS) and scores."""
    with torch.no_grad():
        out = hf.generate(
            input_ids=src, attention_mask=src != tok.pad_id, max_new_tokens=STEPS,
            do_sample=False, bad_words_ids=[[tok.pad_id], [tok.bos_id]],
            forced_eos_token_id=tok.eos_id if forced_eos else None,
            return_dict_in_generate=True, output_scores=True, **settings,
        )  # fmt: skip
    seqs = []
    for row in out.sequences[:, 1:].tolist():
        seqs.append(row[: row.index(tok.eos_id)] if tok.eos_id in row else row)
    scores = getattr(out, "sequences_scores", None)
    return seqs, scores.tolist() if scores is not None else None


def test_greedy_with_the_forced_eos_equals_generate(trained):
    hf, model, tok = trained
    src = sources(tok)
    options = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=STEPS, forced_eos=True)
    ours = [h[0] for h in search(model, src, options)]
    theirs, _ = hf_generate(hf, tok, src, num_beams=1)
    assert [h.tokens for h in ours] == theirs
    lengths = [len(t) for t in theirs]
    assert len(set(lengths)) > 3 and STEPS - 1 in lengths  # EOS at many steps, and forced


@pytest.mark.parametrize(
    ("alpha", "early_stopping"), [(0.0, "never"), (1.2, "never"), (1.2, False), (0.6, True)]
)
def test_beam_and_n_best_equal_generate(trained, alpha, early_stopping):
    hf, model, tok = trained
    src = sources(tok)
    options = DecodeOptions(
        beam=4, n_best=4, alpha=alpha, length_penalty="hf", early_stopping=early_stopping,
        max_len_a=0.0, max_len_b=STEPS, forced_eos=True,
    )  # fmt: skip
    ours = search(model, src, options)
    theirs, scores = hf_generate(
        hf, tok, src, num_beams=4, num_return_sequences=4, length_penalty=alpha,
        early_stopping=early_stopping,
    )  # fmt: skip
    assert [h.tokens for hyps in ours for h in hyps] == theirs
    assert [h.score for hyps in ours for h in hyps] == pytest.approx(scores, abs=1e-4)
    assert len({len(t) for t in theirs}) > 3  # hypotheses of many lengths were compared


@pytest.mark.parametrize(
    ("beam", "alpha", "early_stopping"), [(1, 1.0, False), (4, 0.0, "never"), (4, 1.2, False),
    (4, 0.6, True)],
)  # fmt: skip
def test_without_the_forced_eos_outputs_are_cut_at_the_limit_as_generate_cuts_them(
    trained, beam, alpha, early_stopping
):
    """Settings without forced_eos_token_id: generate() ends an output that reaches its
    length limit there, its last token chosen freely, in beam search as in greedy
    decoding; from_generation's options (cut_at_limit) do the same, scores included (the
    default rule, EOS in the last slot, differed in 110 of 160 beam outputs here)."""
    hf, model, tok = trained
    src = sources(tok)
    settings = dict(num_beams=beam, num_return_sequences=beam, length_penalty=alpha)
    options = DecodeOptions.from_generation(
        {**settings, "early_stopping": early_stopping, "max_new_tokens": STEPS}
    )
    assert options.cut_at_limit and not options.forced_eos
    ours = search(model, src, options)
    theirs, scores = hf_generate(
        hf, tok, src, forced_eos=False, early_stopping=early_stopping, **settings
    )
    assert [h.tokens for hyps in ours for h in hyps] == theirs
    if scores is not None:
        assert [h.score for hyps in ours for h in hyps] == pytest.approx(scores, abs=1e-4)
    cut = [h for hyps in ours for h in hyps if not h.eos]
    assert len(cut) >= len(src) // 2 and {len(h.tokens) for h in cut} == {STEPS}
    assert len({len(t) for t in theirs}) > 3


def test_the_folder_settings_are_the_default_options(imported, tmp_path, capsys):
    """num_beams 4, length_penalty 1.2, max_length 40 from generation_config.json: the
    Translator and `aiayn translate` decode as generate() does with them."""
    hf, model_dir = imported
    translator = Translator.from_dir(model_dir)
    d = translator.defaults
    assert (d.beam, d.alpha, d.length_penalty, d.max_len_a, d.max_len_b) == (4, 1.2, "hf", 0, 39)
    assert d.forced_eos and d.early_stopping is False  # generate()'s default heuristic
    lines, _ = corpus_lines("val", 10)
    tok = translator.tokenizer
    src = pad([tok.encode(line) for line in lines], tok.pad_id)
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=src != tok.pad_id)  # its own settings
    want = [tok.decode(row[1:]) for row in out.tolist()]
    assert [t[0] for t in translator.translate(lines)] == want
    path = tmp_path / "in.de"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main(["translate", "--model", str(model_dir), "--quiet", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == want
    assert main(["translate", "--model", str(model_dir), "--quiet", "--format", "jsonl",
                 "--beam", "2", "--alpha", "0", str(path)]) == 0  # fmt: skip
    records = [json.loads(r) for r in capsys.readouterr().out.splitlines()]
    assert len(records) == 10 and all(r["score"] == pytest.approx(r["logprob"]) for r in records)


def test_the_length_limit_flags_replace_the_folders_rule(imported, tmp_path, capsys):
    """A folder without forced_eos_token_id cuts outputs at the limit; ``--forced-eos``
    replaces that rule (not refused as a contradiction), ``--cut-at-limit`` the forced EOS
    of a folder that has one, and each decodes as the options of that rule do. Both
    flags at once are refused, naming them."""
    _, forced_dir = imported
    cut_dir = tmp_path / "cut"
    shutil.copytree(forced_dir, cut_dir)
    for path in cut_dir.glob("*.pt"):
        state = load_checkpoint(path)
        state["generation"].pop("forced_eos_token_id")
        save_checkpoint(state, path)
    forced, cut = Translator.from_dir(forced_dir), Translator.from_dir(cut_dir)
    assert forced.defaults.forced_eos and not forced.defaults.cut_at_limit
    assert cut.defaults.cut_at_limit and not cut.defaults.forced_eos
    lines, _ = corpus_lines("val", 10)
    path = tmp_path / "in.de"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    short = ["--max-len-a", "0", "--max-len-b", "3", "--quiet", str(path)]
    for model_dir, translator, flag, rule in (
        (cut_dir, cut, "--forced-eos", {"forced_eos": True, "cut_at_limit": False}),
        (forced_dir, forced, "--cut-at-limit", {"forced_eos": False, "cut_at_limit": True}),
    ):
        options = translator.defaults.replace(max_len_a=0.0, max_len_b=3, **rule)
        want = [t[0] for t in translator.translate(lines, options)]
        assert main(["translate", "--model", str(model_dir), flag, *short]) == 0
        assert capsys.readouterr().out.splitlines() == want
        default = [t[0] for t in translator.translate(lines, options.replace(**{
            k: not v for k, v in rule.items()}))]  # fmt: skip
        assert default != want  # the flag changed something
    both = ["--forced-eos", "--cut-at-limit", *short]
    assert main(["translate", "--model", str(cut_dir), *both]) == 2
    assert "set at most one" in capsys.readouterr().err


def test_no_sampling_decodes_a_folder_whose_settings_sample_by_search(imported, tmp_path, capsys):
    """A folder whose generation settings sample (do_sample, num_beams 1): `--beam 1`
    ("1 = greedy", said its help) sampled, and no flag turned sampling off. --no-sampling
    decodes greedily, at --beam 2 by beam search, as the options with sampling off do."""
    _, source_dir = imported
    sampling_dir = tmp_path / "sampling"
    shutil.copytree(source_dir, sampling_dir)
    for path in sampling_dir.glob("*.pt"):
        state = load_checkpoint(path)
        state["generation"].update(do_sample=True, num_beams=1, top_k=0)
        save_checkpoint(state, path)
    translator = Translator.from_dir(sampling_dir)
    assert translator.defaults.sampling
    lines, _ = corpus_lines("val", 10)
    path = tmp_path / "in.de"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for beam in ([], ["--beam", "2"]):
        off = translator.defaults.given(sampling=False, beam=int(beam[1]) if beam else None)
        assert not off.sampling and off.beam == (2 if beam else 1)
        want = [t[0] for t in translator.translate(lines, off)]
        argv = ["translate", "--model", str(sampling_dir), "--no-sampling", *beam]
        assert main([*argv, "--quiet", str(path)]) == 0
        assert capsys.readouterr().out.splitlines() == want
    assert main(["translate", "--model", str(sampling_dir), "--no-sampling", "--seed", "1",
                 "--quiet", str(path)]) == 2  # fmt: skip
    assert "--seed seeds sampling, which is off" in capsys.readouterr().err
