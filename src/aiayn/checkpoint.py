"""Checkpoints, used alike by training and by inference (fairseq's checkpoint_utils):
atomic save, load with clear errors, the file names of a model directory, and loading a
ready model and its tokenizer from one file (averaging is :mod:`aiayn.train.averaging`'s).

A checkpoint is a dict saved by torch: ``model`` (state_dict), ``config``
(TransformerConfig as a dict), ``tokenizer`` (the tokenizer's bytes: a SentencePiece model
or a Marian tokenizer's archive, read by :meth:`Tokenizer.from_bytes`), and for resuming
``optimizer``, ``schedule``, ``rng``, ``step``, ``epoch`` and the like. Models from
elsewhere carry, kept by fine-tuning, ``generation`` (the settings they were published
with: an imported Marian model's ``generation_config.json``, see
:func:`generation_settings`) and ``origin`` (``{"format": "marian", "path": ...}``; for a
fine-tuned run, the model it started from).
"""

from __future__ import annotations

import os
import pickle
import pickletools
import re
import stat
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from aiayn.config import TransformerConfig
from aiayn.data.folders import file_mode
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import AiaynError, CheckpointError, ConfigError, TokenizerError
from aiayn.model.device import resolve_device
from aiayn.model.transformer import Transformer
from aiayn.quantize import quantize_dynamic_int8

FORMAT = "aiayn-checkpoint-1"
TMP_SUFFIX = ".tmp"  # save_checkpoint's temp files: ".<name>.<random>.tmp"

# The files of a model directory.
LAST, BEST, AVERAGED = "checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_averaged.pt"
CHECKPOINT_NAMES = {"best": BEST, "last": LAST, "averaged": AVERAGED}
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The names of the epoch and timed checkpoints a run writes (and prunes, and averages).
KEPT_NAME = re.compile(r"checkpoint_(epoch\d{3,}|step\d{7,})\.pt")


def epoch_checkpoint_name(epoch: int) -> str:
    """The file name of the checkpoint saved at the end of ``epoch`` (counted from 1)."""
    return f"checkpoint_epoch{epoch:03d}.pt"


def step_checkpoint_name(step: int) -> str:
    """The file name of a checkpoint saved on a timer (every N minutes) at ``step``."""
    return f"checkpoint_step{step:07d}.pt"


def epoch_checkpoints(model_dir: str | Path) -> list[Path]:
    """The epoch and timed checkpoints (:data:`KEPT_NAME`) of ``model_dir``, oldest first: by
    the step each was saved at (:func:`saved_step`; unreadable: newest, for an average to
    name it), at one step the timed one first, then by the time written (a copy's, in a
    copied run). One gone since the listing (pruned) is left out; a broken link refused."""
    found = []
    for path in filter(lambda p: KEPT_NAME.fullmatch(p.name), Path(model_dir).glob("*.pt")):
        try:
            mtime = path.stat().st_mtime_ns
        except OSError as e:  # gone since the listing (pruned), or a broken link
            if isinstance(e, FileNotFoundError) and not path.is_symlink():
                continue
            link = f"a broken link to {os.readlink(path)}: " if path.is_symlink() else ""
            raise CheckpointError(f"{path}: cannot read ({link}{e.strerror})") from None
        if (step := saved_step(path)) is None and not os.path.lexists(path):
            continue
        epoch = path.name.startswith("checkpoint_epoch")  # at one step, after the timed one
        found.append(((step is None, step or 0, epoch, mtime, path.name), path))
    return [path for _, path in sorted(found)]


