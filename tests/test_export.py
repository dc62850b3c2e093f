"""Export to CTranslate2: the exported model computes what ours computes.

A briefly trained model (post-LN and pre-LN) is exported and run by CTranslate2 itself:
its per-token log-probabilities must equal ours, its greedy translations must be ours
token for token, and so must its beam-search 1-best where both searches rank alike.
A wrong weight mapping (Q and K swapped, the wrong position layout, a missing LayerNorm
epsilon) changes the scores by far more than the tolerance used here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ctranslate2
import pytest
import torch

from aiayn import Transformer, TransformerConfig
from aiayn.checkpoint import load_model, resolve_checkpoint, save_checkpoint
from aiayn.cli import main
from aiayn.data.batching import pad
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import DecodeOptions, beam_search, greedy, search
from aiayn.export import MATCH_AIAYN, ExportError, export_ctranslate2
from numerics_util import log_probs, margins_and_shift
from sample_data import PAIRS

SOURCES = [s for s, _ in PAIRS]  # 60 seen in training, 10 never seen
REFERENCES = [t for _, t in PAIRS]
MAX_NEW = 40  # output tokens, EOS included, for both decoders


def ct2_translator(path) -> ctranslate2.Translator:
    return ctranslate2.Translator(str(path), device="cpu", inter_threads=1, intra_threads=1)


@pytest.fixture(scope="module", params=[False, True], ids=["post_ln", "pre_ln"])
def exported(request, sample_model_dir, tmp_path_factory):
    """(our model, tokenizer, CTranslate2 translator, export folder, model folder)."""
    model_dir = sample_model_dir(request.param)
    out = export_ctranslate2(model_dir, tmp_path_factory.mktemp("ct2") / "model")
    model, tokenizer = load_model(resolve_checkpoint(model_dir))
    assert model.cfg.norm_first is request.param
    return model, tokenizer, ct2_translator(out), out, model_dir


def pieces(tokenizer: Tokenizer, texts: list[str]) -> list[list[str]]:
    return [tokenizer.sp.encode(t, out_type=str) for t in texts]


def our_log_probs(model: Transformer, tokenizer: Tokenizer, sources, targets, suppress=False):
    """Teacher-forced log p(target token) per position, EOS included, one list per pair;
    ``targets`` are texts or id lists. ``suppress``: <pad> and <s> removed before the
    softmax, as CTranslate2 does with ``suppress_sequences`` (MATCH_AIAYN)."""
    cfg = model.cfg
    tgt = [tokenizer.encode(t) if isinstance(t, str) else t for t in targets]
    src = pad([tokenizer.encode(s) for s in sources], cfg.pad_id)
    tgt_in = pad([[cfg.bos_id, *t] for t in tgt], cfg.pad_id)
    with torch.no_grad():
        logits = model(src, tgt_in)
    if suppress:
        logits[..., [cfg.pad_id, cfg.bos_id]] = float("-inf")
    logp = torch.log_softmax(logits, dim=-1)
    return [
        [float(logp[i, t, token]) for t, token in enumerate([*ids, cfg.eos_id])]
        for i, ids in enumerate(tgt)
    ]


def test_export_folder_is_self_contained(exported):
    _, tokenizer, _, out, _ = exported
    assert {p.name for p in out.iterdir()} == {
        "model.bin",
        "config.json",
        "shared_vocabulary.json",
        "spm.model",
    }
    assert (out / "spm.model").read_bytes() == tokenizer.to_bytes()
    vocabulary = json.loads((out / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert vocabulary == [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    assert vocabulary[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == (
        "<s>",
        "</s>",
        "<unk>",
    )
    assert config["decoder_start_token"] == "<s>"
    assert not config["add_source_bos"] and not config["add_source_eos"]


def test_scores_equal_our_teacher_forced_log_probs(exported):
    model, tokenizer, translator, _, _ = exported
    results = translator.score_batch(pieces(tokenizer, SOURCES), pieces(tokenizer, REFERENCES))
    ours = our_log_probs(model, tokenizer, SOURCES, REFERENCES)
    for result, expected in zip(results, ours):
        assert result.tokens[-1] == "</s>"
        assert result.log_probs == pytest.approx(expected, abs=1e-4)
    # Not a vacuous comparison: the model is confident and far from uniform.
    assert min(sum(lp) for lp in ours[:60]) > -5.0 and min(min(lp) for lp in ours) < -5.0


def test_greedy_translations_are_ours_token_for_token(exported):
    model, tokenizer, translator, _, _ = exported
    src = pad([tokenizer.encode(s) for s in SOURCES], model.cfg.pad_id)
    rows = greedy(model, src, max_new_tokens=MAX_NEW).tolist()
    ours = [row[: row.index(model.cfg.eos_id)] if model.cfg.eos_id in row else row for row in rows]
    results = translator.translate_batch(
        pieces(tokenizer, SOURCES),
        beam_size=1,
        max_decoding_length=MAX_NEW,
        **MATCH_AIAYN,  # <pad> and <s> never output, </s> allowed first, as ours
    )
    theirs = [[tokenizer.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    assert theirs == ours
    # The translations are not trivial: mostly right on seen pairs, all different.
    texts = [tokenizer.decode(ids) for ids in ours]
    assert sum(t == ref for t, ref in zip(texts[:60], REFERENCES)) >= 40
    assert len(set(texts)) >= 60


def test_beam_search_agrees_without_length_penalty(exported):
    """Beam 4 with no length normalisation on either side (our alpha=0, CT2's
    length_penalty=0): both rank by total log-probability, so the 1-best and its score
    must agree. With a length penalty they differ by design: ours is GNMT's
    ((5 + |Y|) / 6) ** alpha, CTranslate2's |Y| ** length_penalty, and CTranslate2 also
    stops the search by another rule (after beam_size * patience finished hypotheses).
    CTranslate2's score renormalises over the tokens left after suppressing <pad> and
    <s>; ours drops them after the softmax, which can tip a near-tie between two beams of a
    badly translated sentence (seen: 1 of 70 with 2 threads), so 95% must agree exactly."""
    model, tokenizer, translator, _, _ = exported
    src = pad([tokenizer.encode(s) for s in SOURCES], model.cfg.pad_id)
    ours = beam_search(model, src, beam_size=4, alpha=0.0, max_len_b=MAX_NEW)
    results = translator.translate_batch(
        pieces(tokenizer, SOURCES),
        beam_size=4,
        length_penalty=0.0,
        max_decoding_length=MAX_NEW + 20,
        **MATCH_AIAYN,
        return_scores=True,
    )
    best = [hyps[0].tokens for hyps in ours]
    theirs = [[tokenizer.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    same = [i for i, (a, b) in enumerate(zip(theirs, best)) if a == b]
    assert len(same) >= 0.95 * len(SOURCES)
    assert len({tuple(b) for b in best}) >= 60
    plain = our_log_probs(model, tokenizer, SOURCES, best)
    renormalised = our_log_probs(model, tokenizer, SOURCES, best, suppress=True)
    for i in same:
        assert ours[i][0].log_prob == pytest.approx(sum(plain[i]), abs=1e-4)
        assert results[i].scores[0] == pytest.approx(sum(renormalised[i]), abs=1e-4)


def test_beam_search_cut_at_the_limit_agrees_there_too(exported):
    """Outputs that reach the length limit: CTranslate2's ``max_decoding_length`` ends
    them there without EOS, as ``cut_at_limit`` does (by default aiayn spends the last
    slot on EOS, and almost none agree). Limits of 4 and 7 tokens: most sentences reach
    them. 95% must agree exactly, as above."""
    model, tokenizer, translator, _, _ = exported
    src = pad([tokenizer.encode(s) for s in SOURCES], model.cfg.pad_id)
    for limit in (4, 7):
        options = DecodeOptions(beam=4, alpha=0.0, max_len_a=0.0, max_len_b=limit)
        results = translator.translate_batch(
            pieces(tokenizer, SOURCES), beam_size=4, length_penalty=0.0,
            max_decoding_length=limit, **MATCH_AIAYN,
        )  # fmt: skip
        theirs = [[tokenizer.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
        assert sum(len(t) == limit for t in theirs) >= len(SOURCES) // 2
        cut = [h[0].tokens for h in search(model, src, options.replace(cut_at_limit=True))]
        eos = [h[0].tokens for h in search(model, src, options)]
        assert sum(a == b for a, b in zip(theirs, cut)) >= 0.95 * len(SOURCES)
        assert sum(a == b for a, b in zip(theirs, eos)) < 0.2 * len(SOURCES)


def test_an_export_into_a_folder_another_is_writing_is_refused(sample_model_dir, tmp_path):
    """As `export marian`'s: a second `export ctranslate2 --force` into a folder being
    written is refused in one line, and the earlier export is left as it was."""
    import re

    from aiayn.data.folders import busy, held_output
    from aiayn.errors import AiaynError

    out = tmp_path / "ct2"
    export_ctranslate2(sample_model_dir(), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    held = pytest.raises(AiaynError, match=re.escape(busy(out)))
    with held_output(out, "the test's"), held:
        export_ctranslate2(sample_model_dir(), out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


def test_int8_export_translates_like_the_float_model(exported, tmp_path):
    _, tokenizer, translator, _, model_dir = exported
    int8 = ct2_translator(export_ctranslate2(model_dir, tmp_path / "int8", quantization="int8"))
    options = dict(beam_size=1, max_decoding_length=MAX_NEW, **MATCH_AIAYN)
    src = pieces(tokenizer, SOURCES)
    float_out = [r.hypotheses[0] for r in translator.translate_batch(src, **options)]
    int8_out = [r.hypotheses[0] for r in int8.translate_batch(src, **options)]
    # CTranslate2 scores only given tokens, so the shift int8 makes is measured on the float
    # model's greedy choices (teacher-forced); the runner-up may shift as much the other
    # way, hence twice that bounds the change of the gap between the two best, and x1.5
    # more for the batch-wide activation scales. Sentences whose every greedy step is won
    # by more than that translate the same; the memorised pairs are all that safe.
    model = exported[0]
    narrowest, _ = margins_and_shift(model, lambda s, t: log_probs(model, s, t), tokenizer, SOURCES)
    ids = [[tokenizer.piece_to_id(p) for p in out] for out in float_out]
    ours = our_log_probs(model, tokenizer, SOURCES, ids, suppress=True)
    theirs = [r.log_probs for r in int8.score_batch(src, float_out)]
    assert [len(t) for t in theirs] == [len(o) for o in ours]  # EOS scored by both
    shift = max(abs(a - b) for o, t in zip(ours, theirs) for a, b in zip(o, t))
    safe = [i for i, g in enumerate(narrowest) if g > 3 * shift]
    assert len(safe) >= 60, (shift, sorted(narrowest))
    assert [i for i in safe if float_out[i] != int8_out[i]] == []


@pytest.fixture
def variant_dir(sample_model_dir, tmp_path):
    """An untrained model with every other option: separate embeddings, untied output,
    learned positions, unequal encoder/decoder depth, a large LayerNorm epsilon."""
    tokenizer = Tokenizer.load(sample_model_dir(False) / "spm.model")
    torch.manual_seed(3)
    cfg = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_heads=4,
        n_layers=2,
        n_decoder_layers=3,
        d_ff=64,
        max_len=48,
        share_embeddings=False,
        tie_output=False,
        learned_positions=True,
        layer_norm_eps=0.3,
    )
    model = Transformer(cfg)
    with torch.no_grad():  # non-trivial biases and LayerNorm affines, larger weights
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if "norm.weight" in name else 0.0, 0.3)
            else:
                p.mul_(2.0)
    state = {"model": model.state_dict(), "config": cfg.to_dict()}
    save_checkpoint({**state, "tokenizer": tokenizer.to_bytes()}, tmp_path / "checkpoint_last.pt")
    return tmp_path


@pytest.mark.parametrize("norm_first", [False, True])
def test_every_model_option_exports_exactly(variant_dir, tmp_path, norm_first):
    state_path = variant_dir / "checkpoint_last.pt"
    if norm_first:  # the same weights as a pre-LN model (the final norms start at 1, 0)
        state = torch.load(state_path, weights_only=True)
        state["config"]["norm_first"] = True
        model = Transformer(TransformerConfig.from_dict(state["config"]))
        model.load_state_dict(state["model"], strict=False)
        state["model"] = model.state_dict()
        save_checkpoint({k: v for k, v in state.items() if k != "format"}, state_path)
    out = export_ctranslate2(variant_dir, tmp_path / "ct2", checkpoint="last")
    model, tokenizer = load_model(state_path)
    results = ct2_translator(out).score_batch(
        pieces(tokenizer, SOURCES[:20]), pieces(tokenizer, REFERENCES[:20])
    )
    ours = our_log_probs(model, tokenizer, SOURCES[:20], REFERENCES[:20])
    for result, expected in zip(results, ours):
        assert result.log_probs == pytest.approx(expected, abs=1e-4)
    assert max(max(lp) for lp in ours) - min(min(lp) for lp in ours) > 5.0  # far from uniform


def test_a_model_without_encoder_layers_is_refused(variant_dir, tmp_path):
    """CTranslate2 cannot load a Transformer of no encoder layer (it looks for layer 0's
    weights): the export wrote one that failed only when loaded."""
    state = torch.load(variant_dir / "checkpoint_last.pt", weights_only=True)
    cfg = TransformerConfig.from_dict({**state["config"], "n_encoder_layers": 0})
    state = {**state, "model": Transformer(cfg).state_dict(), "config": cfg.to_dict()}
    save_checkpoint({k: v for k, v in state.items() if k != "format"}, variant_dir / "c.pt")
    with pytest.raises(ExportError, match="n_encoder_layers 0: CTranslate2's Transformer"):
        export_ctranslate2(variant_dir, tmp_path / "ct2", checkpoint=str(variant_dir / "c.pt"))
    assert not (tmp_path / "ct2").exists()


def test_cli_export_and_its_errors(sample_model_dir, tmp_path, capsys):
    model_dir = sample_model_dir(False)
    out = tmp_path / "ct2"
    args = ["export", "ctranslate2", "--model", str(model_dir), "--out", str(out)]
    assert main(args) == 0
    assert (out / "model.bin").is_file() and (out / "spm.model").is_file()
    assert main(args) == 2  # an earlier export is kept unless --force
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force", "--quantization", "int8"]) == 0
    # --force replaced the whole folder: a file beside the export (or a folder that only
    # held a model.bin of its own) went with it
    (out / "results.csv").write_text("mine")
    assert main([*args, "--force"]) == 2
    assert "holds results.csv, which this output does not write" in capsys.readouterr().err
    assert (out / "results.csv").read_text() == "mine" and (out / "model.bin").is_file()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    assert main([*args[:-1], str(tmp_path / "other"), "--force"]) == 2  # never overwritten
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me"
    assert main([*args[:-1], str(tmp_path / "new"), "--checkpoint", "averaged"]) == 2
    assert "checkpoint_averaged.pt" in capsys.readouterr().err
    under_a_file = tmp_path / "other" / "notes.txt" / "ct2"
    assert main([*args[:-1], str(under_a_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{under_a_file}: cannot create" in err, err
    with pytest.raises(ExportError, match="quantization"):
        export_ctranslate2(model_dir, tmp_path / "bad", quantization="int3")


def test_ctranslate2_stays_optional(sample_model_dir, tmp_path):
    """Without ctranslate2, aiayn (and aiayn.export) imports, and `aiayn export` exits 2
    with the install command instead of a traceback."""
    code = (
        "import sys; sys.modules['ctranslate2'] = None\n"
        "import aiayn.export, aiayn.translator\n"
        "from aiayn.cli import main\n"
        f"sys.exit(main(['export', 'ctranslate2', '--model', {str(sample_model_dir(False))!r},"
        f" '--out', {str(tmp_path / 'out')!r}]))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "pip install ctranslate2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
