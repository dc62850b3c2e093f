"""Corpus BLEU from its definition (Papineni et al. 2002), with sacreBLEU's defaults:
13a tokenization, clipped 1-4-gram precisions, geometric mean, brevity penalty, "exp"
smoothing. sacreBLEU's other built-in tokenizations are here too ("intl", "zh", "char",
"none"). No dependency on sacrebleu (the tests compare against it)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, cast

from aiayn.errors import AiaynError

MAX_ORDER = 4

_13A_RULES = [  # mteval-v13a, as sacreBLEU's TokenizerRegexp
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),  # punctuation and symbols
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),  # period/comma unless preceded by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),  # period/comma unless followed by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # dash after a digit
]

# The characters sacreBLEU's "zh" tokenization splits off one by one: CJK ideographs,
# radicals, strokes, full-width forms, CJK punctuation and some symbol blocks. Two of its
# ranges are written "\u20000" and "\u2f800" (meant as U+20000 and U+2F800), which Python
# reads as U+2000 + "0" and U+2F80 + "0"; compared as strings they admit U+2001..U+2A6D
# and U+2F81..U+2FA1, so those are the ranges here too, and scores stay equal to its own.
_ZH_RANGES = [
    (0x3400, 0x4DB5), (0x4E00, 0x9FA5), (0x9FA6, 0x9FBB), (0xF900, 0xFA2D),
    (0xFA30, 0xFA6A), (0xFA70, 0xFAD9), (0x2001, 0x2A6D), (0x2F81, 0x2FA1),
    (0xFF00, 0xFFEF), (0x2E80, 0x2EFF), (0x3000, 0x303F), (0x31C0, 0x31EF),
    (0x2F00, 0x2FDF), (0x2FF0, 0x2FFF), (0x3100, 0x312F), (0x31A0, 0x31BF),
    (0xFE10, 0xFE1F), (0xFE30, 0xFE4F), (0x2600, 0x26FF), (0x2700, 0x27BF),
    (0x3200, 0x32FF), (0x3300, 0x33FF),
]  # fmt: skip


def _split_13a(line: str) -> str:
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


@lru_cache(maxsize=2**16)
def tokenize_13a(line: str) -> str:
    """The "13a" tokenization of mteval-v13a (WMT's, sacreBLEU's default)."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&")
        line = line.replace("&lt;", "<").replace("&gt;", ">")
    return _split_13a(f" {line} ")


@lru_cache(maxsize=2**16)
def tokenize_intl(line: str) -> str:
    """The "intl" tokenization of mteval-v14's international mode (sacreBLEU's
    ``-tok intl``): Unicode punctuation split off unless between digits, symbols always."""
    for pattern, replacement in _intl_rules():
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


@lru_cache(maxsize=1)
def _intl_rules() -> list[tuple[Any, str]]:
    import regex  # sacreBLEU's dependency, for the Unicode classes that re lacks

    return [
        (regex.compile(r"(\P{N})(\p{P})"), r"\1 \2 "),  # punctuation after a non-digit
        (regex.compile(r"(\p{P})(\P{N})"), r" \1 \2"),  # punctuation before a non-digit
        (regex.compile(r"(\p{S})"), r" \1 "),  # symbols
    ]


@lru_cache(maxsize=2**16)
def tokenize_zh(line: str) -> str:
    """The "zh" tokenization (sacreBLEU's ``-tok zh``): every Chinese character is a word of
    its own, the rest is split by 13a's rules (without its HTML unescaping)."""
    spaced = (f" {c} " if _is_zh(c) else c for c in line.strip())
    return _split_13a("".join(spaced))


@lru_cache(maxsize=2**16)
def _is_zh(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in _ZH_RANGES)


def tokenize_char(line: str) -> str:
    """The "char" tokenization (sacreBLEU's ``-tok char``): every character a word."""
    return " ".join(line)


