"""Peak memory of the training loss at the paper's base size (issue 43): the full-logits
loss (``[N, V]`` logits, then label-smoothed cross-entropy in fp32) against the fused,
chunked one (:func:`aiayn.train.loss.projected_label_smoothed_loss`), forward and backward.

    python benchmarks/loss_memory.py [--tokens 4096] [--vocab 37000] [--d-model 512]

On the CPU: the peak resident memory (VmHWM, reset before each variant) above what the
inputs already hold, and the CPU time of one forward and backward. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from aiayn.train.loss import (
    label_smoothed_cross_entropy,
    projected_label_smoothed_loss,
)


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(name: str, fn, hidden: torch.Tensor, weight: torch.Tensor) -> dict:
    hidden.grad = weight.grad = None
    # The gradients' own memory counts alike for both: allocate it before the baseline.
    hidden.grad, weight.grad = torch.zeros_like(hidden), torch.zeros_like(weight)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    base = rss_kib("VmRSS")
    start = time.process_time()  # CPU seconds: less moved by a busy machine
    loss = fn()
    loss.backward()
    seconds = time.process_time() - start
    peak = rss_kib("VmHWM")
    return {
        "loss": name,
        "peak_above_inputs_MiB": round((peak - base) / 1024, 1),
        "cpu_seconds": round(seconds, 2),
        "value": round(loss.item(), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    N, V, d = args.tokens, args.vocab, args.d_model
    hidden = torch.randn(1, N, d, requires_grad=True)
    weight = (torch.randn(V, d) * d**-0.5).requires_grad_()
    target = torch.randint(3, V, (1, N))

    def full() -> torch.Tensor:  # the loss before issue 43, as TrainingLoss computed it
        return label_smoothed_cross_entropy(F.linear(hidden, weight), target, 0.1)[0]

    def fused() -> torch.Tensor:
        return projected_label_smoothed_loss(hidden, weight, None, target, 0.1)[0]

    rows = [measure("full logits", full, hidden, weight), measure("fused", fused, hidden, weight)]
    logits_mib = N * V * 4 / 2**20
    sizes = {"tokens": N, "vocab": V, "d_model": d, "fp32_logits_MiB": round(logits_mib, 1)}
    print(json.dumps({**sizes, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
