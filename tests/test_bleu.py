"""Our corpus BLEU, written from the definition, equals sacreBLEU's on real text."""

from __future__ import annotations

import random

import pytest
import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from aiayn.data.corpus import read_lines
from aiayn.errors import AiaynError
from aiayn.metrics import corpus_bleu, sentence_bleu
from aiayn.metrics.bleu import TOKENIZERS, tokenize_13a, unsegmented_share
from sample_data import PAIRS, multi30k_dir

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without


def references() -> list[str]:
    """Multi30k val English (1,014 real captions) when present, else the built-in sample."""
    data = multi30k_dir()
    if data is None:
        return [en for _, en in PAIRS]
    return read_lines(data / "val.en.gz")


def noisy(lines: list[str], seed: int, p: float) -> list[str]:
    """A stand-in system output: words dropped, swapped, duplicated and re-cased."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        words = [w for w in words if rng.random() > p] or words[:1]
        for _ in range(int(len(words) * p)):
            i, j = rng.randrange(len(words)), rng.randrange(len(words))
            words[i], words[j] = words[j], words[i]
        if rng.random() < p:
            words.append(rng.choice(words).upper())
        out.append(" ".join(words))
    return out


@pytest.mark.parametrize("p", [0.0, 0.05, 0.2, 0.5, 0.8])
def test_equals_sacrebleu_on_real_captions(p):
    refs = references()
    hyps = noisy(refs, seed=int(p * 100), p=p)
    ours = corpus_bleu(hyps, refs)
    theirs = sacrebleu.corpus_bleu(hyps, [refs])
    assert (ours.score, ours.bp, ours.precisions) == (theirs.score, theirs.bp, theirs.precisions)
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    assert ours.counts == theirs.counts and ours.totals == theirs.totals


def test_equals_sacrebleu_with_two_reference_streams_and_short_output():
    refs = references()
    other = noisy(refs, seed=7, p=0.1)
    hyps = [" ".join(r.split()[:3]) for r in refs]  # too short: brevity penalty bites
    ours = corpus_bleu(hyps, [refs, other])
    theirs = sacrebleu.corpus_bleu(hyps, [refs, other])
    assert ours.bp < 0.5
    assert ours.score == theirs.score
    assert ours.ref_len == theirs.ref_len


def test_a_none_reference_is_no_reference_as_in_sacrebleu():
    """A variable number of references per segment: None where a stream has none (it
    raised AttributeError). Scores and nrefs equal sacreBLEU's ("var" when the counts
    differ); a segment without any reference is an error naming it."""
    refs = references()
    other = [None if i % 3 else r for i, r in enumerate(noisy(refs, seed=7, p=0.3))]
    hyps = noisy(refs, seed=8, p=0.2)
    for streams, nrefs in (([refs, other], "var"), ([other[:1], refs[:1]], "2")):
        n = len(streams[0])
        ours = corpus_bleu(hyps[:n], streams)
        metric = sacrebleu.BLEU()
        theirs = metric.corpus_score(hyps[:n], streams)
        assert (ours.score, ours.ref_len, ours.counts) == (
            theirs.score,
            theirs.ref_len,
            theirs.counts,
        )
        assert f"nrefs:{nrefs}|" in ours.signature and f"nrefs:{nrefs}|" in str(
            metric.get_signature()
        )
    one_each = [[r if i % 2 else None for i, r in enumerate(refs)], refs[:]]
    one_each[1] = [None if i % 2 else r for i, r in enumerate(refs)]
    assert corpus_bleu(hyps, one_each).signature.startswith("nrefs:1|")
    with pytest.raises(AiaynError, match="hypothesis 2 has no reference"):
        corpus_bleu(["a", "b"], [["a", None], ["a", None]])
    with pytest.raises(AiaynError, match="hypothesis 1 has no reference"):  # a TypeError
        corpus_bleu(["a", "b"], [None, "b"])


def test_lowercase_and_smoothing_edge_cases_match_sacrebleu():
    refs = ["A man rides a bike.", "Two dogs play in the snow."]
    for hyps in (["a MAN rides", "two"], ["x y z w", "q"], ["A man rides a bike.", ""]):
        for lowercase in (False, True):
            ours = corpus_bleu(hyps, refs, lowercase=lowercase)
            theirs = sacrebleu.corpus_bleu(hyps, [refs], lowercase=lowercase)
            assert ours.score == theirs.score, (hyps, lowercase)


def test_sentence_bleu_equals_sacrebleus():
    """Sentence BLEU ranks the n-best for Seq-Inter distillation targets: it equals
    sacreBLEU's sentence_bleu (effective order on), short outputs included."""
    refs = references()[:200]
    hyps = noisy(refs, seed=3, p=0.3) + [" ".join(r.split()[:k]) for r in refs for k in (1, 2, 3)]
    for hyp, ref in zip(hyps, refs * 4):
        theirs = sacrebleu.sentence_bleu(hyp, [ref])
        assert sentence_bleu(hyp, ref).score == theirs.score, hyp
    assert sentence_bleu("a b c d", "a b c d").score == pytest.approx(100.0)
    assert (
        sentence_bleu("A dog runs", "A dog runs fast").score
        > sentence_bleu("A cat sits", "A dog runs fast").score
    )