def unsegmented_share(texts: Sequence[str]) -> float:
    """The share of the non-space characters of ``texts`` that are CJK ideographs, kana or
    Hangul: scripts written without spaces between words, which 13a leaves as one word."""
    chars = [c for text in texts for c in text if not c.isspace()]
    return sum(map(_unsegmented, chars)) / len(chars) if chars else 0.0


def _unsegmented(char: str) -> bool:
    code = ord(char)
    return (
        0x3040 <= code <= 0x30FF  # hiragana, katakana
        or 0x3400 <= code <= 0x9FFF  # CJK ideographs (and extension A)
        or 0xAC00 <= code <= 0xD7AF  # Hangul syllables
        or 0x20000 <= code <= 0x3134F  # CJK extensions B-G
    )


# tokenize= name -> the function (sacreBLEU's names; "none" splits on whitespace only).
TOKENIZERS: dict[str, Callable[[str], str]] = {
    "13a": tokenize_13a,
    "intl": tokenize_intl,
    "zh": tokenize_zh,
    "char": tokenize_char,
    "none": str,
}


def _ngrams(words: list[str]) -> Counter:
    return Counter(
        tuple(words[i : i + n]) for n in range(1, MAX_ORDER + 1) for i in range(len(words) - n + 1)
    )


@dataclass
class BLEUScore:
    score: float  # 0..100
    precisions: list[float]  # modified n-gram precisions, percent, n = 1..4
    bp: float  # brevity penalty
    sys_len: int
    ref_len: int
    counts: list[int] = field(default_factory=list)  # clipped matches per order
    totals: list[int] = field(default_factory=list)  # hypothesis n-grams per order
    signature: str = ""

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        return (
            f"BLEU = {self.score:.2f} {p} (BP = {self.bp:.3f} ratio = {ratio:.3f} "
            f"hyp_len = {self.sys_len} ref_len = {self.ref_len})"
        )


def _corpus_statistics(
    hypotheses: Sequence[str],
    streams: Sequence[Sequence[str | None]],
    prepare: Callable[[str], list[str]],
) -> tuple[list[int], list[int], int, int, set[int]]:
    """Clipped n-gram matches and hypothesis n-grams per order, summed over the corpus, the
    hypothesis and (closest, shorter on ties) reference lengths, and the numbers of
    references the segments have (a None reference is none, as in sacreBLEU)."""
    counts, totals = [0] * MAX_ORDER, [0] * MAX_ORDER
    sys_len = ref_len = 0
    n_refs = set()
    for i, hyp in enumerate(hypotheses):
        words = prepare(hyp)
        refs = [prepare(ref) for ref in (stream[i] for stream in streams) if ref is not None]
        if not refs:
            raise AiaynError(f"BLEU: hypothesis {i + 1} has no reference (every one is None)")
        n_refs.add(len(refs))
        sys_len += len(words)
        ref_len += min((abs(len(r) - len(words)), len(r)) for r in refs)[1]
        max_ref: Counter = Counter()
        for r in refs:
            max_ref |= _ngrams(r)  # | keeps the max count of each n-gram (clipping)
        for gram, count in _ngrams(words).items():
            counts[len(gram) - 1] += min(count, max_ref[gram])
        for n in range(1, MAX_ORDER + 1):
            totals[n - 1] += max(len(words) - n + 1, 0)
    return counts, totals, sys_len, ref_len, n_refs


