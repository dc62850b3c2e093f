"""`aiayn train --init-from MODEL_DIR[:CHECKPOINT]`: fine-tuning an imported Marian model
(made here) on Multi30k pairs. The run takes the model's config, weights and tokenizer
(the text is encoded with it), starts a fresh optimizer and schedule, gives the source
model's validation loss at step 0 (transformers' loss too), lowers it in a few updates,
refuses a mismatched tokenizer or model field, and resumes and runs under torchrun as any
run does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import MarianMTModel, MarianTokenizer

from aiayn.checkpoint import BEST, LAST, load_checkpoint, load_model, resolve_checkpoint
from aiayn.cli import main
from aiayn.data.shards import MANIFEST
from aiayn.marian import export_marian, import_marian
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer
from aiayn.train.validation import validate
from conftest import small_corpus
from marian_util import make_marian, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.multi30k, pytest.mark.timeout(600)]
SETTINGS = [
    "max_tokens=2000", "warmup=4", "lr_scale=0.08", "label_smoothing=0.0",
    "save_every_steps=2", "threads=1", "seed=3", "valid_beam=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """An imported Marian model (its folder and model directory) and a small corpus."""
    root = tmp_path_factory.mktemp("finetune")
    write_tokenizer(root / "tok")
    make_marian(root / "hf", root / "tok", dropout=0.0)
    corpus = small_corpus(root / "corpus", n_train=120, n_valid=12)
    return {"hf": root / "hf", "model": import_marian(root / "hf", root / "model"), **corpus}


def args(source: dict, out: Path, *settings: str) -> list[str]:
    return [
        "train", "--init-from", str(source["model"]), "--out", str(out), "--no-progress",
        "--train-src", str(source["train.de"]), "--train-tgt", str(source["train.en"]),
        "--valid-src", str(source["val.de"]), "--valid-tgt", str(source["val.en"]),
        "--set", *SETTINGS, *settings,
    ]  # fmt: skip


def recipe(source: dict, *settings: str) -> Recipe:
    paths = {
        "init_from": str(source["model"]),
        "train_src": str(source["train.de"]), "train_tgt": str(source["train.en"]),
        "valid_src": str(source["val.de"]), "valid_tgt": str(source["val.en"]),
    }  # fmt: skip
    return Recipe.from_dict(paths).override([*SETTINGS, *settings])


def test_step_0_is_the_source_model_and_the_loss_falls(source, tmp_path):
    trainer = Trainer(recipe(source, "max_steps=6"), tmp_path / "run", log=lambda _: None)
    start = trainer.validate()
    # The source model, loaded as a translation model, on the same validation pairs.
    model, tokenizer = load_model(source["model"] / BEST)
    assert validate(model, trainer.valid_data, [], [], 2000, 0.0)["loss"] == start["loss"]
    # transformers' own loss (cross-entropy per target token, EOS included).
    hf = MarianMTModel.from_pretrained(source["hf"], dtype=torch.float32).eval()
    hf_tokenizer = MarianTokenizer.from_pretrained(source["hf"])
    batch = hf_tokenizer(
        trainer.valid_src, text_target=trainer.valid_ref, return_tensors="pt", padding=True
    )
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_id, -100)
    with torch.no_grad():
        theirs = hf(batch["input_ids"], batch["attention_mask"], labels=labels).loss.item()
    assert start["loss"] == pytest.approx(theirs, rel=1e-5)
    trainer.train(progress=False)
    after = trainer.validate()["loss"]
    assert after < start["loss"] - 0.2, (start["loss"], after)
    # the run: the model's tokenizer (files and the data's encoding), carried settings
    run = tmp_path / "run"
    manifest = json.loads((run / "data" / MANIFEST).read_text())
    state = load_checkpoint(run / LAST)
    assert manifest["spm_model"] == "tokenizer.zip"
    assert (run / "data" / "tokenizer.zip").read_bytes() == state["tokenizer"]
    assert state["tokenizer"] == load_checkpoint(source["model"] / BEST)["tokenizer"]
    assert {"source.spm", "target.spm", "vocab.json"} <= {p.name for p in run.iterdir()}
    assert state["generation"] == json.loads((source["hf"] / "generation_config.json").read_text())
    assert state["origin"]["init_from"] == str(source["model"] / BEST)
    assert state["step"] == 6 and state["schedule"]["step_count"] == 6  # a fresh schedule
    saved = yaml.safe_load((run / "recipe.yaml").read_text())  # the model it really has
    assert saved["model"]["d_model"] == 16 and saved["model"]["activation"] == "swish"
    assert saved["init_from"] == str(source["model"])


def test_a_fine_tuned_model_goes_to_transformers(source, tmp_path):
    out = tmp_path / "run"
    assert main(args(source, out, "max_steps=2")) == 0
    generation = json.loads((source["hf"] / "generation_config.json").read_text())
    # The default export is the checkpoint `auto` names (averaged, else best, else last):
    # here the better of two validations, which need not be the last update; `last` is the
    # other fine-tuned one. Each exported model is the checkpoint it was made from.
    exported = [("auto", resolve_checkpoint(out)), ("last", out / LAST)]
    assert {load_checkpoint(path)["step"] for _, path in exported} <= {1, 2}  # fine-tuned
    for which, path in exported:
        folder = export_marian(out, tmp_path / f"hf-{which}", checkpoint=which)
        assert json.loads((folder / "generation_config.json").read_text()) == generation
        hf = MarianMTModel.from_pretrained(folder, dtype=torch.float32).double()
        model, tokenizer = load_model(path)
        src = torch.tensor([tokenizer.encode("Ein Mann fährt Fahrrad.")])
        tgt = torch.tensor([[tokenizer.bos_id, *tokenizer.encode_target("A man rides a bike.")]])
        with torch.no_grad():
            theirs = hf(input_ids=src, decoder_input_ids=tgt).logits
            ours = model.double()(src, tgt)
        assert (theirs - ours).abs().max().item() < 1e-10, which


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["model.d_model=32"],
            r"model\.d_model=32 contradicts the model being fine-tuned .*d_model=16",
        ),
        (["model.activation=relu"], r"model\.activation='relu' contradicts .*activation='swish'"),
        (["model.share_embeddings=false"], r"model\.share_embeddings=False contradicts"),
    ],
)
def test_contradicting_model_fields_are_refused(source, tmp_path, capsys, settings, message):
    import re

    assert main(args(source, tmp_path / "run", *settings)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_dropout_and_max_len_may_be_changed(source, tmp_path):
    trainer = Trainer(
        recipe(source, "model.dropout=0.3", "model.max_len=200", "model.d_model=16"),
        tmp_path / "run",
        log=lambda _: None,
    )
    assert (trainer.cfg.dropout, trainer.cfg.max_len, trainer.cfg.d_model) == (0.3, 200, 16)


def test_data_encoded_with_another_tokenizer_is_refused(source, tmp_path, capsys):
    data = tmp_path / "data"
    prepare = ["prepare", "--out", str(data), "--vocab-size", "200", "--no-progress"]
    prepare += ["--train-src", str(source["train.de"]), "--train-tgt", str(source["train.en"])]
    prepare += ["--valid-src", str(source["val.de"]), "--valid-tgt", str(source["val.en"])]
    assert main(prepare) == 0
    train = ["train", "--init-from", str(source["model"]), "--data", str(data)]
    assert main([*train, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "encoded with another tokenizer" in capsys.readouterr().err
    # prepared with the model's tokenizer (prepare --spm-model MODEL_DIR), it is taken
    mine = tmp_path / "mine"
    assert main([*prepare[:2], str(mine), "--spm-model", str(source["model"]), *prepare[3:]]) == 0
    run = tmp_path / "run2"
    assert main([*train[:3], "--data", str(mine), "--out", str(run), "--no-progress",
                 "--set", *SETTINGS, "max_steps=1"]) == 0  # fmt: skip


def test_a_missing_model_is_named(source, tmp_path, capsys):
    argv = args(source, tmp_path / "run")
    argv[2] = str(tmp_path / "nowhere")
    assert main(argv) == 2
    assert "nowhere: no such model directory" in capsys.readouterr().err
    argv[2] = f"{source['model']}:last"  # MODEL_DIR:CHECKPOINT
    assert main(argv) == 2
    assert "no checkpoint_last.pt found" in capsys.readouterr().err


def test_resume_continues_exactly(source, tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(args(source, straight, "max_steps=4")) == 0
    assert main(args(source, resumed, "max_steps=2")) == 0
    # Resumed with another model to start from, the run went on from its own weights and
    # ignored it: refused, as is a run from scratch resumed with one.
    other = [*args(source, resumed, "max_steps=4"), "--resume"]
    other[2] = str(straight)
    assert main(other) == 2
    assert f"init_from={straight} differs from the run being resumed" in capsys.readouterr().err
    # Its own checkpoint spelled another way (DIR:best, started as DIR) was refused too.
    spelled = [*args(source, resumed, "max_steps=4"), "--resume"]
    spelled[2] = f"{source['model']}:best"
    assert main(spelled) == 0  # its own: resumed
    a, b = load_checkpoint(straight / LAST), load_checkpoint(resumed / LAST)
    assert a["step"] == b["step"] == 4
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


@pytest.mark.slow
def test_torchrun_two_processes(source, tmp_path):
    """Two gloo processes at update_freq 1 make the updates of one process at update_freq
    2 (to float rounding), starting from the same model."""
    single, double = tmp_path / "single", tmp_path / "double"
    assert main(args(source, single, "max_steps=3", "update_freq=2")) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "aiayn", *args(source, double, "max_steps=3")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    a, b = load_checkpoint(single / LAST), load_checkpoint(double / LAST)
    assert a["step"] == b["step"] == 3 and b["origin"] == a["origin"]
    for name, x in a["model"].items():
        y = b["model"][name]
        if name.endswith("attn.in_proj.bias"):  # leave out the key biases, rounding noise
            d = x.numel() // 3  # that changes no output (test_distributed_train.max_difference)
            x, y = torch.cat([x[:d], x[2 * d :]]), torch.cat([y[:d], y[2 * d :]])
        assert (x - y).abs().max().item() < 1e-4, name
    # The key biases left out above change no output: both models give the same logits.
    logits = []
    for out in (single, double):
        model, _ = load_model(out / LAST)
        g = torch.Generator().manual_seed(0)
        src = torch.randint(3, model.cfg.src_vocab_size, (4, 9), generator=g)
        tgt = torch.randint(3, model.cfg.tgt_vocab_size, (4, 7), generator=g)
        tgt[:, 0] = model.cfg.bos_id
        with torch.no_grad():
            logits.append(model.eval()(src, tgt))
    assert (logits[0] - logits[1]).abs().max().item() < 1e-4
