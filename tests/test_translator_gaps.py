"""Translator defaults that the suite left unchecked (found by a mutation run)."""

from __future__ import annotations

import pytest

from aiayn.decode import DecodeOptions
from aiayn.translator import Translator
from sample_data import PAIRS


@pytest.fixture(scope="module")
def translator(sample_model_dir):
    return Translator.from_dir(sample_model_dir(False))


LINES = [src for src, _ in PAIRS[:3]]


def test_translations_score_greedy_outputs_by_default(translator):
    """scores=False is what lets greedy decoding skip the log-probs; by default
    translations() and hypotheses() give the real log-probability, also for beam 1."""
    found = translator.translations(LINES, beam=1)
    assert all(out and out[0].log_prob < 0 for out in found)
    ids = [translator.encode(line) for line in LINES]
    hyps = translator.hypotheses(ids, DecodeOptions(beam=1))
    assert all(h and h[0].log_prob < 0 for h in hyps)
    assert [h[0].log_prob for h in hyps] == pytest.approx([t[0].log_prob for t in found])


def test_seeded_samples_of_translations_are_those_of_translate(translator):
    """Line i is line first_line + i of the input (default 0), which seeds its samples:
    translations() and translate() (and hypotheses(), lines default 0..n-1) draw the same."""
    sample = DecodeOptions(beam=1, sampling=True, n_best=3, seed=7)
    texts = translator.translate(LINES, sample)
    found = translator.translations(LINES, sample)
    assert [[t.text for t in out] for out in found] == texts
    assert found == translator.translations(LINES, sample, first_line=0)
    ids = [translator.encode(line) for line in LINES]
    hyps = translator.hypotheses(ids, sample)
    assert [[h.tokens for h in out] for out in hyps] == [[t.ids for t in out] for out in found]


def test_settings_are_checked_before_any_file_is_read(tmp_path):
    """from_dir checks quantize/precision first: a bad setting is named even when the
    model directory does not exist (no missing-file error hides it)."""
    from aiayn.errors import AiaynError

    with pytest.raises(AiaynError, match="precision must be one of"):
        Translator.from_dir(tmp_path / "absent", precision="fp8")
    with pytest.raises(AiaynError, match="quantize must be True or False"):
        Translator.from_dir(tmp_path / "absent", quantize="no")


def test_ensembles_of_several_checkpoints_of_one_directory_and_one_per_directory(
    sample_model_dir,
):
    """checkpoint: several checkpoints of one directory, or one per directory, make an
    ensemble of that many models; other counts are refused naming both."""
    from aiayn.errors import AiaynError

    d = sample_model_dir(False)
    best = "checkpoint_best.pt"
    one = Translator.from_dir(d, [best, best])
    assert len(one.models) == 2
    each = Translator.from_dir([d, d], [best, best])
    assert len(each.models) == 2
    single = Translator.from_dir(d)
    assert (
        each.translate(LINES, beam=2)
        == single.translate(LINES, beam=2)
        == one.translate(LINES, beam=2)
    )
    with pytest.raises(AiaynError, match="2 model directories but 3 checkpoints"):
        Translator.from_dir([d, d], [best, best, best])


def test_an_ensemble_of_two_tokenizers_names_the_first_member(sample_model_dir, tmp_path):
    """The refusal names the checkpoint whose tokenizer differs and the first one's."""
    import torch

    from aiayn.checkpoint import save_checkpoint
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.errors import AiaynError

    d = sample_model_dir(False)
    state = torch.load(d / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    other = Tokenizer.train(
        [s.upper() for pair in PAIRS for s in pair], tmp_path / "spm", vocab_size=160, num_threads=1
    )
    assert other.to_bytes() != state["tokenizer"]
    state["tokenizer"] = other.to_bytes()
    (tmp_path / "m").mkdir()
    save_checkpoint(state, tmp_path / "m" / "checkpoint_best.pt")
    first = d / "checkpoint_best.pt"
    with pytest.raises(AiaynError) as e:
        Translator.from_dir([d, tmp_path / "m"])
    assert f"another tokenizer than {first}" in str(e.value)


def test_prefixes_must_be_one_per_line(translator):
    from aiayn.errors import AiaynError

    for prefixes in (["A"], ["A", "A", "A", "A"]):
        with pytest.raises(AiaynError, match=f"{len(prefixes)} prefixes for 3 input lines"):
            translator.translations(LINES, prefixes=prefixes)


def test_options_defaults_and_unknown_settings(translator):
    """options() with nothing given is the translator's defaults; an unknown keyword
    setting is one AiaynError naming it (not a TypeError from deep inside)."""
    from aiayn.errors import AiaynError

    assert translator.options() == translator.defaults
    assert translator.options(None, None) == translator.defaults
    with pytest.raises(AiaynError, match=r"unknown decoding setting\(s\): bogus, nbest"):
        translator.translate(LINES, nbest=2, bogus=1)


def test_bad_generation_settings_of_a_checkpoint_are_refused_naming_it(sample_model_dir, tmp_path):
    """A checkpoint carrying generation settings the options refuse: one AiaynError that
    names the file, not a Translator built (or None returned)."""
    import torch

    from aiayn.checkpoint import save_checkpoint
    from aiayn.errors import AiaynError

    state = torch.load(
        sample_model_dir(False) / "checkpoint_best.pt", map_location="cpu", weights_only=False
    )
    state["generation"] = {"num_beams": 0}
    save_checkpoint(state, tmp_path / "checkpoint_best.pt")
    with pytest.raises(AiaynError, match=r"checkpoint_best\.pt: generation settings: beam"):
        Translator.from_dir(tmp_path)


def test_lines_are_decoded_64_to_a_batch_by_default(translator):
    """batch_size defaults to 64 in translate(), translations() and hypotheses():
    on_batch hears of 64 lines, then of the rest."""
    lines = [src for src, _ in PAIRS][:40] * 2  # 80 lines
    for call in ("translate", "translations"):
        told: list[int] = []
        getattr(translator, call)(lines, beam=1, max_new_tokens=2, on_batch=told.append)
        assert told == [64, 16], call
    told = []
    ids = [translator.encode(line) for line in lines]
    translator.hypotheses(ids, DecodeOptions(beam=1, max_new_tokens=2), on_batch=told.append)
    assert told == [64, 16]
