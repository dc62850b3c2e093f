"""Checkpoints, used alike by training and by inference (fairseq's checkpoint_utils):
atomic save, load with clear errors, the file names of a model directory, and loading a
ready model and its tokenizer from one file (averaging, Section 6.1, is
:mod:`aiayn.train.averaging`'s).

A checkpoint is a dict saved by torch: ``model`` (state_dict), ``config``
(TransformerConfig as a dict), ``tokenizer`` (the tokenizer's bytes: a SentencePiece model,
or a Marian tokenizer's archive; :meth:`Tokenizer.from_bytes` reads either), and for
resuming ``optimizer``, ``schedule``, ``rng``, ``step``, ``epoch`` and the like.

Models that came from elsewhere carry two more entries, kept by fine-tuning:
``generation``, the generation settings they were published with (an imported Marian
model's ``generation_config.json`` as a dict: ``num_beams``, ``max_length``,
``length_penalty``, ``bad_words_ids``, ...; read with :func:`generation_settings`), and
``origin`` (where it came from: ``{"format": "marian", "path": ...}``, and for a
fine-tuned run the model it started from).
"""

from __future__ import annotations

import os
import stat
import tempfile
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


def epoch_checkpoint_name(epoch: int) -> str:
    """The file name of the checkpoint saved at the end of ``epoch`` (counted from 1)."""
    return f"checkpoint_epoch{epoch:03d}.pt"


def step_checkpoint_name(step: int) -> str:
    """The file name of a checkpoint saved on a timer (every N minutes) at ``step``."""
    return f"checkpoint_step{step:07d}.pt"


def epoch_checkpoints(model_dir: str | Path) -> list[Path]:
    """The epoch and timed checkpoints of ``model_dir``, oldest first (by the time they
    were written: the ones to average are the last ones)."""
    found = [
        *Path(model_dir).glob("checkpoint_epoch*.pt"),
        *Path(model_dir).glob("checkpoint_step*.pt"),
    ]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def check_target(path: str | Path) -> None:
    """CheckpointError unless a checkpoint can be saved to ``path``: nothing is there yet,
    or a regular file (which the save replaces). A directory, device or FIFO there would
    be replaced by the rename, or fail it after all the work."""
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
    """Write ``state`` to ``path`` atomically: a temp file in the same folder, flushed to
    disk, then renamed over the old one. A crash mid-save leaves the old file intact, and
    a failed save leaves no temp file; CheckpointError naming ``path`` when it cannot be
    written (see :func:`check_target`; a folder that cannot be made, a full disk)."""
    path = Path(path)
    check_target(path)
    tmp = None
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
        # torch.save turns the OSError of a failed write (a full disk) into a RuntimeError
        # ("enforce fail at inline_container.cc") raised while handling it.
        failed = e if isinstance(e, OSError) else e.__context__
        if isinstance(failed, OSError):
            raise CheckpointError(f"{path}: cannot write ({failed.strerror or failed})") from None
        raise
    return path


