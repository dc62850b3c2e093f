"""The decoding workflows beyond the best beam: one options object, ensembles, scores,
forced prefixes, word alignments, and their command-line forms and errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from aiayn import Transformer
from aiayn.checkpoint import load_checkpoint, load_model, save_checkpoint
from aiayn.cli import main
from aiayn.data.corpus import read_lines
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import DecodeOptions, beam_search, greedy, length_penalty, search
from aiayn.decode.alignment import word_starts
from aiayn.errors import AiaynError, DecodeError
from aiayn.inspect.maps import add_alignments
from aiayn.train.recipe import Recipe
from aiayn.translator import Translator
from conftest import random_batch, small_corpus, tiny_config
from sample_data import PAIRS
from test_pipeline import TINY, train_argv

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"beam": 0}, "beam must be an integer >= 1"),
        ({"alpha": float("nan")}, "alpha must be a finite number"),
        ({"n_best": 5, "beam": 4}, "n_best must be <= beam"),
        ({"sampling": True}, "takes no beam"),  # the default beam is 4
        ({"sampling": True, "beam": 1, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"sampling": True, "beam": 1, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"sampling": True, "beam": 1, "temperature": 0.0}, "temperature must be"),
        ({"sampling": True, "beam": 1, "top_k": -1}, "top_k must be"),
        ({"top_k": 5}, "only applies with sampling"),
        ({"length_penalty": "wu"}, "length_penalty must be one of gnmt, hf"),
        ({"max_len_a": -1.0}, "max_len_a must be"),
        ({"cut_at_limit": 1}, "cut_at_limit must be true or false"),
        ({"cut_at_limit": True, "forced_eos": True}, "set at most one"),
    ],
)
def test_options_check_themselves(settings, message):
    with pytest.raises(DecodeError, match=message):
        DecodeOptions(**settings)


def test_options_are_frozen_and_every_search_takes_them(tiny_model):
    options = DecodeOptions(beam=3, alpha=0.0, n_best=2, max_len_b=6)
    with pytest.raises(AttributeError):
        options.beam = 2  # type: ignore[misc]
    src, _ = random_batch(tiny_model.cfg, [5, 3], [1, 1], seed=2)
    by_options = beam_search(tiny_model, src, options)
    by_keywords = beam_search(tiny_model, src, beam_size=3, alpha=0.0, n_best=2, max_len_b=6)
    assert [[h.tokens for h in s] for s in by_options] == [
        [h.tokens for h in s] for s in by_keywords
    ]
    assert torch.equal(greedy(tiny_model, src, options), greedy(tiny_model, src, max_len_b=6))


def teacher_forced_log_prob(model: Transformer, src_row: torch.Tensor, tokens, eos: bool) -> float:
    """The slow reference: sum of log p(y_t | y_<t, x) from one full forward pass."""
    cfg = model.cfg
    target = [*tokens, cfg.eos_id] if eos else list(tokens)
    tgt_in = torch.tensor([[cfg.bos_id, *target[:-1]]])
    with torch.no_grad():
        logp = torch.log_softmax(model(src_row[None], tgt_in)[0].double(), dim=-1)
    return float(sum(logp[t, y] for t, y in enumerate(target)))


SEARCHES = [
    {"beam": 1},
    {"beam": 4, "n_best": 3},
    {"beam": 1, "sampling": True, "n_best": 2, "seed": 3},
]


@pytest.mark.parametrize("settings", SEARCHES)
def test_scores_are_the_teacher_forced_log_probability(tiny_model, settings):
    options = DecodeOptions(alpha=0.6, max_len_b=7, **settings)
    src, _ = random_batch(tiny_model.cfg, [6, 2, 4], [1] * 3, seed=6)
    for row, hyps in zip(src, search(tiny_model, src, options)):
        assert hyps
        for h in hyps:
            want = teacher_forced_log_prob(tiny_model, row, h.tokens, h.eos)
            assert h.log_prob == pytest.approx(want, abs=1e-4)
            lp = length_penalty(len(h.tokens) + int(h.eos), 0.6)
            assert h.score == pytest.approx(h.log_prob / lp)


def slow_ensemble_greedy(models, src_row, steps):
    """Full recomputation every step: the mean of the models' probabilities, argmax."""
    cfg = models[0].cfg
    out, total = [], 0.0
    for _ in range(steps):
        tgt_in = torch.tensor([[cfg.bos_id, *out]])
        with torch.no_grad():
            probs = torch.stack(
                [torch.softmax(m(src_row[None], tgt_in)[0, -1].double(), -1) for m in models]
            ).mean(0)
        masked = probs.clone()
        masked[[cfg.pad_id, cfg.bos_id]] = -1.0
        token = int(masked.argmax())
        out.append(token)
        total += math.log(float(probs[token]))
        if token == cfg.eos_id:
            break
    return out, total


