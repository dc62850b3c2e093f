"""The built-in demo task: write a number given as digits in English words.

    "4 0 7 1 1 3"  ->  "four hundred seven thousand one hundred thirteen"

It needs attention across positions: the word for a digit depends on where it stands and
on its neighbours ("1 3" -> "thirteen", "0" often -> nothing, "thousand" only when the
upper three digits are not all zero). Generated deterministically from a seed; no files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import AiaynError

# The special tokens at their fixed ids (0..3), as in every aiayn vocabulary.
_SPECIAL_PIECES = {PAD_ID: "<pad>", BOS_ID: "<s>", EOS_ID: "</s>", UNK_ID: "<unk>"}
SPECIALS = [_SPECIAL_PIECES[i] for i in range(len(_SPECIAL_PIECES))]
ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen"]
TEENS += ["sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
MAX_NUMBER = 999_999


def number_to_words(n: int) -> str:
    """English words for 0 <= n <= 999,999, without "and" ("one hundred five")."""
    if not 0 <= n <= MAX_NUMBER:
        raise AiaynError(f"number_to_words covers 0..{MAX_NUMBER}, got {n}")
    if n == 0:
        return "zero"

    def below_thousand(k: int) -> list[str]:
        words = []
        if k >= 100:
            words += [ONES[k // 100], "hundred"]
            k %= 100
        if k >= 20:
            words.append(TENS[k // 10])
            if k % 10:
                words.append(ONES[k % 10])
        elif k >= 10:
            words.append(TEENS[k - 10])
        elif k > 0:
            words.append(ONES[k])
        return words

    thousands, rest = divmod(n, 1000)
    words = [*below_thousand(thousands), "thousand"] if thousands else []
    return " ".join(words + below_thousand(rest))


def word_sources(n: int) -> list[set[int]]:
    """The true alignment of ``as_pair(n)``: for each output word, the positions of the
    source digits it comes from. A digit word, "hundred", a tens word come from their own
    digit; a teen ("thirteen") from its two digits; "thousand" from the thousands digit;
    "zero" from the only digit."""
    digits = str(n)
    at = {len(digits) - 1 - place: place for place in range(len(digits))}  # position: place
    position = {place: pos for pos, place in at.items()}
    if n == 0:
        return [{0}]

    def group(k: int, base: int) -> list[set[int]]:  # base: place of the group's units
        h, t, u = (position.get(base + i, -1) for i in (2, 1, 0))  # -1: k has no such digit
        out = []
        if k >= 100:
            out += [{h}, {h}]  # "four hundred"
            k %= 100
        if k >= 20:
            out.append({t})
            if k % 10:
                out.append({u})
        elif k >= 10:
            out.append({t, u})
        elif k > 0:
            out.append({u})
        return out

    thousands, rest = divmod(n, 1000)
    sources = [*group(thousands, 3), {position[3]}] if thousands else []
    return sources + group(rest, 0)


@dataclass
class DemoVocab:
    """One joint word-level vocabulary for digits and number words."""

    tokens: list[str]

    @classmethod
    def build(cls) -> DemoVocab:
        words = ONES + TEENS + TENS[2:] + ["hundred", "thousand"]
        return cls(SPECIALS + [str(d) for d in range(10)] + words)

    def __post_init__(self) -> None:
        self.index = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(t, UNK_ID) for t in text.split()]

    def decode(self, ids: list[int]) -> str:
        words = []
        for i in ids:
            if i == EOS_ID:  # EOS ends the sentence
                break
            if i >= len(SPECIALS):
                words.append(self.tokens[i])
        return " ".join(words)


def make_splits(n_train: int, n_test: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Disjoint train and held-out test numbers, drawn from 0..999,999 by ``seed``.

    Half the numbers are drawn with a uniform number of digits (1..6), so short numbers
    are not swamped by the 90% of the range that has six digits. AiaynError for a count
    below 0, or counts the range cannot hold (drawing would never end).
    """
    for name, count in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise AiaynError(f"{name} must be an integer >= 0, got {count!r}")
    if n_train + n_test > MAX_NUMBER + 1:
        raise AiaynError(
            f"{n_train:,} training and {n_test:,} test numbers: the demo has "
            f"{MAX_NUMBER + 1:,} (0..{MAX_NUMBER:,})"
        )
    rng = random.Random(seed)
    chosen: set[int] = set()
    numbers: list[int] = []
    while len(numbers) < n_train + n_test:
        if rng.random() < 0.5:
            digits = rng.randint(1, 6)
            n = rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)
        else:
            n = rng.randint(0, MAX_NUMBER)
        if n not in chosen:
            chosen.add(n)
            numbers.append(n)
    return numbers[:n_train], numbers[n_train:]


def as_pair(n: int) -> tuple[str, str]:
    """(source digits separated by spaces, target words)."""
    return " ".join(str(n)), number_to_words(n)
