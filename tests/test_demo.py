"""The README's main command: `aiayn demo` trains and translates held-out numbers."""

from __future__ import annotations

import pytest

from aiayn.cli import main
from aiayn.data.demo import as_pair, make_splits, number_to_words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (40, "forty"),
        (105, "one hundred five"),
        (1000, "one thousand"),
        (20019, "twenty thousand nineteen"),
        (999999, "nine hundred ninety nine thousand nine hundred ninety nine"),
    ],
)
def test_number_to_words(n, words):
    assert number_to_words(n) == words


def test_splits_are_disjoint_and_deterministic():
    train, test = make_splits(2000, 300, seed=3)
    assert not set(train) & set(test)
    assert (train, test) == make_splits(2000, 300, seed=3)
    assert as_pair(407113) == ("4 0 7 1 1 3", "four hundred seven thousand one hundred thirteen")


@pytest.mark.slow
def test_demo_reaches_95_percent_exact_match(capsys):
    code = main(["demo", "--no-progress", "--min-accuracy", "0.95"])
    out = capsys.readouterr().out
    assert "exact match on 1000 held-out numbers" in out
    accuracy = float(out.split("held-out numbers: ")[1].split("%")[0])
    assert accuracy >= 95.0
    assert code == 0