def test_an_ensemble_averages_probabilities(tiny_model):
    torch.manual_seed(3)
    other = Transformer(tiny_config()).eval()
    src, _ = random_batch(tiny_model.cfg, [6, 3, 5], [1] * 3, seed=9)
    options = DecodeOptions(beam=1, max_len_b=6)
    got = search([tiny_model, other], src, options)
    for row, (h,) in zip(src, got):
        limit = int((row != 0).sum()) + 6
        tokens, total = slow_ensemble_greedy([tiny_model, other], row, limit)
        eos = tokens[-1:] == [tiny_model.cfg.eos_id]
        assert h.tokens == (tokens[:-1] if eos else tokens) and h.eos == eos
        assert h.log_prob == pytest.approx(total, abs=1e-4)
    # Beam search with the cache equals beam search recomputing every prefix.
    beam = DecodeOptions(beam=3, n_best=3, max_len_b=6)
    cached = search([tiny_model, other], src, beam)
    plain = search([tiny_model, other], src, beam, use_cache=False)
    assert [[h.tokens for h in s] for s in cached] == [[h.tokens for h in s] for s in plain]


@pytest.mark.parametrize("settings", SEARCHES)
def test_a_model_ensembled_with_itself_is_that_model(tiny_model, settings):
    options = DecodeOptions(max_len_b=8, **settings)
    src, _ = random_batch(tiny_model.cfg, [5, 7, 2], [1] * 3, seed=4)
    alone, twice = search(tiny_model, src, options), search([tiny_model, tiny_model], src, options)
    for a, b in zip(alone, twice):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_ensembles_refuse_another_vocabulary(tiny_model):
    other = Transformer(tiny_config(tgt_vocab_size=31)).eval()
    src, _ = random_batch(tiny_model.cfg, [3], [1])
    with pytest.raises(DecodeError, match="model 2 has tgt_vocab_size=31"):
        search([tiny_model, other], src, DecodeOptions(beam=1))


@pytest.mark.parametrize(("dirs", "checkpoints"), [([], "auto"), ("model", [])])
def test_a_translator_of_no_model_says_so(dirs, checkpoints):
    with pytest.raises(AiaynError, match=r"^no model to load: no model directory or no check"):
        Translator.from_dir(dirs, checkpoints)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_forced_prefix_starts_the_output_and_counts_in_the_score(tiny_model, beam):
    cfg = tiny_model.cfg
    src, _ = random_batch(cfg, [6, 3], [1, 1], seed=8)
    options = DecodeOptions(beam=beam, n_best=1, max_len_b=8)
    free = search(tiny_model, src, options)
    prefix = [[7, 11, 7], []]  # row 1: no prefix
    forced = search(tiny_model, src, options, prefix=prefix)
    assert forced[0][0].tokens[:3] == [7, 11, 7]
    assert forced[1][0].tokens == free[1][0].tokens
    h = forced[0][0]
    assert h.log_prob == pytest.approx(
        teacher_forced_log_prob(tiny_model, src[0], h.tokens, h.eos), abs=1e-4
    )
    if beam > 1:  # a beam kept to the prefix explores other continuations than a free one
        return
    # Greedy: a prefix equal to the start of the free output changes nothing.
    start = [free[0][0].tokens[:2], free[1][0].tokens[:1]]
    same = search(tiny_model, src, options, prefix=start)
    for a, b in zip(free, same):
        assert a[0].tokens == b[0].tokens
        assert a[0].log_prob == pytest.approx(b[0].log_prob, abs=1e-5)


