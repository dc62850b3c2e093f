"""Looking inside: attention of every kind, layer and head; heatmap PNGs; training curves
from metrics.jsonl; the layer table of a trained model."""

from __future__ import annotations

import json
import math
import sys
from importlib.util import find_spec

import pytest
import torch

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.cli import main
from aiayn.decode import DecodeOptions
from aiayn.errors import AiaynError
from aiayn.inspect.attention import attention_map, text_heatmap
from aiayn.inspect.maps import add_alignments, attention, attention_maps
from aiayn.translator import Translator
from cli_util import one_line_error

# Only the tests that draw need matplotlib (a dev dependency: under `make test` nothing
# may skip, see conftest.py).
draws = pytest.mark.skipif(find_spec("matplotlib") is None, reason="matplotlib not installed")

SENTENCES = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Schach.", "Eine Frau."]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def translator(sample_model_dir) -> Translator:
    return Translator(*load_model(resolve_checkpoint(sample_model_dir())))


def test_attention_maps_cover_every_kind_layer_and_head(translator):
    cfg = translator.model.cfg
    src = [translator.encode(s) for s in SENTENCES]
    outs = [o[0].tokens for o in translator.hypotheses(src, DecodeOptions(beam=2))]
    batched = attention_maps(translator, src, outs)
    for s_ids, o_ids, amap in zip(src, outs, batched):
        S, T = len(s_ids), len(o_ids) + 1
        assert amap.source == [translator.tokenizer.id_to_piece(i) for i in s_ids]
        assert amap.target[-1] == "</s>" and amap.target_in[0] == "<s>" and len(amap.target) == T
        for kind, shape in (("encoder", (S, S)), ("decoder_self", (T, T)), ("cross", (T, S))):
            assert len(amap.weights[kind]) == cfg.n_layers
            for w in amap.weights[kind]:
                assert w.shape == (cfg.n_heads, *shape)
                torch.testing.assert_close(w.sum(-1), torch.ones(cfg.n_heads, shape[0]))
            rows, cols = amap.axes(kind)
            assert (len(rows), len(cols)) == shape
        for w in amap.weights["decoder_self"]:  # causal: no weight on later positions
            assert torch.equal(w, w.tril())
    # Padding in the batch changes no sentence's weights: each equals its own pass.
    for s_ids, o_ids, amap in zip(src, outs, batched):
        alone = attention_maps(translator, [s_ids], [o_ids])[0]
        for kind in amap.weights:
            for a, b in zip(amap.weights[kind], alone.weights[kind]):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_an_output_that_fills_max_len_has_its_maps_and_alignment(translator):
    """An output of max_len tokens stops at the limit, not at EOS: its maps and alignment
    failed ("tgt_in has length 65, longer than max_len=64"), the teacher-forced input
    holding BOS + 64 tokens. The row that would predict EOS after it is left out."""
    line, cfg = SENTENCES[1], translator.model.cfg
    found = translator.translations([line], beam=1, prefix="a " * (cfg.max_len - 1))
    ids = found[0][0].ids
    assert len(ids) == cfg.max_len  # 63 forced, then a word, not EOS
    amap = attention_maps(translator, [translator.encode(line)], [ids])[0]
    pieces = [translator.tokenizer.id_to_piece(i) for i in ids]
    assert amap.target == pieces and amap.target_in == ["<s>", *pieces[:-1]]
    for w in amap.weights["cross"]:
        assert w.shape == (cfg.n_heads, cfg.max_len, len(translator.encode(line)))
    add_alignments(translator, [translator.encode(line)], found)
    assert found[0][0].alignment and max(t for _, t in found[0][0].alignment) > 60


def test_a_model_in_training_mode_is_left_in_it(sample_model_dir, translator):
    """attention_map() and Translator(model) switched the caller's model to eval mode for
    good (dropout off for the rest of a training run); each now decodes in eval mode and
    leaves the mode as it was, with what an eval-mode model gives."""
    model, tokenizer = load_model(resolve_checkpoint(sample_model_dir()))
    model.train()
    sentence = "Ein Mann fährt Fahrrad."
    amap = attention_map(model, tokenizer, sentence, beam=2)
    assert model.training
    want = attention(translator, sentence, beam=2)
    assert amap.target == want.target
    assert all(torch.equal(a, b) for a, b in zip(amap.weights["cross"], want.weights["cross"]))
    ours = Translator(model, tokenizer)
    assert model.training and ours.translate([sentence]) == translator.translate([sentence])
    assert model.training


