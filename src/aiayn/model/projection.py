"""The tied output projection (Section 3.4) into memory a decoder keeps across steps:
``x [n, d_model]`` -> logits ``[n, V]``, formed as ``x W^T`` or blockwise as ``W x^T``.

Which form is faster depends on the CPU. With MKL on an AMD EPYC the blocked ``W x^T``
runs 1.5x faster at 256 rows of a 58k vocabulary; on an Intel Xeon it is 0.6x-0.9x of the
plain product at 16-256 rows of 8k and 58k vocabularies (BENCHMARKS.md). So the blocked
form is used on AMD CPUs only (:data:`BLOCKED`); both give bit-identical logits
(tests/test_model.py), so the choice never changes an output.
"""

from __future__ import annotations

import platform

import torch
from torch import Tensor


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The x86 CPU vendor ("GenuineIntel", "AuthenticAMD"), or "" where it is unknown."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    text = platform.processor()  # e.g. Windows: "AMD64 Family 25 ..., AuthenticAMD"
    return next((v for v in ("AuthenticAMD", "GenuineIntel") if v in text), "")


# Whether the CPU forms the projection blockwise (from 16 rows on); a module setting, so a
# benchmark or a test can choose either form on any machine.
BLOCKED = cpu_vendor() == "AuthenticAMD"


def blocked_product(
    x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor, work: Tensor
) -> Tensor:
    """``out[:] = x weight^T (+ bias)`` formed as ``weight x^T`` in blocks of vocabulary
    rows (512 KiB of logits each) in ``work``, each transposed into ``out [n, V]`` while
    it is still in cache. Returns ``out``."""
    n, V = out.shape
    step = max(1, (1 << 17) // n)  # vocabulary rows per block
    x_t = x.t()
    for a in range(0, V, step):
        b = min(V, a + step)
        block = work.view(-1)[: (b - a) * n].view(b - a, n)
        if bias is None:
            torch.mm(weight[a:b], x_t, out=block)
        else:
            torch.addmm(bias[a:b, None], weight[a:b], x_t, out=block)
        out[:, a:b].copy_(block.t())
    return out