def test_bad_prefixes(tiny_model):
    src, _ = random_batch(tiny_model.cfg, [3, 2], [1, 1])
    options = DecodeOptions(beam=1)
    with pytest.raises(DecodeError, match="2 prefixes for 1 sentences"):
        search(tiny_model, src[:1], options, prefix=[[5], [6]])
    with pytest.raises(DecodeError, match="EOS, PAD and BOS cannot be forced"):
        search(tiny_model, src, options, prefix=[[5, tiny_model.cfg.eos_id], []])
    with pytest.raises(DecodeError, match="outside the target vocabulary"):
        search(tiny_model, src, options, prefix=[[99], []])
    with pytest.raises(DecodeError, match="id -2 is outside the target vocabulary"):
        search(tiny_model, src, options, prefix=[[5, -2], []])  # not read as "free"
    with pytest.raises(DecodeError, match="leave no room for EOS"):
        search(tiny_model, src, options, prefix=[[5] * tiny_model.cfg.max_len, []])


@pytest.mark.parametrize("beam", [1, 2])
def test_a_prefix_raises_only_its_own_sentences_length_limit(tiny_model, beam):
    src, _ = random_batch(tiny_model.cfg, [3, 2], [1, 1])
    options = DecodeOptions(beam=beam, max_new_tokens=0)  # no token allowed...
    forced, free = search(tiny_model, src, options, prefix=[[5, 6], []])
    (h,) = forced[:1]  # ... but the prefix, then one more token: EOS or, greedy, any
    assert h.tokens[:2] == [5, 6] and len(h.tokens) + h.eos == 3
    assert [h.tokens for h in free] == [[]]  # the other sentence keeps its own limit


def test_alignments_are_word_pairs_in_range(sample_model_dir):
    translator = Translator.from_dir(sample_model_dir(False))
    lines = [s for s, _ in PAIRS[:12]]
    found = translator.translations(lines, DecodeOptions(beam=2))
    add_alignments(translator, [translator.encode(line) for line in lines], found, -1)
    piece = translator.tokenizer.id_to_piece
    for line, (t,) in zip(lines, found):
        n_src = max(word_starts([piece(i) for i in translator.encode(line)])) + 1
        n_tgt = max(word_starts(t.pieces)) + 1
        assert t.alignment and all(0 <= i < n_src and 0 <= j < n_tgt for i, j in t.alignment)
        assert {j for _, j in t.alignment} == set(range(n_tgt))  # every output word is linked
    with pytest.raises(DecodeError, match=r"has 2 decoder layers \(1\.\.2"):
        add_alignments(translator, [translator.encode(lines[0])], found[:1], 3)


def test_progress_counts_blank_lines_as_done(sample_model_dir):
    """on_batch (translate's progress bar) was told only of the decoded lines: with 2 of 4
    lines blank it ended at 2/4."""
    translator = Translator.from_dir(sample_model_dir(False))
    told: list[int] = []
    lines = [PAIRS[0][0], "", "   ", PAIRS[1][0]]
    out = translator.translate(lines, beam=1, batch_size=1, on_batch=told.append)
    assert sum(told) == 4 and len(told) == 3 and out[1] == out[2] == [""]


def test_sampling_batches_count_samples(sample_model_dir):
    """Each sample is a decoder row with a cache of its own, yet a batch held batch_size
    lines of n_best samples each: 64 lines of 1,024 samples took 12 GB. A batch now holds
    batch_size samples (at least one line), and a bad batch size is still refused."""
    translator = Translator.from_dir(sample_model_dir(False))
    lines = [src for src, _ in PAIRS[:5]]
    sample = DecodeOptions(beam=1, sampling=True, n_best=4, seed=3)
    for batch_size, batches in ((8, [2, 2, 1]), (3, [1] * 5), (64, [5])):
        told: list[int] = []
        translator.translations(lines, sample, batch_size=batch_size, on_batch=told.append)
        assert told == batches
    told = []
    translator.translations(
        lines, DecodeOptions(beam=4, n_best=4), batch_size=2, on_batch=told.append
    )
    assert told == [2, 2, 1]  # a beam's rows still count as one sentence
    with pytest.raises(AiaynError, match="batch"):
        translator.translations(lines, sample, batch_size=0)


def test_word_starts_merge_pieces():
    assert word_starts(["▁A", "▁dog", "▁r", "un", "s", "."]) == [0, 1, 2, 2, 2, 2]
    assert word_starts(["un", "▁a"]) == [0, 1]