def test_attention_is_of_the_translation_it_shows(translator):
    amap = attention(translator, SENTENCES[0], beam=4)
    ids = [translator.tokenizer.piece_to_id(p) for p in amap.target[:-1]]
    assert translator.tokenizer.decode(ids) == translator.translate(SENTENCES[:1])[0][0]
    with pytest.raises(AiaynError, match="empty"):
        attention(translator, "   ")


@draws
def test_plots_of_one_head_a_grid_and_a_folder(translator, tmp_path):
    from aiayn.inspect.attention import plot_all, plot_attention

    amap = attention(translator, SENTENCES[1])
    one = plot_attention(amap, tmp_path / "one.png", "encoder", layer=1, head=2)
    grid = plot_attention(amap, tmp_path / "grid.png", "decoder_self", layer=-1)
    assert one.read_bytes()[:8] == PNG and grid.read_bytes()[:8] == PNG
    assert grid.stat().st_size > one.stat().st_size  # 4 heads + mean against 1 panel
    written = plot_all(amap, tmp_path / "all", head=3)
    names = sorted(p.name for p in written)
    assert len(names) == 3 * 2 * 2 and "cross_layer2_head3.png" in names
    with pytest.raises(AiaynError, match="has 2 layers"):
        plot_attention(amap, tmp_path / "x.png", "cross", layer=3)
    with pytest.raises(AiaynError, match="has 4 heads"):
        plot_attention(amap, tmp_path / "x.png", "cross", head=5)
    with pytest.raises(AiaynError, match="kind must be one of"):
        plot_attention(amap, tmp_path / "x.png", "sideways")


@draws
def test_attention_cli(sample_model_dir, tmp_path, capsys):
    model = str(sample_model_dir())
    assert main(["attention", "--model", model, SENTENCES[0], "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("translation: ") and "wrote 6 PNGs" in out
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        f"{k}_layer{n}.png" for k in ("cross", "decoder_self", "encoder") for n in (1, 2)
    ]
    args = ["attention", "--model", model, SENTENCES[0], "--kind", "encoder", "--layer", "1"]
    assert main([*args, "--head", "2", "--out", str(tmp_path / "e.png")]) == 0
    assert (tmp_path / "e.png").read_bytes()[:8] == PNG
    assert main([*args, "--head", "9", "--out", str(tmp_path / "f.png")]) == 2
    assert "head 9: the model has 4 heads" in capsys.readouterr().err
    # The text view shows the kind, layer and head asked for, and checks them first.
    translator = Translator.from_dir(model)
    amap = attention(translator, SENTENCES[0])
    assert main([*args, "--head", "2"]) == 0
    text = capsys.readouterr().out.splitlines()[1:]
    assert text == text_heatmap(amap, 1, "encoder", 2).splitlines()
    assert [line.split(" <- ")[0].strip() for line in text] == amap.source  # source queries
    assert text != text_heatmap(amap, 1, "encoder").splitlines()  # one head, not the mean
    refusals = [
        (["--head", "9"], "head 9: the model has 4 heads"),
        (["--head", "-1"], "head -1"),
        (["--layer", "5"], "layer 5"),
    ]
    for flags, message in refusals:
        assert main([*args[:-2], *flags]) == 2
        out, err = capsys.readouterr()
        assert message in err and "translation:" not in out
    # Negative layers count from the last, as the refusal says; an SVG is one picture;
    # an existing file that is no picture is refused before any work (it met "File exists"
    # after the whole heatmap was printed).
    assert main([*args[:-2], "--layer", "-3"]) == 2
    assert "(1..2, or -2..-1 from the last)" in capsys.readouterr().err
    assert main([*args[:-2], "--layer", "-2", "--out", str(tmp_path / "g.svg")]) == 0
    assert "<svg" in (tmp_path / "g.svg").read_text(encoding="utf-8")[:400]
    assert f"wrote {tmp_path / 'g.svg'}" in capsys.readouterr().out
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n", encoding="utf-8")
    assert main([*args[:-2], "--out", str(notes)]) == 2
    out, err = capsys.readouterr()
    assert f"--out {notes}: a file; give a picture" in err and "translation:" not in out
    assert notes.read_text(encoding="utf-8") == "keep me\n"
    # A picture format it does not write made a folder "a.gif" of 9 PNGs, without a word.
    assert main([*args[:-2], "--out", str(tmp_path / "a.GIF")]) == 2
    out, err = capsys.readouterr()
    assert f"--out {tmp_path / 'a.GIF'}: pictures are .png, .svg" in err and not out
    assert not (tmp_path / "a.GIF").exists()
    # In a "folder" that is a file: "cannot write (File exists)", after the heatmap.
    assert main([*args[:-2], "--out", str(notes / "x.png")]) == 2
    out, err = capsys.readouterr()
    assert f"{notes} is a file, not a folder to write in" in err and not out


def _metrics_file(run, truncated_tail: bool = True):
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, 121):
        lines.append({"kind": "train", "step": step, "loss": 9 - step / 20, "lr": step * 1e-5})
        if step % 40 == 0:
            lines.append({"kind": "valid", "step": step, "loss": 8 - step / 30, "bleu": step / 6})
        if step % 10 == 0:
            lines.append({"kind": "speed", "step": step, "tokens_per_s": 1000 + step})
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if truncated_tail:
        text += '{"kind": "train", "st'  # a kill mid-write
    (run / "metrics.jsonl").write_text(text, encoding="utf-8")