def _precisions(counts: list[int], totals: list[int], smooth: str) -> list[float]:
    """p_n in percent; with "exp" smoothing a zero count becomes 1 / (2^k * total) for the
    k-th zero, as sacreBLEU's. No match at all: all 0 (sacreBLEU stops early there)."""
    if not any(counts):
        return [0.0] * MAX_ORDER
    precisions, smooth_factor = [], 1.0
    for n in range(MAX_ORDER):
        if totals[n] == 0:
            precisions.append(0.0)
        elif counts[n] == 0 and smooth == "exp":
            smooth_factor *= 2
            precisions.append(100.0 / (smooth_factor * totals[n]))
        else:
            precisions.append(100.0 * counts[n] / totals[n])
    return precisions


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str | None]],
    lowercase: bool = False,
    tokenize: str = "13a",
    smooth: str = "exp",
    effective_order: bool = False,
) -> BLEUScore:
    """BLEU of a whole corpus. ``references`` is one string per hypothesis, or (as in
    sacreBLEU) a list of reference streams, each with one string per hypothesis, or None
    where that stream has no reference for it (segments with a variable number of
    references: the signature's ``nrefs:var``).

    BLEU = BP * exp(mean_n log p_n), p_n = clipped n-gram matches / hypothesis n-grams
    summed over the corpus, BP = exp(1 - r / c) if c < r else 1, where c is the hypothesis
    length and r the closest reference length (the shorter on ties). With
    ``effective_order`` (sacreBLEU's, for single sentences) the mean runs over the orders
    the hypothesis has n-grams of, so a 3-word output is not 0 for want of 4-grams.
    ``tokenize`` names sacreBLEU's tokenization (:data:`TOKENIZERS`): "13a" (its default),
    "intl", "zh" (Chinese), "char" (Japanese and Korean without MeCab), "none". A bare
    string for either (its characters would be scored as sentences) is an AiaynError.
    """
    for name, given in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(given, str):
            raise AiaynError(f"{name}: a list of sentences, not a str (scored letter by letter)")
    streams: list[list[str | None]]
    if references and all(r is None or isinstance(r, str) for r in references):  # one stream
        streams = [list(cast("Sequence[str]", references))]
    else:
        streams = [list(s) for s in references]
    for stream in streams:
        if len(stream) != len(hypotheses):
            raise AiaynError(
                f"BLEU needs one reference per hypothesis: {len(hypotheses)} hypotheses, "
                f"{len(stream)} references"
            )
    if tokenize not in TOKENIZERS:
        raise AiaynError(f"tokenize must be one of {', '.join(TOKENIZERS)}, got {tokenize!r}")
    if smooth not in ("exp", "none"):
        raise AiaynError(f"smooth must be 'exp' or 'none', got {smooth!r}")

    def prepare(text: str) -> list[str]:
        # rstrip before tokenizing, as sacreBLEU: a line's trailing "-\n" stays a dash
        text = (text.lower() if lowercase else text).rstrip()
        return TOKENIZERS[tokenize](text).split()

    counts, totals, sys_len, ref_len, n_refs = _corpus_statistics(hypotheses, streams, prepare)
    precisions = _precisions(counts, totals, smooth)
    # No matching unigram at all scores 0, smoothing or not (sacreBLEU's early stop, #141).
    orders = MAX_ORDER
    if effective_order:
        orders = sum(1 for total in totals if total > 0)
    used = precisions[:orders]
    # BP is 1 unless the output is shorter (so 1 for an empty output of empty references).
    bp = 1.0 if sys_len >= ref_len else (math.exp(1 - ref_len / sys_len) if sys_len else 0.0)
    if sys_len == 0 or not any(counts) or min(used, default=0.0) == 0.0:
        score = 0.0
    else:  # sacreBLEU's float operations in its order, so the score is the same bits
        score = bp * math.exp(sum(math.log(p) for p in used) / orders)
    nrefs = n_refs.pop() if len(n_refs) == 1 else "var" if n_refs else len(streams)
    signature = (
        f"nrefs:{nrefs}|case:{'lc' if lowercase else 'mixed'}|"
        f"eff:{'yes' if effective_order else 'no'}|tok:{tokenize}|"
        f"smooth:{smooth}|version:aiayn"
    )
    return BLEUScore(score, precisions, bp, sys_len, ref_len, counts, totals, signature)


def sentence_bleu(hypothesis: str, reference: str) -> BLEUScore:
    """BLEU of one sentence against one reference, as sacreBLEU's sentence_bleu: "exp"
    smoothing and the effective order, so that a missing n-gram order lowers the score
    rather than zeroing it (for ranking candidates; corpus BLEU is what to report)."""
    return corpus_bleu([hypothesis], [reference], effective_order=True)
