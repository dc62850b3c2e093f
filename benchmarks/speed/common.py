"""Shared constants and small helpers of the speed benchmark, and the data locator it
shares with the tests (``tests/sample_data.py``: Multi30k, else the built-in sample)."""

from __future__ import annotations

import contextlib
import platform
import subprocess
import sys
from pathlib import Path

import torch

from aiayn.checkpoint import PRECISIONS, load_model, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # test support, shared with the benchmarks
from sample_data import multi30k_dir, write_sample  # noqa: E402

__all__ = [
    "ALPHA",
    "BATCH_SIZE",
    "GROWTH_BUDGET_S",
    "LABEL_SMOOTHING",
    "MARIAN",
    "MAX_LEN_B",
    "OURS",
    "PRECISIONS",
    "ROOT",
    "TORCH_NN",
    "cpu_name",
    "git_commit",
    "load_model",
    "multi30k_dir",
    "peak_rss_mib",
    "rss_mib",
    "save_checkpoint",
    "sync",
    "version",
    "write_sample",
]

OURS, TORCH_NN, MARIAN = "ours (aiayn)", "torch.nn.Transformer", "Marian (transformers)"
LABEL_SMOOTHING, ALPHA, MAX_LEN_B, BATCH_SIZE = 0.1, 0.6, 50, 64
GROWTH_BUDGET_S = 15.0  # no further repeats of one decode-growth point past this many seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_mib() -> float:
    """Peak resident set of *this process image* in MiB: VmHWM on Linux. (ru_maxrss is not
    used: Linux carries the parent's high-water mark into a child across fork + exec.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def rss_mib() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None
