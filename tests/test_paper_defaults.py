"""aiayn's own models are untouched by the options added for pretrained Marian models:
configs and weights saved by the code before them load, and give bit-identical logits,
greedy and beam outputs, training losses and updated weights (the reference was written
by that code with tests/make_paper_defaults_reference.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn import Transformer, TransformerConfig
from make_paper_defaults_reference import run

REFERENCE = Path(__file__).parent / "data" / "paper_defaults_reference.pt"


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(REFERENCE, weights_only=True)


@pytest.fixture
def one_thread():
    """The reference was computed on one thread: with two, the reductions of the backward
    pass split differently and the training losses move in the last bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["post_ln_shared", "pre_ln_untied", "learned_positions"])
def test_bit_identical_to_the_code_before_the_marian_options(reference, name, one_thread):
    saved = reference[name]
    cfg = TransformerConfig.from_dict(saved["config"])  # an old config: no new fields
    assert (cfg.activation, cfg.output_bias, cfg.scale_embeddings) == ("relu", False, True)
    assert sorted(Transformer(cfg).state_dict()) == sorted(saved["model"])  # no new weights
    got = run(saved["config"], saved["model"])
    want = saved["outputs"]
    for key in ("logits", "greedy", "losses", "logits_after_training"):
        assert torch.equal(got[key], want[key]), key
    assert got["beam"] == want["beam"]