@draws
def test_plot_training_curves(tmp_path, capsys):
    from aiayn.inspect.curves import read_metrics, series

    run = tmp_path / "run"
    _metrics_file(run)
    records = read_metrics(run)
    assert series(records, "valid", "bleu") == ([40, 80, 120], [40 / 6, 80 / 6, 20.0])
    assert main(["plot", "--run", str(run)]) == 0
    names = {"loss.png", "bleu.png", "lr.png", "tokens_per_s.png"}
    assert {p.name for p in (run / "plots").iterdir()} == names
    assert all((run / "plots" / n).read_bytes()[:8] == PNG for n in names)
    assert capsys.readouterr().out.count("wrote ") == 4


@draws
def test_a_path_that_is_not_utf8_is_printed_escaped_on_a_strict_stdout(tmp_path):
    """A folder name of bytes that are not UTF-8, on a stdout strict about them (a UTF-8
    desktop locale; PYTHONIOENCODING=utf-8 here): "wrote PATH" raised after the plots were
    written, exit 1 with a traceback. It is printed escaped now, and the command succeeds."""
    import os
    import subprocess

    run, out = tmp_path / "run", tmp_path / "p\udcff"  # the byte 0xff, as Python keeps it
    _metrics_file(run)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "aiayn", "plot", "--run", str(run), "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.count("wrote ") == 4 and "p\\udcff" in done.stdout
    assert len(list(out.iterdir())) == 4


def test_curves_keep_the_losses_logged_as_nan(tmp_path):
    """The trainer logs a non-finite loss as "nan"/"inf" (JSON has neither): such a
    point is NaN in the series (a gap in the plot, not its neighbours joined), and the
    smoothed train curve goes on after it instead of staying NaN for good."""
    from aiayn.inspect.curves import read_metrics, series, smooth
    from aiayn.train.metrics_log import MetricsLog

    log = MetricsLog(tmp_path, tensorboard=False)
    for step, loss in enumerate([4.0, 3.0, float("nan"), float("inf"), 2.0, 1.0], 1):
        log.write("train", step, loss=loss)
    log.write("valid", 6, loss=float("-inf"), bleu="n/a")  # not a number: left out
    log.close()
    records = read_metrics(tmp_path)
    steps, losses = series(records, "train", "loss")
    assert steps == [1, 2, 3, 4, 5, 6]
    assert losses[:2] == [4.0, 3.0] and math.isnan(losses[2]) and losses[3:] == [math.inf, 2, 1]
    assert series(records, "valid", "loss") == ([6], [-math.inf])
    assert series(records, "valid", "bleu") == ([], [])
    finite = [v if math.isfinite(v) else math.nan for v in losses]
    assert smooth(finite, 2) == [4.0, 3.5, 3.0, pytest.approx(math.nan, nan_ok=True), 2.0, 1.5]
    assert smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]  # as before for finite values