@pytest.mark.parametrize(
    ("pieces", "words"),
    [
        (["▁A", "▁", "▁e", "."], [0, 1, 1, 1]),  # decoded "A  e.": two words
        (["▁up", "▁", "e"], [0, 1, 1]),
        (["▁", "▁A"], [0, 0]),
        (["▁A", "▁"], [0, 0]),
        ([".", "▁", "▁"], [0, 0, 0]),
    ],
)
def test_a_piece_of_marks_alone_makes_no_word(pieces, words):
    """A lone U+2581 piece counted as a word of its own, which the text (a double space)
    does not have: alignment pairs named output words past the text's last (on test2016,
    21 of 1,000 best translations)."""
    assert word_starts(pieces) == words
    assert max(words) + 1 == len("".join(pieces).replace("\u2581", " ").split())


def test_cli_jsonl_alignment_and_prefix(sample_model_dir, tmp_path, capsys):
    model = str(sample_model_dir(False))
    lines = [s for s, _ in PAIRS[:5]]
    lines[2] = ""
    src = tmp_path / "in.de"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["translate", "--model", model, "--quiet", str(src), "-o", str(out)]
    assert main([*args, "--format", "jsonl", "--n-best", "2", "--alignment"]) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 5 and records[2] == {
        "text": "", "tokens": [], "score": None, "logprob": None, "n_best": [],
    }  # fmt: skip
    for record in records[:2] + records[3:]:
        assert {"text", "tokens", "score", "logprob", "alignment", "n_best"} <= set(record)
        assert record["n_best"][0]["text"] == record["text"] and len(record["n_best"]) == 2
        assert record["score"] >= record["n_best"][1]["score"]
    prefixes = tmp_path / "prefixes"
    prefixes.write_text("A\n\n\nTwo men\n\n", encoding="utf-8")
    assert main([*args, "--beam", "1", "--prefix-file", str(prefixes)]) == 0
    texts = out.read_text(encoding="utf-8").splitlines()
    assert texts[0].startswith("A") and texts[3].startswith("Two men") and texts[2] == ""


def test_cli_n_best_text_has_n_fields_when_a_search_finishes_fewer(sample_model_dir, tmp_path):
    # Room for EOS alone: one (empty) output per search. The line had 1 field, not 3.
    src = tmp_path / "in.de"
    src.write_text("Ein Hund.\n\nZwei Katzen.\n", encoding="utf-8")
    out = tmp_path / "out.en"
    args = ["--n-best", "3", "--beam", "3", "--max-len-a", "0", "--max-len-b", "1"]
    model = str(sample_model_dir(False))
    assert main(["translate", "--model", model, "--quiet", str(src), "-o", str(out), *args]) == 0
    assert out.read_text(encoding="utf-8").split("\n") == [" |||  ||| ", "", " |||  ||| ", ""]
    assert (
        main(
            [
                "translate",
                "--model",
                model,
                "--quiet",
                str(src),
                "-o",
                str(out),
                *args,
                "--alignment",
            ]
        )
        == 0
    )
    assert out.read_text(encoding="utf-8").split("\n")[0] == "\t ||| \t ||| \t"