def test_perfect_and_empty_output():
    refs = references()[:50]
    assert corpus_bleu(refs, refs).score == pytest.approx(100.0)
    assert corpus_bleu([""] * len(refs), refs).score == 0.0
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        corpus_bleu(["a"], ["a", "b"])


def test_13a_tokenization_equals_sacrebleus():
    tok = Tokenizer13a()
    lines = [*references()[:300], "Price: $3.50, 2-3 items (approx.) &amp; more!", "e.g. U.S.A"]
    for line in lines:
        assert tokenize_13a(line) == tok(line)


def test_every_tokenization_equals_sacrebleus_own():
    """intl, zh and char split every line as sacreBLEU's tokenizers do, among them
    sacreBLEU's two "zh" ranges written as 5-digit \\u escapes (read as U+2000 + "0"):
    U+2001..U+2A6D and U+2F81..U+2FA1 count as Chinese, U+20000 does not."""
    from sacrebleu.tokenizers.tokenizer_char import TokenizerChar
    from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International
    from sacrebleu.tokenizers.tokenizer_zh import TokenizerZh

    theirs = {"intl": TokenizerV14International(), "zh": TokenizerZh(), "char": TokenizerChar()}
    edges = "\u2000\u2001\u2014\u2026\u2a6d\u2a6e\u2f80\u2f81\u2fa1\u2fa2\U00020000"
    lines = [*references()[:200], "「你好」，世界。1,000.5 € ™ ¿Qué? «a» 한국어 カタカナ", edges]
    lines += [f"a{c}b 1{c}2 {c}" for c in edges]
    for name, tokenizer in theirs.items():
        for line in lines:
            assert TOKENIZERS[name](line) == tokenizer(line), (name, line)
    assert TOKENIZERS["zh"]("a\u2014b\U00020000c") == "a \u2014 b\U00020000c"


def test_every_setting_matches_sacrebleu_and_is_named_in_the_signature():
    refs = ["Die Strasse ist nass, sagt er.", "Zwei Hunde (braun) spielen.", "Ein Mann."]
    hyps = ["die straße ist nass , sagt er", "Zwei hunde (braun) spielen im Schnee.", ""]
    for lowercase in (False, True):
        for tokenize in TOKENIZERS:
            for smooth in ("exp", "none"):
                ours = corpus_bleu(hyps, refs, lowercase, tokenize, smooth)
                theirs = sacrebleu.corpus_bleu(
                    hyps, [refs], lowercase=lowercase, tokenize=tokenize, smooth_method=smooth
                )
                where = (lowercase, tokenize, smooth)
                assert ours.score == pytest.approx(theirs.score, abs=1e-9), where
                assert ours.counts == theirs.counts and ours.totals == theirs.totals, where
                assert ours.precisions == pytest.approx(theirs.precisions, abs=1e-9), where
                case = "lc" if lowercase else "mixed"
                assert ours.signature == (
                    f"nrefs:1|case:{case}|eff:no|tok:{tokenize}|smooth:{smooth}|version:aiayn"
                )
    # Lowercasing is lowercasing: "ß" stays one letter (upper-casing would make it "SS").
    assert corpus_bleu(["straße"], ["STRASSE"], lowercase=True).counts[0] == 0
    one = sentence_bleu("Ein Mann", "Ein Mann.")
    assert one.signature == "nrefs:1|case:mixed|eff:yes|tok:13a|smooth:exp|version:aiayn"


def test_brevity_penalty_of_an_empty_and_of_an_equal_length_output():
    refs = ["A man rides a bike ."]
    empty, theirs = corpus_bleu([""], refs), sacrebleu.corpus_bleu([""], [refs])
    assert empty.bp == theirs.bp == 0.0 and empty.score == 0.0
    same = corpus_bleu(["A dog rides a car ."], refs)
    assert same.bp == 1.0 and same.sys_len == same.ref_len


