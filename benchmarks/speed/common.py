"""Shared constants and small helpers of the speed benchmark.

Every import of library names that are due to move (``aiayn.train.checkpoint``,
``aiayn.translator``'s ``load_model`` / ``PRECISIONS``, ``aiayn.data.sample``) lives here and is
re-exported, so that a rename touches this module only.
"""

from __future__ import annotations

import contextlib
import platform
import subprocess
import sys
from pathlib import Path

import torch

from aiayn.data.sample import multi30k_dir, write_sample
from aiayn.train.checkpoint import save_checkpoint
from aiayn.translator import PRECISIONS, load_model

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

ROOT = Path(__file__).resolve().parents[2]
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
