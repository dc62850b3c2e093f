"""Training curves from a run's ``metrics.jsonl`` (one JSON object per line, written by
the trainer: kind "train" per update, "valid" per validation, "speed" every few updates)."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

from aiayn.data.folders import replace_file
from aiayn.errors import AiaynError

# How the trainer logs a number that is not finite (aiayn.train.metrics_log).
NOT_FINITE = ("nan", "inf", "-inf")

# file name -> (title, y label, [(kind, key, legend)])
CURVES = {
    "loss.png": (
        "loss",
        "label-smoothed loss per token",
        [("train", "loss", "train"), ("valid", "loss", "validation")],
    ),
    "bleu.png": ("validation BLEU", "BLEU", [("valid", "bleu", "validation")]),
    "lr.png": ("learning rate (Section 5.3)", "learning rate", [("train", "lr", "lr")]),
    "tokens_per_s.png": (
        "training speed",
        "target tokens / s",
        [("speed", "tokens_per_s", "train")],
    ),
}


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (or of that file itself); AiaynError naming
    the file and line for a missing file or a line that is not a JSON object. A last line
    cut short by a crash mid-write (no newline after it) is skipped."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists() or path.is_dir():  # a pipe is read: <(ssh host cat metrics.jsonl)
        what = "a folder, not a metrics file" if path.is_dir() else "no such metrics file"
        raise AiaynError(f"{path}: {what} (written by training)")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:  # no permission
        raise AiaynError(f"{path}: cannot read ({e.strerror or e})") from None
    records, lines = [], text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # a 5,000-digit integer; 100,000 brackets
            if number == len(lines) and not text.endswith("\n"):  # the trainer was killed
                break
            raise AiaynError(f"{path}:{number}: not a JSON line") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not _number(step) or not math.isfinite(step):
            raise AiaynError(f"{path}:{number}: not a metrics record (no numeric 'step')")
        records.append(record)
    if not records:
        raise AiaynError(f"{path}: holds no metrics yet")
    return records


def _number(value: object) -> TypeGuard[int | float]:
    """A JSON number a plot can hold: a float (an integer of 400 digits is none), and not
    near float's limit, where matplotlib's axis ticks overflow (NaN and infinity are gaps)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return not math.isfinite(number) or abs(number) <= 1e300


def series(records: list[dict], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` in the records of ``kind``. After a resume the trainer
    appends steps it already logged; the latest value of a step wins. A value the trainer
    logged as "nan" or "inf" (JSON has neither) is that float: a gap in the plot, not a
    point left out that would join its neighbours."""
    points: dict[float, float] = {}
    for r in records:
        value = r.get(key) if r.get("kind") == kind else None
        if isinstance(value, str) and value.lower() in NOT_FINITE:
            value = float(value)
        if _number(value):
            points[r["step"]] = float(value)
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def smooth(values: list[float], window: int) -> list[float]:
    """Running mean over the finite values among the last ``window``: per-update losses
    are noisy (and a NaN must not turn every later mean into NaN); NaN where none is."""
    out, total, count = [], 0.0, 0
    for i, v in enumerate(values):
        if math.isfinite(v):
            total, count = total + v, count + 1
        if i >= window and math.isfinite(values[i - window]):
            total, count = total - values[i - window], count - 1
        out.append(total / count if count else math.nan)
    return out


def pyplot() -> Any:
    """matplotlib.pyplot, drawing to files only (no display needed); AiaynError naming the
    extra to install where matplotlib is missing (it is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise AiaynError(f"drawing needs matplotlib: pip install 'aiayn[plot]' ({e})") from None
    return plt


def plot_curves(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw loss, validation BLEU, learning rate and tokens/s against the update step into
    PNGs in ``out_dir`` (default ``plots`` beside the metrics file, here for a pipe);
    curves without data are skipped. AiaynError naming the file it cannot read or write."""
    plt = pyplot()
    records = read_metrics(run_dir)
    given = Path(run_dir)  # a run, its metrics file, or a pipe (its plots go here)
    run = given if given.is_dir() else given.parent if given.is_file() else Path()
    out = Path(out_dir) if out_dir else run / "plots"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AiaynError(f"{out}: cannot create ({e.strerror or e})") from None
    written = []
    for name, (title, ylabel, lines) in CURVES.items():
        data = [(series(records, kind, key), legend) for kind, key, legend in lines]
        if not any(steps for (steps, _), _ in data):
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for (steps, values), legend in data:
            if not steps:
                continue
            if legend == "train" and len(values) > 50:
                ax.plot(steps, values, alpha=0.25, linewidth=0.8, color="C0")
                values, legend = smooth(values, max(len(values) // 50, 5)), "train (smoothed)"
            marker = "o" if len(steps) < 40 else None
            ax.plot(steps, values, label=legend, marker=marker, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("update step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        try:
            replace_file(out / name, partial(fig.savefig, format="png", dpi=100))
        except OSError as e:  # a folder of that name, no permission, a full disk
            raise AiaynError(f"{out / name}: cannot write ({e.strerror or e})") from None
        finally:
            plt.close(fig)
        written.append(out / name)
    return written