def test_unknown_settings_are_refused_by_name():
    with pytest.raises(AiaynError) as e:
        corpus_bleu(["a"], ["a"], tokenize="ja-mecab")
    assert str(e.value) == "tokenize must be one of 13a, intl, zh, char, none, got 'ja-mecab'"
    with pytest.raises(AiaynError) as e:
        corpus_bleu(["a"], ["a"], smooth="floor")
    assert str(e.value) == "smooth must be 'exp' or 'none', got 'floor'"
    # Two strs of one length were scored letter by letter (as sacreBLEU does), unsaid.
    for args in (("the cat sat", "the dog sat"), ("the cat sat", ["the dog sat"])):
        with pytest.raises(AiaynError, match="a list of sentences, not a str"):
            corpus_bleu(*args)


SETTINGS = [(lc, tok, smooth, eff) for lc in (False, True) for tok in TOKENIZERS
            for smooth in ("exp", "none") for eff in (False, True)]  # fmt: skip
EDGE_CASES = [  # found by benchmarks/bleu_fuzz.py; each one differed before its fix
    (["a b c d-\n"], [["a b c d-"]]),  # trailing whitespace goes before 13a: "-" stays
    (["A b c d -\n\t"], [["a b c d -"], ["a b c d"]]),
    (["x y z"], [["a b c"]]),  # no match at all: precisions all 0
    ([""], [[""]]),  # empty output of empty references: BP 1
    (["<skipped>", " "], [["<skipped>", ""], ["", "\u3000"]]),
    (["d a c e d d c", "e c e f"], [["c e b e b c b", "b c a f a f c d"]]),  # float order
    (
        ["Ein Hund &amp; 3.5-4 \u00a0 İ", "一只狗 🐶 e\u0301"],
        [["ein hund & 3.5 - 4", "一只狗 🐶 é"]],
    ),
    (["「一只狗」在跑。1,5 — ok…", "犬が走る。"], [["一只狗在跑 。1,5—ok", "犬 が 走る"]]),
]


@pytest.mark.parametrize("hyps, refs", EDGE_CASES)
def test_edge_cases_equal_sacrebleu_bit_for_bit_in_every_setting(hyps, refs):
    """Score, BP and precisions are sacreBLEU's to the last bit (the same float operations
    in the same order), counts and lengths equal, in every setting."""
    for lowercase, tokenize, smooth, eff in SETTINGS:
        ours = corpus_bleu(hyps, refs, lowercase, tokenize, smooth, eff)
        theirs = sacrebleu.corpus_bleu(
            hyps, refs, smooth, lowercase=lowercase, tokenize=tokenize, use_effective_order=eff
        )
        where = (lowercase, tokenize, smooth, eff)
        assert (ours.score, ours.bp, ours.precisions) == (
            theirs.score, theirs.bp, theirs.precisions
        ), where  # fmt: skip
        assert (ours.counts, ours.totals) == (theirs.counts, theirs.totals), where
        assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len), where
    for hyp, ref in zip(hyps, refs[0]):
        ours, theirs = sentence_bleu(hyp, ref), sacrebleu.sentence_bleu(hyp, [ref])
        assert (ours.score, ours.bp, ours.precisions) == (
            theirs.score,
            theirs.bp,
            theirs.precisions,
        )


def test_the_fixed_differences_one_by_one():
    # sacreBLEU rstrips a segment before 13a, so a final "-\n" is no hyphenation to join.
    assert sentence_bleu("a b c d-\n", "a b c d-").counts == [4, 3, 2, 1]
    # No matching word: sacreBLEU stops early with all precisions 0 (printed 0.0/0.0/...).
    assert corpus_bleu(["x y z"], ["a b c"]).precisions == [0.0] * 4
    # BP is 1 unless the output is shorter than the references: 1 for empty and empty.
    assert corpus_bleu([""], [""]).bp == 1.0
    # 100 * exp(mean log(p / 100)) rounds differently from sacreBLEU's exp(mean log p).
    assert sentence_bleu("a b c d", "a b c d").score == 100.00000000000004


