"""`aiayn export marian`: a model aiayn trained, handed to transformers, loads with
``AutoModelForSeq2SeqLM`` and ``MarianTokenizer`` (no aiayn code) and gives our logits,
our greedy output and our tokenizer ids; ``import(export(m))`` restores every weight
exactly; what Marian cannot hold is refused with one line."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianTokenizer

from aiayn import Transformer, TransformerConfig
from aiayn.checkpoint import BEST, load_checkpoint, load_model, save_checkpoint
from aiayn.cli import main
from aiayn.data.batching import pad
from aiayn.decode import DecodeOptions, search
from aiayn.marian import export_marian, import_marian
from aiayn.marian.export import ExportExistsError
from aiayn.translator import Translator
from marian_util import make_marian, write_tokenizer
from sample_data import PAIRS

pytestmark = [pytest.mark.multi30k, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def exported(sample_model_dir, tmp_path_factory):
    """(the trained aiayn model directory, its Marian export)."""
    model_dir = sample_model_dir()
    return model_dir, export_marian(model_dir, tmp_path_factory.mktemp("hf") / "de-en")


def test_transformers_loads_it_and_gives_our_logits(exported):
    model_dir, folder = exported
    hf = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).double().eval()
    ours, tokenizer = load_model(model_dir / BEST)
    ours = ours.double()
    src = pad([tokenizer.encode(s) for s, _ in PAIRS[:8]], tokenizer.pad_id)
    targets = [[tokenizer.bos_id, *tokenizer.encode_target(t)] for _, t in PAIRS[:8]]
    tgt_in = pad(targets, tokenizer.pad_id)
    real = tgt_in != tokenizer.pad_id
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src != tokenizer.pad_id, decoder_input_ids=tgt_in)
        logits = ours(src, tgt_in)
    assert (logits - theirs.logits)[real].abs().max().item() < 1e-10
    assert json.loads((folder / "config.json").read_text())["activation_function"] == "relu"


def test_generate_gives_our_greedy_output(exported):
    model_dir, folder = exported
    hf = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    model, tokenizer = load_model(model_dir / BEST)
    src = pad([tokenizer.encode(s) for s, _ in PAIRS[:16]], tokenizer.pad_id)
    steps = 20
    found = search(model, src, DecodeOptions(beam=1, max_len_a=0, max_len_b=steps))
    ours = [hyps[0].tokens for hyps in found]
    with torch.no_grad():  # the exported generation config bans pad and <s>, as aiayn does
        out = hf.generate(
            input_ids=src, attention_mask=src != tokenizer.pad_id, num_beams=1,
            max_new_tokens=steps, forced_eos_token_id=None,
        )  # fmt: skip
    theirs = []
    for row in out[:, 1:].tolist():
        theirs.append(row[: row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row)
    assert ours == theirs
    assert sum(len(t) < steps for t in theirs) >= 12  # real sentences that end with EOS
    hf_tokenizer = MarianTokenizer.from_pretrained(folder)
    texts = [tokenizer.decode(ids) for ids in ours]
    assert texts == hf_tokenizer.batch_decode(out, skip_special_tokens=True)
    assert sum(t == ref for t, (_, ref) in zip(texts, PAIRS)) >= 4  # it did learn


def test_marian_tokenizer_gives_our_ids(exported):
    model_dir, folder = exported
    _, tokenizer = load_model(model_dir / BEST)
    hf = AutoTokenizer.from_pretrained(folder)
    assert isinstance(hf, MarianTokenizer)
    for src, tgt in PAIRS:
        # MarianTokenizer appends EOS to every source; aiayn's own models never saw one
        assert hf(src).input_ids == [*tokenizer.encode(src), tokenizer.eos_id]
        assert hf(src, add_special_tokens=False).input_ids == tokenizer.encode(src)
        assert hf(text_target=tgt).input_ids == [*tokenizer.encode_target(tgt), tokenizer.eos_id]


def test_import_of_the_export_restores_every_weight(exported, tmp_path):
    model_dir, folder = exported
    original = load_checkpoint(model_dir / BEST)
    back = load_checkpoint(import_marian(folder, tmp_path / "back") / BEST)
    assert TransformerConfig.from_dict(back["config"]) == TransformerConfig.from_dict(
        original["config"]
    )
    assert back["model"].keys() == original["model"].keys()
    for name, tensor in original["model"].items():
        assert torch.equal(back["model"][name], tensor), name
    # and it translates as the original does (same ids in, no EOS appended)
    ours = load_model(model_dir / BEST)[1]
    again = load_model(tmp_path / "back" / BEST)[1]
    for src, tgt in PAIRS[:10]:
        assert again.encode(src) == ours.encode(src)
        assert again.encode_target(tgt) == ours.encode_target(tgt)


def test_a_marian_model_goes_back_as_it_came(tmp_path):
    """Marian folder -> aiayn -> Marian folder: the same logits in transformers, the same
    generation settings, and a second import equal to the first."""
    write_tokenizer(tmp_path / "tok")
    make_marian(tmp_path / "hf", tmp_path / "tok", tied=False)
    first = import_marian(tmp_path / "hf", tmp_path / "aiayn")
    back = export_marian(first, tmp_path / "hf2")
    a = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).double()
    b = AutoModelForSeq2SeqLM.from_pretrained(back, dtype=torch.float32).double()
    ids = torch.tensor([[5, 9, 14, 0], [7, 3, 0, a.config.pad_token_id]])
    dec = torch.tensor([[a.config.pad_token_id, 4, 8], [a.config.pad_token_id, 11, 2]])
    with torch.no_grad():
        la = a(input_ids=ids, attention_mask=ids != a.config.pad_token_id, decoder_input_ids=dec)
        lb = b(input_ids=ids, attention_mask=ids != a.config.pad_token_id, decoder_input_ids=dec)
    assert torch.equal(la.logits, lb.logits)
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert json.loads((back / "generation_config.json").read_text()) == generation
    second = load_checkpoint(import_marian(back, tmp_path / "aiayn2") / BEST)
    first_state = load_checkpoint(first / BEST)
    assert all(torch.equal(second["model"][k], v) for k, v in first_state["model"].items())
    assert second["tokenizer"] == first_state["tokenizer"]


def test_what_marian_cannot_hold_is_refused_with_one_line(sample_model_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    pre_ln = ["export", "marian", "--model", str(sample_model_dir(True)), "--out", str(out)]
    assert main(pre_ln) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pre-LN" in err
    state = load_checkpoint(sample_model_dir() / BEST)
    cfg = TransformerConfig.from_dict({**state["config"], "learned_positions": True})
    learned = tmp_path / "learned"
    save_checkpoint(
        {**state, "config": cfg.to_dict(), "model": Transformer(cfg).state_dict()}, learned / BEST
    )
    assert main(["export", "marian", "--model", str(learned), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sinusoidal" in err
    assert not out.exists()


def test_an_earlier_export_is_replaced_only_when_forced(exported, tmp_path, capsys):
    model_dir, _ = exported
    out = tmp_path / "hf"
    assert main(["export", "marian", "--model", str(model_dir), "--out", str(out)]) == 0
    assert main(["export", "marian", "--model", str(model_dir), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", "marian", "--model", str(model_dir), "--out", str(out), "--force"]) == 0
    # A Hub clone's own files beside the export went with --force's replaced folder.
    (out / "README.md").write_text("my model card")
    (out / ".git").mkdir()
    force = ["export", "marian", "--model", str(model_dir), "--out", str(out), "--force"]
    assert main(force) == 2
    assert "holds .git, README.md, which this output does not write" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "my model card" and (out / ".git").is_dir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["export", "marian", "--model", str(model_dir), "--out", str(other)]) == 2
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_an_export_into_a_folder_another_is_writing_is_refused(exported, tmp_path):
    """Two `export --force` into one folder at once could each move the other's folder
    aside: a traceback, and the old exports left as hidden .old folders. The writing is
    held now: the second is refused in one line, and the folder is left alone."""
    import re

    from aiayn.data.folders import busy, held_output
    from aiayn.errors import AiaynError

    model_dir, _ = exported
    out = tmp_path / "hf"
    export_marian(model_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    held = pytest.raises(AiaynError, match=re.escape(busy(out)))
    with held_output(out, "the test's"), held:  # another export, writing
        export_marian(model_dir, out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_an_export_killed_between_its_swaps_renames_loses_nothing(exported, tmp_path):
    """`export --force` moves the earlier export aside, then renames the new one in: a
    kill between the two left no export under the name, and the earlier one, whole, as a
    hidden .old folder that no later export put back or removed (nor the staged .tmp)."""
    model_dir, _ = exported
    out = tmp_path / "hf"
    export_marian(model_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    out.rename(tmp_path / ".hf.k2x9_q1a.old")  # as the kill left them
    (tmp_path / ".hf.k2x9_q1a.tmp").mkdir()
    (tmp_path / ".hf.k2x9_q1a.tmp" / "model.safetensors").write_bytes(b"half")
    with pytest.raises(ExportExistsError):  # the earlier export is back: kept unless forced
        export_marian(model_dir, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    (tmp_path / ".hf.a1b2c3d4.old").mkdir()  # an older kill's, beside a whole export
    export_marian(model_dir, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_force_never_replaces_the_source_folder_or_a_folder_aiayn_did_not_write(
    exported, tmp_path, capsys
):
    _, folder = exported
    imported = import_marian(folder, tmp_path / "imported")  # its origin: `folder`
    before = sorted(p.name for p in folder.iterdir())
    args = ["export", "marian", "--model", str(imported), "--force", "--out"]
    assert main([*args, str(folder)]) == 2  # an aiayn export, but the model's own source
    assert "is the folder this model was imported from" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == before
    assert main([*args, str(imported)]) == 2
    assert "holds the model itself" in capsys.readouterr().err
    assert (imported / BEST).is_file()
    theirs = tmp_path / "theirs"  # a Marian folder that transformers wrote, not aiayn
    write_tokenizer(theirs / "tok")
    make_marian(theirs, theirs / "tok")
    assert main([*args, str(theirs)]) == 2
    assert "is not an earlier aiayn export" in capsys.readouterr().err
    assert (theirs / "config.json").is_file() and (theirs / "tok").is_dir()
    out = tmp_path / "again"
    assert main([*args, str(out)]) == 0 and main([*args, str(out)]) == 0  # its own: replaced


def test_an_output_folder_that_cannot_be_created_is_one_line(exported, tmp_path, capsys):
    model_dir, folder = exported
    blocker = tmp_path / "a-file"  # a file where the output's parent folder should be
    blocker.write_text("mine")
    out = blocker / "out"
    for argv in (
        ["export", "marian", "--model", str(model_dir), "--out", str(out)],
        ["import", "marian", "--out", str(out), str(folder)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{out}: cannot create" in err, err
    assert blocker.read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_a_model_fine_tuned_shorter_generates_within_its_positions(tmp_path):
    """Fine-tuning may lower max_len below the imported max_length; the export cuts the
    generation length to the model's positions, so generate() stops where aiayn stops
    instead of running past them (an IndexError inside transformers)."""
    write_tokenizer(tmp_path / "tok")
    make_marian(tmp_path / "hf", tmp_path / "tok", max_position_embeddings=64)
    settings = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    settings["max_length"] = 64
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps(settings))
    state = load_checkpoint(import_marian(tmp_path / "hf", tmp_path / "aiayn") / BEST)
    state["config"]["max_len"] = 12  # what a fine-tuning recipe's max_len makes of it
    save_checkpoint({k: v for k, v in state.items() if k != "format"}, tmp_path / "ft" / BEST)
    folder = export_marian(tmp_path / "ft", tmp_path / "out")
    assert json.loads((folder / "generation_config.json").read_text())["max_length"] == 13
    hf = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf_tokenizer = MarianTokenizer.from_pretrained(folder)
    texts = ["x", "ein"]
    with torch.no_grad():
        out = hf.generate(**hf_tokenizer(texts, return_tensors="pt", padding=True))
    ours = Translator.from_dir(tmp_path / "ft").translate(texts)
    assert [[t] for t in hf_tokenizer.batch_decode(out, skip_special_tokens=True)] == ours
    assert max(len(row) for row in out.tolist()) == 13  # ran to the limit