@draws
def test_plot_survives_huge_numbers_and_names_what_it_cannot_write(tmp_path, capsys):
    """Tracebacks before: an integer of 400 digits (OverflowError), a loss.png that is a
    folder (IsADirectoryError); and --run naming the metrics file put the plots under it."""
    run = tmp_path / "run"
    run.mkdir()
    good = {"step": 1, "kind": "train", "loss": 5.0, "lr": 0.001}
    (run / "metrics.jsonl").write_text(
        json.dumps(good) + '\n{"step": 2, "kind": "train", "loss": 1' + "0" * 400 + "}\n"
    )
    assert main(["plot", "--run", str(run / "metrics.jsonl")]) == 0  # the huge loss: a gap
    assert (run / "plots" / "loss.png").stat().st_size > 1000
    # a float near its limit overflowed matplotlib's ticks (a ValueError traceback)
    huge = {**good, "step": 2, "loss": 1.7e308}
    (run / "metrics.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(huge) + "\n")
    assert main(["plot", "--run", str(run)]) == 0
    (run / "metrics.jsonl").write_text(
        json.dumps(good) + '\n{"step": 1' + "0" * 400 + ', "kind": "train", "loss": 4.0}\n'
    )
    assert main(["plot", "--run", str(run)]) == 2
    assert "metrics.jsonl:2: not a metrics record (no numeric 'step')" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text(json.dumps(good) + "\n")
    (tmp_path / "out" / "loss.png").mkdir(parents=True)
    err = one_line_error(["plot", "--run", str(run), "--out", str(tmp_path / "out")], capsys)
    assert f"{tmp_path / 'out' / 'loss.png'}: cannot write (Is a directory)" in err


@draws
def test_pictures_are_written_whole_or_not_at_all(sample_model_dir, tmp_path, capsys, monkeypatch):
    """`attention --out` and `plot` wrote their pictures in place: a full disk left the old
    picture cut short, and a picture path linked to a checkpoint wrote the PNG into it."""
    import shutil

    from matplotlib.figure import Figure

    model = tmp_path / "model"
    shutil.copytree(sample_model_dir(), model)
    best = model / "checkpoint_best.pt"
    kept = best.read_bytes()
    (tmp_path / "evil.png").symlink_to(best)
    args = ["attention", "--model", str(model), SENTENCES[0], "--kind", "encoder"]
    err = one_line_error([*args, "--out", str(tmp_path / "evil.png")], capsys)
    assert f"--out {tmp_path / 'evil.png'}: a link to {best}, a model's file" in err
    assert best.read_bytes() == kept

    def full_disk(self, fname, **kwargs):
        if not hasattr(fname, "write"):  # a path, as savefig was called before
            fname = open(fname, "wb")  # noqa: SIM115
        fname.write(b"half a picture")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    (tmp_path / "old.png").write_bytes(b"the old picture")
    err = one_line_error([*args, "--layer", "1", "--out", str(tmp_path / "old.png")], capsys)
    assert f"{tmp_path / 'old.png'}: cannot write (No space left on device)" in err
    run = tmp_path / "run"
    _metrics_file(run)
    (run / "plots").mkdir()
    (run / "plots" / "loss.png").write_bytes(b"the old picture")
    err = one_line_error(["plot", "--run", str(run)], capsys)
    assert f"{run / 'plots' / 'loss.png'}: cannot write (No space left on device)" in err
    for picture in (tmp_path / "old.png", run / "plots" / "loss.png"):
        assert picture.read_bytes() == b"the old picture"
        assert [p.name for p in picture.parent.iterdir() if p.name.startswith(".")] == []


def _metrics_pipe(tmp_path):
    """A FIFO in ``tmp_path`` that a thread fills with a run's metrics.jsonl (written there
    too), and that thread."""
    import os
    import threading

    _metrics_file(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    text = (tmp_path / "metrics.jsonl").read_bytes()
    writer = threading.Thread(target=fifo.write_bytes, args=(text,), daemon=True)
    writer.start()
    return fifo, writer


def test_metrics_are_read_from_a_pipe(tmp_path):
    """``plot --run <(ssh host cat run/metrics.jsonl)`` names a pipe (/dev/fd/N), which
    was "no such metrics file": it is read as the file would be."""
    from aiayn.inspect.curves import read_metrics

    fifo, writer = _metrics_pipe(tmp_path)
    try:
        assert read_metrics(fifo) == read_metrics(tmp_path)
    finally:
        writer.join(10)


@draws
def test_the_plots_of_a_pipe_go_to_the_current_folder(tmp_path, monkeypatch, capsys):
    """Beside a pipe (/dev/fd/plots) no folder can be made: they go to ./plots."""
    fifo, writer = _metrics_pipe(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    try:
        assert main(["plot", "--run", str(fifo)]) == 0
    finally:
        writer.join(10)
    assert "wrote plots/loss.png" in capsys.readouterr().out
    assert (here / "plots" / "loss.png").is_file()


def test_plot_errors_name_the_file_and_line(tmp_path, capsys):
    assert main(["plot", "--run", str(tmp_path / "none")]) == 2
    assert "no such metrics file" in capsys.readouterr().err
    (tmp_path / "odd" / "metrics.jsonl").mkdir(parents=True)  # was "no such metrics file"
    assert main(["plot", "--run", str(tmp_path / "odd")]) == 2
    assert "metrics.jsonl: a folder, not a metrics file" in capsys.readouterr().err
    run = tmp_path / "bad"
    _metrics_file(run, truncated_tail=False)
    text = (run / "metrics.jsonl").read_text().splitlines()
    text[5] = "garbage"
    (run / "metrics.jsonl").write_text("\n".join(text) + "\n")
    assert main(["plot", "--run", str(run)]) == 2
    assert "metrics.jsonl:6: not a JSON line" in capsys.readouterr().err
    # A whole last line (its newline written) is no kill mid-write: it was skipped. JSON
    # that Python refuses to parse (a 5,000-digit integer, deep nesting) was a traceback.
    for last in ("garbage", '{"step": 1' + "0" * 5000 + "}", "[" * 100_000):
        (run / "metrics.jsonl").write_text("\n".join([*text[:5], last]) + "\n")
        assert main(["plot", "--run", str(run)]) == 2
        assert "metrics.jsonl:6: not a JSON line" in capsys.readouterr().err
    text[5] = json.dumps({"kind": "train", "step": "abc", "loss": 1.0})  # not categories
    (run / "metrics.jsonl").write_text("\n".join(text) + "\n")
    assert main(["plot", "--run", str(run)]) == 2
    assert "metrics.jsonl:6: not a metrics record (no numeric 'step')" in capsys.readouterr().err
    words = tmp_path / "words"  # steps, but not one number to draw
    words.mkdir()
    record = {"kind": "train", "step": 1, "loss": "x", "lr": "y"}
    (words / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["plot", "--run", str(words)]) == 2
    err = capsys.readouterr().err
    assert f"{words / 'metrics.jsonl'}: no numeric loss, bleu, lr or tokens_per_s" in err


def test_plot_of_a_metrics_file_it_may_not_read_is_one_line(tmp_path, capsys, monkeypatch):
    """A metrics.jsonl without read permission was a PermissionError traceback (root reads
    any file: the refusal is simulated)."""
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    _metrics_file(tmp_path / "run")
    monkeypatch.setattr(Path, "read_text", refuse)
    err = one_line_error(["plot", "--run", str(tmp_path / "run")], capsys)
    assert f"{tmp_path / 'run' / 'metrics.jsonl'}: cannot read (Permission denied)" in err


def test_summary_of_a_trained_model(sample_model_dir, translator, capsys):
    assert main(["summary", "--model", str(sample_model_dir())]) == 0
    out = capsys.readouterr().out
    assert f"Total params: {translator.model.num_parameters():,}" in out
    assert f"Output: logits [1, 16, {translator.tokenizer.vocab_size}]" in out
    assert main(["summary", "--preset", "base", "--vocab", "1000", "--depth", "1"]) == 0
    assert "Output: logits [1, 16, 1000]" in capsys.readouterr().out


def test_a_model_of_few_positions_is_summarised_and_its_cut_output_shown_whole(
    sample_model_dir, tmp_path, capsys
):
    """A model of max_len 4, cutting outputs at the limit (an imported model's generation
    settings without a forced EOS): summary's pass of 16 positions did not fit it, and
    attention printed the translation less its last token, taken for the EOS."""
    import shutil

    from aiayn.checkpoint import BEST, load_checkpoint, save_checkpoint

    model = tmp_path / "four"
    state = load_checkpoint(sample_model_dir() / BEST)
    state["config"]["max_len"], state["generation"] = 4, {"num_beams": 1}
    save_checkpoint(state, model / BEST)
    shutil.copy(sample_model_dir() / "spm.model", model / "spm.model")
    assert main(["summary", "--model", str(model)]) == 0
    assert "Output: logits [1, 4, " in capsys.readouterr().out
    sentence = SENTENCES[0]
    (tmp_path / "in.de").write_text(sentence + "\n", encoding="utf-8")
    assert main(["translate", "--model", str(model), "--quiet", str(tmp_path / "in.de")]) == 0
    translation = capsys.readouterr().out.strip()
    assert len(Translator.from_dir(model).translations([sentence])[0][0].ids) == 4  # cut
    assert main(["attention", "--model", str(model), sentence]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"translation: {translation}"


def test_attention_says_when_the_sentence_was_cut(sample_model_dir, capsys):
    """A sentence of more tokens than the model has positions is translated (and its
    attention drawn) from its first ones only; translate said so, attention did not."""
    from aiayn.checkpoint import load_model, resolve_checkpoint

    model = str(sample_model_dir())
    positions = load_model(resolve_checkpoint(model))[0].cfg.max_len
    long = " ".join([SENTENCES[0]] * positions)
    assert main(["attention", "--model", model, "--beam", "1", long]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("translation: ")
    assert err.count(f"were translated from their first {positions} tokens only (line 1)") == 1
    assert main(["attention", "--model", model, "--beam", "1", SENTENCES[0]]) == 0
    assert "note:" not in capsys.readouterr().err


def test_summary_refuses_what_it_would_ignore_or_cannot_build(sample_model_dir, capsys):
    model = str(sample_model_dir())
    cases = [
        (["--depth", "0"], "--depth must be at least 1, got 0"),
        (["--vocab", "0"], "--vocab must be at least 3 (PAD, BOS and EOS), got 0"),
        (["--vocab", "2"], "--vocab must be at least 3"),  # "at least 1", then the config's
        (["--model", model, "--preset", "big"], "--preset sets up an untrained preset"),
        (["--model", model, "--vocab", "1000"], "--vocab sets up an untrained preset"),
        (["--checkpoint", "best"], "--checkpoint needs --model"),
        (["--vocab", "99999999999"], "--vocab 99,999,999,999: the base model's weights take"),
    ]
    for flags, message in cases:
        assert main(["summary", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert main(["summary", "--model", model, "--checkpoint", "best", "--depth", "1"]) == 0
    assert "Total params" in capsys.readouterr().out


def test_drawing_without_matplotlib_is_one_line_naming_the_extra(
    sample_model_dir, tmp_path, capsys, monkeypatch
):
    """matplotlib is the optional plot extra: without it `aiayn plot` and `aiayn attention
    --out` were a ModuleNotFoundError traceback (attention's after the translation)."""
    run = tmp_path / "run"
    _metrics_file(run)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    err = one_line_error(["plot", "--run", str(run)], capsys)
    assert "drawing needs matplotlib: pip install 'aiayn[plot]'" in err
    assert not (run / "plots").exists()
    model = str(sample_model_dir())
    argv = ["attention", "--model", model, SENTENCES[0], "--out", str(tmp_path / "a.png")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "drawing needs matplotlib: pip install 'aiayn[plot]'" in err
    assert "translation:" not in out  # refused before translating
    assert main(["attention", "--model", model, SENTENCES[0]]) == 0  # text needs no plot