def test_files_as_read_score_as_sacrebleus_command_line(tmp_path):
    """`aiayn evaluate` reads its reference with read_lines(keep_bom=True) (which keeps
    trailing spaces and, as sacreBLEU does, a BOM); the sacrebleu command reads with
    newline="\\n" and rstrips each line. The
    score is the same either way: CRLF, a BOM, trailing spaces, blank lines, a line of
    spaces and no final newline."""
    ref = tmp_path / "ref.txt"
    ref.write_bytes(
        "\ufeffA man rides a bike .  \r\n\r\nTwo dogs play -\u00a0\r\n   \r\n"
        "A boy sits on a wall.\t\r\nThe end".encode()
    )
    hyp = tmp_path / "hyp.txt"
    hyp.write_bytes(b"A man rides a bike .\nTwo dogs\n\nplay -\nA boy sits on the wall .\nend\n")

    def sacrebleu_lines(path):
        with open(path, encoding="utf-8", newline="\n") as f:
            return [line.rstrip() for line in f]

    ours = corpus_bleu(read_lines(hyp), read_lines(ref, keep_bom=True))
    theirs = sacrebleu.corpus_bleu(sacrebleu_lines(hyp), [sacrebleu_lines(ref)])
    assert len(read_lines(ref)) == len(sacrebleu_lines(ref)) == 6
    assert (ours.score, ours.bp, ours.precisions) == (theirs.score, theirs.bp, theirs.precisions)
    assert (ours.counts, ours.sys_len, ours.ref_len) == (
        theirs.counts,
        theirs.sys_len,
        theirs.ref_len,
    )
    assert str(ours) == str(theirs)  # what `aiayn evaluate` prints, as sacreBLEU's


def test_evaluate_scores_a_reference_with_a_bom_as_sacrebleu_does(
    sample_model_dir, tmp_path, capsys
):
    """A byte order mark is dropped from text to translate, but `aiayn evaluate` keeps it
    in the reference, as sacreBLEU reads it: the printed BLEU equals sacreBLEU's on the
    same files (dropping it would score the first word differently)."""
    from aiayn.cli import main
    from sample_data import PAIRS

    src, ref, hyp = tmp_path / "src.de", tmp_path / "ref.en", tmp_path / "hyp.en"
    src.write_bytes(("\ufeff" + "\n".join(de for de, _ in PAIRS[:8]) + "\n").encode())
    ref.write_bytes(("\ufeff" + "\n".join(en for _, en in PAIRS[:8]) + "\n").encode())
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "-o", str(hyp)]
    assert main([*argv, "--src", str(src), "--ref", str(ref)]) == 0
    out, err = capsys.readouterr()
    printed = out.splitlines()[0]
    assert f"note: {ref} starts with a byte order mark, kept as sacreBLEU keeps it" in err
    with open(ref, encoding="utf-8", newline="\n") as f:  # as the sacrebleu command reads
        refs = [line.rstrip() for line in f]
    assert refs[0].startswith("\ufeff")
    theirs = sacrebleu.corpus_bleu(hyp.read_text().splitlines(), [refs])
    assert printed.startswith(f"BLEU = {theirs.score:.2f} ")
    assert read_lines(hyp)[0] == main_translation(sample_model_dir(), PAIRS[0][0])


def main_translation(model_dir, line: str) -> str:
    """The translation of ``line`` without a BOM before it."""
    from aiayn.translator import Translator

    return Translator.from_dir(model_dir).translate([line])[0][0]


def test_evaluate_with_several_references_scores_as_sacrebleu_does(
    sample_model_dir, tmp_path, capsys
):
    """`--ref A B` scores BLEU and chrF against both reference streams, as `sacrebleu A B
    -i HYP -m bleu chrf` does (a multi-reference test set); one of another length is
    refused naming it, and `--ref A` alone is the single-reference score, as before."""
    from aiayn.cli import main
    from sample_data import PAIRS

    pairs = PAIRS[:8]
    src, hyp = tmp_path / "src.de", tmp_path / "hyp.en"
    src.write_text("".join(f"{de}\n" for de, _ in pairs), encoding="utf-8")
    paths = [tmp_path / "ref1.en", tmp_path / "ref2.en"]
    shifted = [en for _, en in pairs[1:] + pairs[:1]]  # each line another sentence's
    paths[0].write_text("".join(f"{en}\n" for en in shifted), encoding="utf-8")
    paths[1].write_text("".join(f"{en}\n" for _, en in pairs), encoding="utf-8")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "-o", str(hyp)]
    argv += ["--src", str(src)]
    scores = []
    for given, flags in ((paths[:1], ["--ref", paths[0]]), (paths, ["--ref", *paths])):
        assert main([*argv, *map(str, flags)]) == 0
        bleu_line, chrf_line = capsys.readouterr().out.splitlines()
        hyps = hyp.read_text(encoding="utf-8").splitlines()
        streams = [p.read_text(encoding="utf-8").splitlines() for p in given]
        bleu = sacrebleu.corpus_bleu(hyps, streams)
        metric = sacrebleu.metrics.CHRF()
        chrf = metric.corpus_score(hyps, streams)
        assert bleu_line.startswith(f"{bleu} ") and f"nrefs:{len(given)}|" in bleu_line
        assert chrf_line == f"{chrf}  [{metric.get_signature()}]"
        scores.append(bleu.score)
    assert scores[1] > scores[0] + 10  # the second, right, reference counts
    assert main([*argv, "--ref", str(paths[0]), "--ref", str(paths[1])]) == 0  # repeated
    assert capsys.readouterr().out.startswith(bleu_line)
    paths[1].write_text("only one line\n", encoding="utf-8")
    assert main([*argv, "--ref", *map(str, paths)]) == 2
    assert f"{src} has 8 line(s) but {paths[1]} has 1" in capsys.readouterr().err


