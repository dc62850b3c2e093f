"""bf16: decoding with bf16 weights (``--precision bf16``) and training under bf16 autocast
(recipe ``precision=bf16``) on the CPU, as on a GPU."""

from __future__ import annotations

import pytest
import torch

from aiayn.checkpoint import load_checkpoint, load_model, resolve_checkpoint
from aiayn.cli import main
from aiayn.translator import Translator
from conftest import small_corpus
from numerics_util import log_probs, margins_and_shift
from sample_data import PAIRS
from test_pipeline import records, train_argv

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without

SOURCES = [s for s, _ in PAIRS]  # 60 seen in training, 10 never seen
REFERENCES = [t for _, t in PAIRS]


def test_bf16_weights_translate_like_fp32(sample_model_dir):
    path = resolve_checkpoint(sample_model_dir(False))
    model, tokenizer = load_model(path)
    model_bf16, _ = load_model(path, precision="bf16")
    assert all(p.dtype == torch.bfloat16 for p in model_bf16.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-9 per weight and activation):
    # a sentence whose float greedy path is won at every step by more than bf16 moves the
    # gap between the two best tokens (measured 0.24 nats at most) translates the same
    # (x1.5: the Translator batches, and so pads and rounds, differently from this check).
    narrowest, gap_shift = margins_and_shift(
        model, lambda s, t: log_probs(model_bf16, s, t), tokenizer, SOURCES
    )
    safe = [i for i, g in enumerate(narrowest) if g > 1.5 * gap_shift]
    assert len(safe) >= 60, (gap_shift, sorted(narrowest))  # the memorised pairs at least
    for beam in (1, 4):
        fp32 = Translator(model, tokenizer).translate(SOURCES, beam=beam)
        bf16 = Translator(model_bf16, tokenizer).translate(SOURCES, beam=beam)
        assert [i for i in safe if fp32[i] != bf16[i]] == []
        assert sum(t[0] == ref for t, ref in zip(bf16[:60], REFERENCES)) >= 40


def test_load_model_rejects_bad_precision_choices(sample_model_dir):
    path = resolve_checkpoint(sample_model_dir(False))
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        load_model(path, precision="fp16")
    with pytest.raises(ValueError, match="exclude each other"):
        load_model(path, quantize=True, precision="bf16")


def test_cli_precision_for_translate_and_evaluate(sample_model_dir, tmp_path, capsys):
    model_dir = sample_model_dir(False)
    src, ref = tmp_path / "in.de", tmp_path / "ref.en"
    src.write_text("".join(s + "\n" for s in SOURCES[:8]), encoding="utf-8")
    ref.write_text("".join(t + "\n" for t in REFERENCES[:8]), encoding="utf-8")
    common = ["--model", str(model_dir), "--precision", "bf16", "--quiet"]
    assert main(["translate", *common, str(src), "-o", str(tmp_path / "out.en")]) == 0
    out = (tmp_path / "out.en").read_text(encoding="utf-8").splitlines()
    assert len(out) == 8 and sum(a == b for a, b in zip(out, REFERENCES)) >= 5
    assert main(["evaluate", *common, "--src", str(src), "--ref", str(ref)]) == 0
    assert "BLEU" in capsys.readouterr().out
    assert main(["translate", *common, "--quantize", str(src)]) == 2
    err = capsys.readouterr().err
    assert "exclude each other" in err and "Traceback" not in err


@pytest.mark.slow
def test_bf16_autocast_training_on_cpu(tmp_path):
    corpus = small_corpus(tmp_path / "corpus")
    out = tmp_path / "model"
    assert main(train_argv(corpus, out, "max_steps=12", "precision=bf16")) == 0
    train = records(out, "train")
    assert train and all(r["loss"] == r["loss"] and 0 < r["loss"] < 20 for r in train)
    assert train[-1]["loss"] < train[0]["loss"]  # it learns
    state = load_checkpoint(out / "checkpoint_last.pt")
    assert state["step"] == 12
    # Autocast computes in bf16 but the weights (and Adam's state) stay float32.
    assert all(t.dtype == torch.float32 for t in state["model"].values() if t.is_floating_point())