def remove_stale_temp_files(directory: str | Path) -> None:
    """Delete temp files that a save cut short (a kill mid-save) left in ``directory``;
    the checkpoints themselves are untouched."""
    for stale in Path(directory).glob(f".*.pt.*{TMP_SUFFIX}"):
        stale.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises CheckpointError (never a bare torch/pickle traceback) when the file is missing,
    truncated, corrupt, or not an aiayn checkpoint, or when an entry is damaged (see
    :func:`check_entries`: a NaN weight among them), and when ``map_location`` names no
    device this machine has (``"auto"``: a GPU if torch sees one, else the CPU).
    """
    if isinstance(map_location, (str, torch.device)):  # torch would call the file corrupt
        try:
            map_location = resolve_device(map_location)
        except AiaynError as e:
            raise CheckpointError(f"map_location: {e}") from None
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        # Random or truncated bytes can fail anywhere inside torch's (un)pickler with almost
        # any exception type (UnpicklingError, EOFError, ValueError, KeyError, ...).
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


def _malformed(path: str | Path, key: str, why: str) -> CheckpointError:
    return CheckpointError(f"{path}: checkpoint entry {key!r} is malformed ({why})")


def _kind(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def finite(tensor: torch.Tensor) -> bool:
    """Whether every value of a floating-point ``tensor`` is finite."""
    # A NaN or infinity makes the sum NaN or infinite: one pass that allocates nothing,
    # several times faster than isfinite(); only a sum that overflows is looked at closer.
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def check_entries(state: dict[str, Any], path: str | Path) -> None:
    """CheckpointError naming ``path`` unless the entries that every use of a checkpoint
    reads are sound: ``config`` a valid :class:`TransformerConfig`, ``model`` a mapping of
    names to tensors whose floating-point values are all finite (a NaN weight decodes to
    empty lines), ``tokenizer``, when there is one, a readable tokenizer, and
    ``generation``, when there is one, a mapping. Whether the
    weights fit the config is left to the model that loads them."""
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
    cfg = state["config"]
    if isinstance(tokenizer, int):
        sizes = {cfg["src_vocab_size"], cfg["tgt_vocab_size"]}
        if sizes != {tokenizer}:
            raise CheckpointError(
                f"{path}: checkpoint was trained with vocabulary size {sorted(sizes)}, "
                f"but {what} has {tokenizer} tokens; use the tokenizer it was trained with"
            )
        return
    model = (cfg["src_vocab_size"], cfg["tgt_vocab_size"])
    if model != (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size):
        ours = sorted(set(model))
        theirs = sorted({tokenizer.src_vocab_size, tokenizer.tgt_vocab_size})
        raise CheckpointError(
            f"{path}: checkpoint was trained with vocabulary size {ours}, but {what} has "
            f"{theirs} tokens; use the tokenizer it was trained with"
        )
    config = TransformerConfig.from_dict(cfg)
    for name in ("pad_id", "bos_id", "eos_id"):
        if getattr(config, name) != getattr(tokenizer, name):
            raise CheckpointError(
                f"{path}: the model's {name} is {getattr(config, name)} but {what} says "
                f"{getattr(tokenizer, name)}; use the tokenizer it was trained with"
            )


def generation_settings(state: dict[str, Any]) -> dict[str, Any]:
    """The generation settings a checkpoint carries (``{}`` for aiayn's own models): the
    ``generation_config.json`` of an imported Marian model, kept through fine-tuning."""
    return dict(state.get("generation") or {})


def split_model_spec(spec: str | Path) -> tuple[Path, str]:
    """``MODEL_DIR[:CHECKPOINT]`` -> (model directory, checkpoint: auto, best, last,
    averaged or a file, relative to the directory unless absolute). A path that exists is
    taken whole (a directory, or a checkpoint file)."""
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
    if made_at is None:  # no average, or one made before aiayn recorded run_step
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
        raise CheckpointError(f"{model_dir}: no such model directory")
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
    by :func:`load_checkpoint`; CheckpointError naming ``path`` when they do not fit."""
    tokenizer = checkpoint_tokenizer(state, path)
    check_vocab(state, tokenizer, path, "its tokenizer")
    cfg = TransformerConfig.from_dict(state["config"])
    model = Transformer(cfg)
    load_weights(model, state, path)
    return model, tokenizer


def load_weights(model: Transformer, state: dict[str, Any], path: str | Path) -> None:
    """Load the weights of the checkpoint read from ``path`` into ``model``;
    CheckpointError naming ``path`` and the first weight that does not fit."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        # torch's first line only says "Error(s) in loading"; the next names the weight.
        lines = [line.strip() for line in str(e).strip().splitlines()]
        first = lines[1] if len(lines) > 1 else lines[0]
        raise CheckpointError(f"{path}: weights do not fit the model config ({first})") from None


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
    """Model (in eval mode) and tokenizer from one checkpoint file: :func:`load_inference`
    without the generation settings."""
    model, tokenizer, _ = load_inference(path, device, quantize, precision)
    return model, tokenizer


def load_inference(
    path: str | Path,
    device: str | torch.device = "cpu",
    quantize: bool = False,
    precision: str = "fp32",
) -> tuple[Transformer, Tokenizer, dict[str, Any]]:
    """Model (in eval mode), tokenizer and generation settings (:func:`generation_settings`)
    from one checkpoint file, with clear errors.

    ``quantize`` gives an int8 dynamically quantized model for CPU inference
    (:func:`aiayn.quantize.quantize_dynamic_int8`); it needs the CPU.
    ``precision="bf16"`` casts the weights to bfloat16, for inference: faster on GPUs and
    on CPUs with bf16 instructions (AVX512-BF16, AMX), slower on others.
    """
    check_inference_settings(device, quantize, precision)
    device = resolve_device("cpu" if quantize else device)
    state = load_checkpoint(path, map_location=device)
    model, tokenizer = model_from_state(state, path)
    model = model.to(device=device, dtype=PRECISIONS[precision]).eval()
    if quantize:
        model = quantize_dynamic_int8(model)
    return model, tokenizer, generation_settings(state)