def check_target(path: str | Path) -> None:
    """CheckpointError unless a checkpoint can be saved to ``path``: nothing or a regular
    file is there (a directory, device or FIFO would be replaced, or fail the rename)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:  # a file where a folder should be, no permission to look
        raise CheckpointError(f"{path}: cannot write ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise CheckpointError(f"{path}: is a directory")
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: not a regular file")


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically: a temp file in the same folder, flushed, then
    renamed over the old one (a crash mid-save leaves the old file; a failed save, no temp
    file); CheckpointError naming ``path`` if it cannot be written (:func:`check_target`)."""
    path = Path(path)
    if not isinstance(state, dict):  # ** would raise a TypeError in the middle of the save
        raise CheckpointError(f"{path}: a checkpoint is a dict of entries, not {_kind(state)}")
    check_target(path)
    tmp, handling = None, sys.exc_info()[1]  # the caller's exception: not one of ours below
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode(path))  # mkstemp's file is private: a shared model is not
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        # torch.save raises a RuntimeError while handling a failed write's OSError or a Ctrl-C
        failed = e if isinstance(e, OSError) or e.__context__ is handling else e.__context__
        if isinstance(failed, OSError):
            raise CheckpointError(f"{path}: cannot write ({failed.strerror or failed})") from None
        if isinstance(failed, KeyboardInterrupt):
            raise failed from None
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`. CheckpointError (never a bare
    torch/pickle traceback) when the file is missing, truncated, corrupt, not an aiayn
    checkpoint (Python objects other than tensors: never unpickled), or has a damaged entry
    (:func:`check_entries`), and when ``map_location`` names no device this machine has
    (``"auto"``: a GPU if torch sees one, else the CPU)."""
    if isinstance(map_location, (str, torch.device)):  # torch would call the file corrupt
        try:
            map_location = resolve_device(map_location)
        except AiaynError as e:
            raise CheckpointError(f"map_location: {e}") from None
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if not path.is_file():  # a device or a pipe exists, but holds no checkpoint to load
        what = "not a regular file" if path.exists() else "no such checkpoint file"
        raise CheckpointError(f"{path}: {what}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        if isinstance(e, PermissionError):  # the file may well be whole (torch's EINVAL: cut)
            raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
        if isinstance(e, pickle.UnpicklingError) and (held := _unsafe_objects(path, e)):
            raise CheckpointError(
                f"{path}: not an aiayn checkpoint: it holds Python objects other than tensors "
                f"({held}), which are never unpickled (that could run code); saved by other code?"
            ) from None
        # Damaged bytes fail anywhere in torch's unpickler, with any type (EOFError, KeyError...)
        raise CheckpointError(
            f"{path}: cannot read checkpoint, the file is truncated or corrupt ({type(e).__name__})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an aiayn checkpoint (no '{FORMAT}' marker)")
    for key in ("model", "config"):
        if key not in state:
            raise CheckpointError(f"{path}: checkpoint has no '{key}' entry")
    check_entries(state, path)
    return state


def _unsafe_objects(path: Path, error: Exception) -> str | None:
    """The type that torch's weights-only loader refused (``error``) in a file that is whole
    (its pickle's checksum right, no opcode cut: torch checks neither); None if damaged."""
    try:
        with zipfile.ZipFile(path) as archive:  # read() checks the CRC
            pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            all(True for _ in pickletools.genops(archive.read(pkl)))
    except Exception:  # not a zip, no pickle, a bad checksum or a cut opcode
        return None
    found = re.search(r"GLOBAL (\S+) (?:was not|whose)", str(error))  # a class, a function
    return found.group(1) if found else "a type outside torch's safe list"


def _malformed(path: str | Path, key: str, why: str) -> CheckpointError:
    return CheckpointError(f"{path}: checkpoint entry {key!r} is malformed ({why})")


def _kind(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def finite(tensor: torch.Tensor) -> bool:
    """Whether every value of a floating-point ``tensor`` is finite: from its sum (one pass
    that allocates nothing, several times isfinite()'s speed), closer if the sum overflows."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def check_entries(state: dict[str, Any], path: str | Path) -> None:
    """CheckpointError naming ``path`` unless the entries every use reads are sound: ``config``
    a valid :class:`TransformerConfig`, ``model`` names to tensors, the float ones finite (a
    NaN weight decodes to empty lines), ``tokenizer`` and ``generation``, where present, a
    readable tokenizer and a mapping (whether weights fit the config: :func:`load_weights`)."""
    config = state["config"]
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise _malformed(path, "config", f"{_kind(config)}, not a mapping of field names")
    try:
        TransformerConfig.from_dict(config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:  # a field of the wrong type: compared, divided
        raise _malformed(path, "config", str(e)) from None
    weights = state["model"]
    if not isinstance(weights, dict):
        raise _malformed(path, "model", f"{_kind(weights)}, not a mapping of weights")
    for name, tensor in weights.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise _malformed(path, "model", f"{name!r} is {_kind(tensor)}, not a tensor")
        if tensor.is_floating_point() and not finite(tensor):
            raise CheckpointError(f"{path}: weight {name!r} holds NaN or infinity")
    if "tokenizer" in state:
        checkpoint_tokenizer(state, path)
    generation = state.get("generation")
    if generation is not None and not isinstance(generation, dict):
        raise _malformed(path, "generation", f"{_kind(generation)}, not a mapping of settings")


def checkpoint_tokenizer(state: dict[str, Any], path: str | Path) -> Tokenizer:
    """The tokenizer a checkpoint carries; CheckpointError naming ``path`` when it holds
    none, or one that cannot be read."""
    if "tokenizer" not in state:
        raise CheckpointError(f"{path}: checkpoint holds no tokenizer")
    data = state["tokenizer"]
    if not isinstance(data, bytes):
        raise _malformed(path, "tokenizer", f"{_kind(data)}, not bytes")
    try:
        return Tokenizer.from_bytes(data)
    except TokenizerError as e:
        raise CheckpointError(f"{path}: checkpoint entry 'tokenizer': {e}") from None


def check_vocab(
    state: dict[str, Any], tokenizer: Tokenizer | int, path: str | Path, what: str
) -> None:
    """CheckpointError unless the checkpoint's model was built for ``tokenizer``: its
    source and target vocabulary sizes and its pad, BOS (decoder start) and EOS ids (or,
    given a number, for one joint vocabulary of that many tokens)."""
    cfg, t = state["config"], tokenizer
    model = (cfg["src_vocab_size"], cfg["tgt_vocab_size"])
    sizes = (t, t) if isinstance(t, int) else (t.src_vocab_size, t.tgt_vocab_size)
    if model != sizes:
        raise CheckpointError(
            f"{path}: checkpoint was trained with vocabulary size {sorted(set(model))}, but "
            f"{what} has {sorted(set(sizes))} tokens; use the tokenizer it was trained with"
        )
    if isinstance(tokenizer, int):
        return
    config = TransformerConfig.from_dict(cfg)
    for name in ("pad_id", "bos_id", "eos_id"):
        if getattr(config, name) != getattr(tokenizer, name):
            raise CheckpointError(
                f"{path}: the model's {name} is {getattr(config, name)} but {what} says "
                f"{getattr(tokenizer, name)}; use the tokenizer it was trained with"
            )


def generation_settings(state: dict[str, Any]) -> dict[str, Any]:
    """The ``generation_config.json`` an imported Marian model carries (``{}``: aiayn's own)."""
    return dict(state.get("generation") or {})


def split_model_spec(spec: str | Path) -> tuple[Path, str]:
    """``MODEL_DIR[:CHECKPOINT]`` -> (model directory, checkpoint: auto, best, last, averaged
    or a file, in the directory unless absolute); an existing path is taken whole."""
    text = str(spec)
    if Path(text).exists() or ":" not in text:
        path = Path(text)
        return (path.parent, str(path)) if path.is_file() else (path, "auto")
    directory, which = text.rsplit(":", 1)
    if not which:
        raise CheckpointError(
            f"{text!r} names no checkpoint after ':' (auto, best, last, averaged or a file)"
        )
    if which not in CHECKPOINT_NAMES and which != "auto" and not Path(which).is_absolute():
        which = str(Path(directory) / which)
    return Path(directory), which


def saved_step(path: Path, key: str = "step") -> int | None:
    """A checkpoint's int entry ``key``, its tensors memory-mapped, not read; None where
    the file or the entry is missing or unreadable (a load names the file)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    step = state.get(key) if isinstance(state, dict) else None
    return step if isinstance(step, int) else None


def stale_average(model_dir: str | Path) -> tuple[int, int] | None:
    """``(the step training had reached when it was averaged, the last checkpoint's)`` if
    the average was made before training went on (``aiayn average`` records ``run_step``)."""
    made_at = saved_step(Path(model_dir) / AVERAGED, "run_step")
    if made_at is None:  # no average, or an older aiayn's (the command line notes it)
        return None
    last = saved_step(Path(model_dir) / LAST)
    return (made_at, last) if last is not None and made_at < last else None


def resolve_checkpoint(model_dir: str | Path, which: str = "auto") -> Path:
    """The checkpoint file of a model directory: ``which`` is best, last, averaged, a file
    path (relative: in the model directory, where it is only there), or auto (averaged
    unless :func:`stale_average`, else best, else last)."""
    model_dir = Path(model_dir)
    if which not in CHECKPOINT_NAMES and which != "auto":
        path = Path(which)
        if not path.is_absolute() and not path.exists() and (model_dir / path).is_file():
            return model_dir / path
        return path
    if not model_dir.is_dir():
        what = "not a" if model_dir.exists() else "no such"  # a file: a checkpoint, say
        raise CheckpointError(f"{model_dir}: {what} model directory")
    order = [which] if which != "auto" else ["averaged", "best", "last"]
    if which == "auto" and stale_average(model_dir):
        order.remove("averaged")
    for name in order:
        path = model_dir / CHECKPOINT_NAMES[name]
        if path.is_file():
            return path
    raise CheckpointError(f"{model_dir}: no {' / '.join(CHECKPOINT_NAMES[n] for n in order)} found")


def model_from_state(state: dict[str, Any], path: str | Path) -> tuple[Transformer, Tokenizer]:
    """The model (float32, training mode) and tokenizer of a checkpoint read from ``path``
    (:func:`load_checkpoint`); CheckpointError naming ``path`` when they do not fit."""
    tokenizer = checkpoint_tokenizer(state, path)
    check_vocab(state, tokenizer, path, "its tokenizer")
    cfg = TransformerConfig.from_dict(state["config"])
    model = Transformer(cfg)
    load_weights(model, state, path)
    return model, tokenizer


def load_weights(model: Transformer, state: dict[str, Any], path: str | Path) -> None:
    """Load the weights of the checkpoint read from ``path`` into ``model``; CheckpointError
    naming ``path`` and the first weights that do not fit (or is integer: it would be cast)."""
    ours = model.state_dict()
    for name, tensor in state["model"].items():
        if name in ours and ours[name].is_floating_point() and not tensor.is_floating_point():
            kind = str(tensor.dtype).removeprefix("torch.")
            raise CheckpointError(f"{path}: weight {name!r} holds {kind} values, not floats")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        # torch's first line only says "Error(s) in loading"; the next two list the weights
        # missing and unexpected (a wrapper's "module." shows there): each list cut short.
        lines = [line.strip() for line in str(e).strip().splitlines()]
        found = " ".join(lines[1:3]) or lines[0]
        found = re.sub(r'((?:"[^"]+", ){2})(?:"[^"]+", )+', r"\1..., ", found)
        raise CheckpointError(f"{path}: weights do not fit the model config ({found})") from None


def check_inference_settings(device: object, quantize: object, precision: object) -> None:
    """AiaynError naming the argument unless ``quantize`` is a bool, ``precision`` one of
    :data:`PRECISIONS` and the two fit each other and ``device``: what :func:`load_inference`
    takes, checked before anything is read (a string such as "no" would be truthy)."""
    if not isinstance(quantize, bool):
        raise AiaynError(f"quantize must be True or False, not {_kind(quantize)}")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise AiaynError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if quantize and str(device) not in ("cpu", "auto"):
        raise AiaynError(f"int8 quantization runs on the CPU only, not on {device}")
    if quantize and precision != "fp32":
        raise AiaynError("int8 quantization and bf16 precision exclude each other; pick one")


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    quantize: bool = False,
    precision: str = "fp32",
) -> tuple[Transformer, Tokenizer]:
    """Model (eval mode) and tokenizer of one checkpoint file: :func:`load_inference`'s."""
    model, tokenizer, _ = load_inference(path, device, quantize, precision)
    return model, tokenizer


def load_inference(
    path: str | Path,
    device: str | torch.device = "cpu",
    quantize: bool = False,
    precision: str = "fp32",
) -> tuple[Transformer, Tokenizer, dict[str, Any]]:
    """Model (eval mode), tokenizer and generation settings (:func:`generation_settings`) of
    one checkpoint file, with clear errors. ``quantize``: int8, dynamically quantized
    (:func:`aiayn.quantize.quantize_dynamic_int8`), on the CPU. ``precision="bf16"`` casts the
    weights to bfloat16: faster on GPUs and CPUs with AVX512-BF16 or AMX, slower on others."""
    check_inference_settings(device, quantize, precision)
    device = resolve_device("cpu" if quantize else device)
    state = load_checkpoint(path, map_location=device)
    model, tokenizer = model_from_state(state, path)
    model = model.to(device=device, dtype=PRECISIONS[precision]).eval()
    if quantize:
        model = quantize_dynamic_int8(model)
    return model, tokenizer, generation_settings(state)
