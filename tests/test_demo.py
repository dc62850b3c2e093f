"""The README's main command: `aiayn demo` trains and translates held-out numbers."""

from __future__ import annotations

import re

import pytest

from aiayn.cli import main
from aiayn.data.demo import as_pair, make_splits, number_to_words, word_sources
from aiayn.errors import AiaynError


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
    # More numbers than 0..999,999 holds drew forever; a negative count gave a short list.
    for counts, message in (((999_999, 2), "the demo has 1,000,000"), ((-1, 5), "n_train")):
        with pytest.raises(AiaynError, match=message):
            make_splits(*counts)
    assert as_pair(407113) == ("4 0 7 1 1 3", "four hundred seven thousand one hundred thirteen")


@pytest.mark.slow
def test_demo_reaches_95_percent_exact_match(capsys):
    code = main(["demo", "--no-progress", "--min-accuracy", "0.95"])
    out = capsys.readouterr().out
    assert "exact match on 1000 held-out numbers" in out
    accuracy = float(out.split("held-out numbers: ")[1].split("%")[0])
    assert accuracy >= 95.0
    assert code == 0
    # The word alignment read off the cross-attention (issue 19's default layer, the last)
    # beats a random choice of source digit by far; the figures are printed per layer.
    line = out.split("word alignment from cross-attention: ")[1].splitlines()[0]
    layers = [float(a) for _, a in re.findall(r"layer (\d+) ([\d.]+)%", line)]
    chance = float(line.split("chance ")[1].split("%")[0])
    assert len(layers) == 2 and 5.0 < chance < 40.0
    assert layers[-1] >= 2 * chance and layers[-1] == max(layers)


def test_true_alignment_of_the_demo_task():
    assert word_sources(407113) == [{0}, {0}, {2}, {2}, {3}, {3}, {4, 5}]
    assert word_sources(10010) == [{0, 1}, {1}, {3, 4}]  # "ten thousand ten"
    assert word_sources(0) == [{0}]
    for n in range(0, 1_000_000, 997):
        assert len(word_sources(n)) == len(as_pair(n)[1].split())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--steps", "-5"], "--steps must be at least 1, got -5"),
        (["--min-accuracy", "2"], r"--min-accuracy must be in \[0, 1\], got 2.0"),
        (["--min-accuracy", "nan"], r"--min-accuracy must be in \[0, 1\], got nan"),
        (["--min-accuracy", "-0.1"], r"--min-accuracy must be in \[0, 1\]"),
        (["--seed", "99999999999999999999999"], r"--seed must be in \[0, 2\*\*63 - 1\]"),
        (["--seed", "-1"], r"--seed must be in \[0, 2\*\*63 - 1\], got -1"),
    ],
)
def test_demo_settings_that_cannot_work_are_refused_before_training(
    flags, message, capsys, monkeypatch
):
    from aiayn.train import demo

    def trains(**kwargs):
        raise AssertionError("the demo started training")

    monkeypatch.setattr(demo, "run_demo", trains)
    assert main(["demo", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps must be an integer >= 1, got 0"),
        ({"batch_size": -1}, "batch_size must be an integer >= 1"),
        ({"seed": 2**63}, r"seed must be an integer in \[0, 2\*\*63 - 1\]"),
        ({"seed": -1}, "seed must be an integer in"),
        ({"n_test": 950_001}, "n_test must be at most 950,000"),  # drew numbers forever
    ],
)
def test_run_demo_refuses_settings_before_training(kwargs, message):
    from aiayn.errors import AiaynError
    from aiayn.train.demo import run_demo

    logged: list[str] = []
    with pytest.raises(AiaynError, match=message):
        run_demo(progress=False, log=logged.append, **kwargs)
    assert logged == []  # nothing built or trained