def test_evaluate_tokenizes_as_asked_and_says_when_13a_misfits(sample_model_dir, tmp_path, capsys):
    """`--tokenize X` scores as `sacrebleu -tok X` (named in the signature); references
    mostly in a script written without spaces get a note pointing at zh and char when
    scored with 13a, and English ones get none."""
    from aiayn.cli import main
    from sample_data import PAIRS

    pairs = PAIRS[:8]
    src, hyp, ref = tmp_path / "src.de", tmp_path / "hyp.en", tmp_path / "ref.txt"
    src.write_text("".join(f"{de}\n" for de, _ in pairs), encoding="utf-8")
    ref.write_text("".join(f"{en}\n" for _, en in pairs), encoding="utf-8")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "-o", str(hyp)]
    argv += ["--src", str(src), "--ref", str(ref)]
    assert main(argv) == 0
    assert "note:" not in capsys.readouterr().err
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    # References with Chinese words among the model's own: each tokenization scores apart.
    mixed = [h.replace(" ", "猫，", 1) + "。狗" for h in hyps]
    ref.write_text("".join(f"{r}\n" for r in mixed), encoding="utf-8")
    scores = set()
    for name in TOKENIZERS:
        assert main([*argv, "--tokenize", name]) == 0
        bleu_line = capsys.readouterr().out.splitlines()[0]
        theirs = sacrebleu.corpus_bleu(hyps, [mixed], tokenize=name)
        assert bleu_line.startswith(f"{theirs} ") and f"|tok:{name}|" in bleu_line
        scores.add(theirs.score)
    assert len(scores) == len(TOKENIZERS)
    chinese = ["一只狗在雪地里跑。"] * len(pairs)
    assert unsegmented_share(chinese) > 0.8 and unsegmented_share(mixed) < 0.5
    ref.write_text("".join(f"{r}\n" for r in chinese), encoding="utf-8")
    assert main(argv) == 0
    assert "--tokenize zh or char" in capsys.readouterr().err
    assert main([*argv, "--tokenize", "zh"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_evaluate_lowercase_scores_as_sacrebleu_lc(sample_model_dir, tmp_path, capsys):
    """`--lowercase` is sacreBLEU's -lc for BLEU and chrF alike (a lowercased test set),
    named in the signature; without it the case counts."""
    from aiayn.cli import main
    from sample_data import PAIRS

    pairs = PAIRS[:8]
    src, hyp, ref = tmp_path / "src.de", tmp_path / "hyp.en", tmp_path / "ref.en"
    src.write_text("".join(f"{de}\n" for de, _ in pairs), encoding="utf-8")
    refs = [en.lower() for _, en in pairs]
    ref.write_text("".join(f"{r}\n" for r in refs), encoding="utf-8")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet", "-o", str(hyp)]
    argv += ["--src", str(src), "--ref", str(ref)]
    printed = {}
    for flags in ([], ["--lowercase"]):
        assert main([*argv, *flags]) == 0
        printed[bool(flags)] = capsys.readouterr().out.splitlines()
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    for lowercase, (bleu_line, chrf_line) in printed.items():
        bleu = sacrebleu.corpus_bleu(hyps, [refs], lowercase=lowercase)
        metric = sacrebleu.metrics.CHRF(lowercase=lowercase)
        chrf = metric.corpus_score(hyps, [refs])
        assert bleu_line.startswith(f"{bleu} ")
        case = f"|case:{'lc' if lowercase else 'mixed'}|"
        assert case in bleu_line and case in chrf_line  # each says how it was scored
        assert chrf_line == f"{chrf}  [{metric.get_signature()}]"
    assert printed[True][0] != printed[False][0]  # the case mattered