def test_cli_closest_to_outputs_the_candidate_nearest_each_reference(sample_model_dir, tmp_path):
    """Seq-Inter distillation targets: of the n-best, the one with the highest sentence
    BLEU against the reference line. With each line's last candidate as its reference,
    that candidate (or an identical text ranked higher) is chosen."""
    model = str(sample_model_dir(False))
    src = tmp_path / "in.de"
    src.write_text("".join(s + "\n" for s, _ in PAIRS[:6]), encoding="utf-8")
    out = tmp_path / "out"
    args = ["translate", "--model", model, "--quiet", str(src), "-o", str(out), "--n-best", "3"]
    assert main([*args, "--format", "jsonl"]) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    refs = [r["n_best"][-1]["text"] for r in records]
    assert any(r["text"] != ref for r, ref in zip(records, refs))  # the choice changes some
    (tmp_path / "ref.en").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    assert main([*args, "--closest-to", str(tmp_path / "ref.en")]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == refs  # one output per line
    assert main([*args, "--closest-to", str(tmp_path / "ref.en"), "--format", "jsonl"]) == 0
    chosen = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [c["text"] for c in chosen] == refs and all("n_best" not in c for c in chosen)
    for c, record in zip(chosen, records):  # the chosen candidate's own score and tokens
        assert {k: c[k] for k in ("tokens", "score")} in [
            {k: n[k] for k in ("tokens", "score")} for n in record["n_best"]
        ]


def write_other_vocab_model(model_dir, out_dir):
    """The sample model's checkpoint with another tokenizer and vocabulary size."""
    state = load_checkpoint(model_dir / "checkpoint_best.pt")
    tok = Tokenizer.train([s for p in PAIRS for s in p], out_dir / "spm", vocab_size=120)
    cfg = dict(state["config"], src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size)
    from aiayn import TransformerConfig

    model = Transformer(TransformerConfig.from_dict(cfg))
    state = {**state, "config": cfg, "model": model.state_dict(), "tokenizer": tok.to_bytes()}
    save_checkpoint(state, out_dir / "checkpoint_best.pt")
    return out_dir


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sampling", "--top-p", "0"], r"top_p must be in \(0, 1\]"),
        (["--sampling", "--top-p", "1.2"], r"top_p must be in \(0, 1\]"),
        (["--sampling", "--beam", "4"], "takes no beam"),
        (["--top-k", "3"], "only applies with sampling"),
        (["--prefix-file", "EMPTY"], "the prefix file is empty"),
        (["--prefix-file", "SHORT"], "1 prefix line.s. for 3 input line"),
        (["--prefix", "A", "--prefix-file", "SHORT"], "not both"),
        (["--prefix", "A 中"], "prefix: the model's vocabulary has no piece for '中'"),
        (["--prefix-file", "UNKNOWN"], r"unknown, line 2: prefix: .*no piece for '中'"),
        (["--model", "OTHER"], "another tokenizer"),
        (["--closest-to", "SHORT"], "needs n-best 2 or more"),
        (["--n-best", "2", "--closest-to", "SHORT"], "1 reference line.s. for 3 input line"),
    ],
)
def test_cli_decoding_errors_are_one_line(sample_model_dir, tmp_path, capsys, extra, message):
    model = sample_model_dir(False)
    src = tmp_path / "in.de"
    src.write_text("Ein Hund.\nZwei Katzen.\nEin Mann.\n", encoding="utf-8")
    files = {"EMPTY": tmp_path / "empty", "SHORT": tmp_path / "short"}
    files["EMPTY"].write_text("", encoding="utf-8")
    files["SHORT"].write_text("A\n", encoding="utf-8")
    files["UNKNOWN"] = tmp_path / "unknown"
    files["UNKNOWN"].write_text("A\nTwo 中\n\n", encoding="utf-8")
    if "OTHER" in extra:
        files["OTHER"] = write_other_vocab_model(model, tmp_path / "other")
    extra = [str(files.get(a, a)) for a in extra]
    code = main(["translate", "--model", str(model), "--quiet", str(src), *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert re.search(message, err), err


@pytest.mark.parametrize("beam", [1, 3])
def test_forced_eos_ends_outputs_at_the_limit_with_eos_scored_zero(tiny_model, beam):
    """Hugging Face's forced_eos_token_id: a random model rarely says EOS, so its outputs
    reach the limit; there the last token is EOS and adds nothing to the log-prob."""
    cfg = tiny_model.cfg
    src, _ = random_batch(cfg, [4, 6], [1, 1], seed=12)
    options = DecodeOptions(beam=beam, max_len_a=0.0, max_len_b=5, forced_eos=True)
    forced = [h for h, *_ in search(tiny_model, src, options)]
    at_limit = 0
    for row, h in zip(src, forced):
        assert h.eos and len(h.tokens) <= 4
        if len(h.tokens) == 4:  # reached the limit: EOS forced, scored 0
            at_limit += 1
            want = teacher_forced_log_prob(tiny_model, row, h.tokens, eos=False)
            assert h.log_prob == pytest.approx(want, abs=1e-4)
    assert at_limit > 0  # the check above ran
    free = [h for h, *_ in search(tiny_model, src, options.replace(forced_eos=False))]
    for row, h, f in zip(src, free, forced):
        if beam == 1:  # greedy runs past the forced limit, never saying EOS
            assert not h.eos and len(h.tokens) == 5
        else:  # beam search keeps an EOS ending, but pays for its EOS
            assert h.eos
            want = teacher_forced_log_prob(tiny_model, row, h.tokens, eos=True)
            assert h.log_prob == pytest.approx(want, abs=1e-4)
            assert h.tokens != f.tokens or h.log_prob < f.log_prob - 1e-3


def test_cut_at_limit_ends_beam_outputs_at_the_limit_without_eos(tiny_model):
    """A random model rarely says EOS: with ``cut_at_limit`` its beam outputs that reach
    the limit hold ``limit`` tokens (the last chosen freely, no EOS) and score exactly
    those tokens, as greedy decoding's do; by default the last slot is EOS."""
    src, _ = random_batch(tiny_model.cfg, [4, 6], [1, 1], seed=12)
    options = DecodeOptions(beam=3, n_best=3, max_len_a=0.0, max_len_b=5)
    cut = 0
    for row, hyps in zip(src, search(tiny_model, src, options.replace(cut_at_limit=True))):
        for h in hyps:
            assert len(h.tokens) + h.eos <= 5
            want = teacher_forced_log_prob(tiny_model, row, h.tokens, eos=h.eos)
            assert h.log_prob == pytest.approx(want, abs=1e-4)
            cut += not h.eos
    assert cut > 0
    assert all(h.eos for hyps in search(tiny_model, src, options) for h in hyps)


def test_distillation_workflow_with_the_student_recipe(tmp_path):
    """README's distillation commands on a small corpus: a teacher translates the training
    source with beam 4, and a student of recipes/multi30k-student.yaml (its one-layer
    decoder kept, its sizes shrunk for the test) trains on that output and translates."""
    root = Path(__file__).resolve().parents[1]
    shipped = Recipe.from_yaml(root / "recipes" / "multi30k-student.yaml")
    teacher_recipe = Recipe.from_yaml(root / "recipes" / "multi30k.yaml")
    model, teacher_model = shipped.model, teacher_recipe.model
    # A deeper encoder than decoder (Kasai et al. 2021), and neither deeper than the teacher.
    assert model["n_decoder_layers"] == 1
    assert 1 < model["n_encoder_layers"] <= teacher_model["n_layers"]
    assert shipped.vocab_size < teacher_recipe.vocab_size
    for name in ("d_model", "n_heads", "share_embeddings", "tie_output"):
        assert model[name] == teacher_model[name], name
    assert model["d_ff"] <= teacher_model["d_ff"]  # narrower or the same, never wider
    assert 0 < model["dropout"] <= teacher_model["dropout"]  # each recipe tuned on its own

    paths = small_corpus(tmp_path / "data", n_train=120, n_valid=10)
    teacher, student = tmp_path / "teacher", tmp_path / "student"
    assert main(train_argv(paths, teacher, "max_steps=12")) == 0
    distilled = tmp_path / "train.distilled.en"
    argv = ["translate", "--model", str(teacher), "--beam", "4", "--quiet"]
    assert main([*argv, str(paths["train.de"]), "-o", str(distilled)]) == 0
    assert len(distilled.read_text().splitlines()) == len(read_lines(paths["train.de"]))

    argv = ["train", "--config", str(root / "recipes" / "multi30k-student.yaml")]
    argv += ["--out", str(student), "--no-progress", "--train-src", str(paths["train.de"])]
    argv += ["--train-tgt", str(distilled), "--valid-src", str(paths["val.de"])]
    argv += ["--valid-tgt", str(paths["val.en"]), "--set", *TINY]
    argv += ["max_steps=6", "time_limit_minutes=0"]
    assert main(argv) == 0
    trained, _ = load_model(student / "checkpoint_last.pt")
    assert (trained.cfg.encoder_layers, trained.cfg.decoder_layers) == (2, 1)  # the recipe's
    assert len(trained.decoder.layers) == 1
    out = tmp_path / "student.en"
    argv = ["translate", "--model", str(student), "--checkpoint", "last", "--beam", "4"]
    assert main([*argv, "--quiet", str(paths["val.de"]), "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == len(read_lines(paths["val.de"]))
