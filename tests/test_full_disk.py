"""A full disk while a folder is written whole (export, import, prepare): one line naming
the output, never a traceback from the writer that met it (ctranslate2's converter,
safetensors) nor the name of the staging folder that was just deleted; nothing left
behind. The disk is made full by the writers raising what a full disk raises."""

from __future__ import annotations

import errno

import ctranslate2
import pytest
import safetensors.torch

import aiayn.checkpoint
from aiayn.cli import main
from aiayn.data.folders import staged_folder
from aiayn.errors import AiaynError, CheckpointError

FULL = OSError(errno.ENOSPC, "No space left on device")


def full(*args, **kwargs):
    raise FULL


def test_a_write_error_in_a_staged_folder_names_the_output(tmp_path):
    out = tmp_path / "out"
    named = rf"^{out}: cannot write \(No space left on device\)$"
    with pytest.raises(AiaynError, match=named), staged_folder(out):
        full()
    with pytest.raises(CheckpointError, match=rf"^{out}/x\.pt: cannot"), staged_folder(out) as tmp:
        raise CheckpointError(f"{tmp}/x.pt: cannot write (No space left on device)")
    # A read that failed is not blamed on the output, nor a full disk elsewhere.
    with pytest.raises(FileNotFoundError), staged_folder(out):
        (tmp_path / "missing").read_text()
    elsewhere = OSError(errno.ENOSPC, "No space left on device", "/dev/shm/sem.mp-1")
    with pytest.raises(OSError, match=r"/dev/shm/sem\.mp-1"), staged_folder(out):
        raise elsewhere
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["ctranslate2", "marian"])
def test_an_export_onto_a_full_disk_is_one_line(
    sample_model_dir, tmp_path, monkeypatch, capsys, kind
):
    if kind == "ctranslate2":
        monkeypatch.setattr(ctranslate2.converters.Converter, "convert", full)
    else:  # safetensors raises its own error type

        def failing(*args, **kwargs):
            raise safetensors.SafetensorError("I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(safetensors.torch, "save_file", failing)
    out = tmp_path / "out"
    assert main(["export", kind, "--model", str(sample_model_dir()), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{out}: cannot write" in err, err
    assert "No space left on device" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_an_import_onto_a_full_disk_names_its_output(
    sample_model_dir, tmp_path, monkeypatch, capsys
):
    folder = tmp_path / "marian"
    assert main(["export", "marian", "--model", str(sample_model_dir()), "--out", str(folder)]) == 0
    monkeypatch.setattr(aiayn.checkpoint.torch, "save", full)
    out = tmp_path / "imported"
    assert main(["import", "marian", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{out}/checkpoint_best.pt: cannot write (No space left on device)" in err, err
    assert ".tmp" not in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marian"]
