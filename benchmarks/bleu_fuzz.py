"""Differential fuzz of our BLEU (aiayn.metrics.bleu) against sacreBLEU's.

    python benchmarks/bleu_fuzz.py [--seed 1] [--cases 2000]

Each case draws a small random corpus (1-6 lines, 1-3 reference streams) from a small
vocabulary (so that n-grams match) mixed with every kind of text 13a and str.split treat
specially: ASCII punctuation and symbols, numbers with . , - (13a's digit rules), HTML
entities, "<skipped>", embedded \\n and "-\\n", tabs, \\r, Unicode spaces (U+00A0, U+2009,
U+3000, U+2028, \\x1c-\\x1f, \\x85), zero-width characters, a BOM, CJK, Arabic, emoji,
combining accents, characters whose lowercase changes length (İ), empty lines, lines of
only spaces, very long lines, hypotheses longer or shorter than their references. It is
scored in every setting (tokenize 13a/intl/zh/char/none, lowercase, smooth exp/none,
effective order) by ``corpus_bleu`` and compared with ``sacrebleu.corpus_bleu`` and ``BLEU(...)
.corpus_score``; each line with ``sentence_bleu`` against ``sacrebleu.sentence_bleu`` and
``BLEU(effective_order=True).sentence_score``, and each line's 13a tokenization against
``Tokenizer13a``. Counts, totals and lengths must be equal, the printed line too; score,
precisions and BP equal to 1e-9 relative (bit-exact equality is counted apart). Prints the
comparisons per setting, the mismatches by kind with the shortest case of each; exits 1 on
any mismatch.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import string
import sys
from collections import Counter

from sacrebleu import corpus_bleu as sb_corpus_bleu
from sacrebleu import sentence_bleu as sb_sentence_bleu
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from aiayn.metrics import corpus_bleu, sentence_bleu, tokenize_13a
from aiayn.metrics.bleu import TOKENIZERS

WORDS = [
    "a", "man", "the", "dog", "runs", "Dog", "THE", "in", "snow", "red", "ball",
    ".", ",", "!", "?", "'s", "n't",
]  # fmt: skip
SPECIAL = [
    *string.punctuation,
    *(f"{a}{b}" for a, b in itertools.product("-.,", "-.,")),
    "3.14", "1,000", "2-3", "-5", "5-", "1.", ".5", ",7", "7,", "U.S.A.", "e.g.", "a-b",
    "&amp;", "&quot;", "&lt;", "&gt;", "&apos;", "&amp;quot;", "&", "&#39;",
    "<skipped>", "<skip", "ped>", "\n", "-\n", "x-\n", "5-\n", "\t", "\r", "\r\n",
    "\u00a0", "\u2009", "\u3000", "\u2028", "\x1c", "\x1f", "\x85", "\x0b", "\x0c",
    "\u200b", "\u200d", "\ufeff", "\u00ad",
    "猫", "一只狗在跑。", "犬が走る", "رجل", "يركض،", "🐶", "👍🏽", "e\u0301", "é", "İ", "ß", "Σ",
    "ǅ", "ﬁ", "Ⅻ", "１２３", "٣.٤", "「你好」，", "这是。", "\u2014", "\u2026", "™", "€5",
    "\u2f81", "\u2a6d", "\U00020000", "한국어", "カタカナ", "¿Qué?", "«a»",
]  # fmt: skip
TAILS = ["", " ", "  ", "\t", "\n", "-\n", " -\n", "\u00a0", "\u3000", "\r", "-", "<skipped>"]
TOL = 1e-9


def random_line(rng: random.Random, length: int) -> str:
    parts = []
    for _ in range(length):
        r = rng.random()
        parts.append(rng.choice(WORDS) if r < 0.6 else rng.choice(SPECIAL))
        parts.append(rng.choice([" ", " ", " ", "", "  ", "\t", "\u00a0"]))
    return "".join(parts) + rng.choice(TAILS)


def random_corpus(rng: random.Random) -> tuple[list[str], list[list[str]]]:
    n_lines = rng.choice([1, 1, 2, 3, 6, 40])
    n_refs = rng.choice([1, 1, 2, 3])
    refs = [[] for _ in range(n_refs)]  # type: list[list[str]]
    hyps = []
    for _ in range(n_lines):
        kind = rng.random()
        length = rng.choice([0, 1, 2, 3, 4, 6, 10]) if kind > 0.03 else rng.randint(300, 900)
        base = random_line(rng, length)
        for stream in refs:
            r = rng.random()
            if r < 0.08:
                stream.append("")
            elif r < 0.12:
                stream.append(" " * rng.randint(1, 4))
            elif r < 0.5:
                stream.append(base)
            else:
                stream.append(random_line(rng, max(0, length + rng.randint(-3, 3))))
        r = rng.random()
        if r < 0.08:
            hyps.append("")
        elif r < 0.11:
            hyps.append(rng.choice([" ", "\t", "\u3000 "]))
        elif r < 0.5:  # a reference, edited
            words = (rng.choice(refs)[-1] + " " + random_line(rng, rng.randint(0, 4))).split(" ")
            rng.shuffle(words) if rng.random() < 0.3 else None
            hyps.append(" ".join(words[: rng.randint(0, len(words))]))
        else:
            hyps.append(random_line(rng, max(0, length + rng.randint(-4, 4))))
    return hyps, refs


class Tally:
    def __init__(self) -> None:
        self.compared: Counter = Counter()
        self.exact: Counter = Counter()
        self.examples: dict = {}  # kind: the shortest case that shows it
        self.kinds: Counter = Counter()
        self.positive: Counter = Counter()  # scores above 0: the fuzz is not all zeros

    def check(self, setting: str, ours, theirs, case: object) -> None:
        self.compared[setting] += 1
        fields = []
        for name in ("counts", "totals", "sys_len", "ref_len"):
            if list_or(getattr(ours, name)) != list_or(getattr(theirs, name)):
                fields.append(name)
        for name in ("score", "bp"):
            if not close(getattr(ours, name), getattr(theirs, name)):
                fields.append(name)
        if len(ours.precisions) != len(theirs.precisions) or not all(
            close(a, b) for a, b in zip(ours.precisions, theirs.precisions)
        ):
            fields.append("precisions")
        if str(ours) != str(theirs):  # the line `aiayn evaluate` prints
            fields.append("str")
        if fields:
            kind = (setting.split("|")[0], tuple(fields))
            self.kinds[kind] += 1
            text = (
                f"{setting}: {fields}\n  case={case!r}\n  ours  ={describe(ours)}"
                f"\n  theirs={describe(theirs)}"
            )
            if kind not in self.examples or len(repr(case)) < self.examples[kind][0]:
                self.examples[kind] = (len(repr(case)), text)
        self.positive[setting] += theirs.score > 0
        if not fields and (ours.score, ours.bp, ours.precisions) == (
            theirs.score,
            theirs.bp,
            theirs.precisions,
        ):
            self.exact[setting] += 1


def list_or(x):
    return list(x) if isinstance(x, (list, tuple)) else x


def close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=TOL, abs_tol=0.0)


def describe(s) -> str:
    return (
        f"score={s.score!r} p={list(s.precisions)} bp={s.bp!r} c={list(s.counts)} "
        f"t={list(s.totals)} sys={s.sys_len} ref={s.ref_len}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tally, tok = Tally(), Tokenizer13a()
    tok_compared, tok_bad = 0, []
    settings = list(itertools.product(TOKENIZERS, (False, True), ("exp", "none"), (False, True)))
    metrics = {
        s: BLEU(lowercase=s[1], tokenize=s[0], smooth_method=s[2], effective_order=s[3])
        for s in settings
    }
    sentence_metric = BLEU(effective_order=True)
    for _ in range(args.cases):
        hyps, refs = random_corpus(rng)
        for line in hyps + [r for s in refs for r in s]:
            tok_compared += 1
            if tokenize_13a(line) != tok(line):
                tok_bad.append(line)
        for s in settings:
            tokenize, lowercase, smooth, eff = s
            name = (
                f"corpus|tok:{tokenize}|lc:{lowercase}|smooth:{smooth}|eff:{eff}|refs:{len(refs)}"
            )
            ours = corpus_bleu(hyps, refs, lowercase, tokenize, smooth, eff)
            theirs = sb_corpus_bleu(
                hyps, refs, smooth_method=smooth, lowercase=lowercase, tokenize=tokenize,
                use_effective_order=eff,
            )  # fmt: skip
            tally.check(name, ours, theirs, (hyps, refs))
            obj = metrics[s].corpus_score(hyps, refs)
            tally.check("BLEU()." + name, ours, obj, (hyps, refs))
            if len(refs) == 1:  # one stream as a plain list
                tally.check(
                    "flat-refs|" + name,
                    corpus_bleu(hyps, refs[0], lowercase, tokenize, smooth, eff),
                    theirs,
                    (hyps, refs),
                )
        for i, hyp in enumerate(hyps):
            ref = refs[0][i]
            ours = sentence_bleu(hyp, ref)
            tally.check("sentence_bleu", ours, sb_sentence_bleu(hyp, [ref]), (hyp, ref))
            tally.check(
                "BLEU().sentence_score",
                ours,
                sentence_metric.sentence_score(hyp, [ref]),
                (hyp, ref),
            )

    for setting in sorted(tally.compared):
        print(
            f"{tally.compared[setting]:6d} compared, {tally.exact[setting]:6d} bit-exact, "
            f"{tally.positive[setting]:6d} above 0  {setting}"
        )
    print(f"{tok_compared} lines tokenized, {len(tok_bad)} differ from Tokenizer13a")
    for line in tok_bad[:10]:
        print(f"  13a differs: {line!r}: {tokenize_13a(line)!r} != {tok(line)!r}")
    print(f"{sum(tally.kinds.values())} mismatches")
    for kind, n in tally.kinds.most_common():
        print(f"  {n:6d} {kind}")
    for _, text in tally.examples.values():
        print(text)
    return 1 if tally.kinds or tok_bad else 0


if __name__ == "__main__":
    sys.exit(main())
