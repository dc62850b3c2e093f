"""Label-smoothed cross-entropy (Section 5.4, epsilon_ls = 0.1; Szegedy et al. 2016)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import TrainingError


def token_losses(logits: Tensor, target: Tensor, epsilon: float = 0.1) -> tuple[Tensor, Tensor]:
    """Per position: the label-smoothed loss and the NLL, float32 ``[...]`` for logits
    ``[..., V]`` and target ``[...]``; pads are not masked (callers weight or drop them).
    No data-dependent shapes, so torch.compile traces it whole."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # float32 even under autocast
    nll = -logp.gather(-1, target[..., None]).squeeze(-1)
    return (1.0 - epsilon) * nll - epsilon * logp.mean(dim=-1), nll


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float = 0.1, pad_id: int = 0
) -> tuple[Tensor, Tensor, int]:
    """Summed loss over the non-pad targets.

    The target distribution puts 1 - epsilon on the gold token and spreads epsilon
    uniformly over the whole vocabulary, i.e. loss = (1 - eps) * NLL + eps * mean_v(-log p_v)
    (the same as ``F.cross_entropy(..., label_smoothing=eps)``). Pad targets contribute
    nothing. logits ``[..., V]``, target ``[...]``. Returns (loss sum, NLL sum, number of
    non-pad targets); NLL is the unsmoothed loss, for perplexity.
    """
    keep = target != pad_id
    if not bool(keep.all()):  # callers that already dropped pad positions skip this copy
        logits, target = logits[keep], target[keep]  # [N, V], [N]
    loss, nll = token_losses(logits, target, epsilon)
    return loss.sum(), nll.sum(), int(target.numel())


# Logits a chunk of the fused loss holds at once (``rows x V``): 2^24 is 64 MiB in fp32,
# against 3.4 GiB for the paper's 25k target tokens x 37k vocabulary in one piece.
CHUNK_LOGITS = 1 << 24


class _ProjectedSmoothedLoss(torch.autograd.Function):
    """The output projection and the label-smoothed loss, fused, over chunks of positions.

    Each chunk's logits ``z = h W^T + b`` are formed in ``dtype`` (the autocast dtype, or
    fp32), turned into the loss in fp32, and straight away into their gradient
    ``dL/dz = softmax(z) - (1 - eps) onehot(y) - eps / V`` (pads: 0), which is multiplied
    into the gradients of ``h``, ``W`` and ``b`` (accumulated in fp32) before the next
    chunk. So no ``[N, V]`` tensor ever exists and nothing is recomputed in the backward,
    which only scales the kept gradients by the incoming one (the loss is a sum, linear in
    its scale). Needs only what the unfused loss does: one product forward, two backward.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,  # [R, C, d]
        weight: Tensor,  # [V, d]
        bias: Tensor | None,  # [V]
        target: Tensor,  # [R, C]
        epsilon: float,
        pad_id: int,
        bounds: tuple[int, ...],  # chunk starts along the R*C positions, then R*C
        dtype: torch.dtype,
        need_grad: bool,
    ) -> tuple[Tensor, Tensor]:
        d, V = hidden.size(-1), weight.size(0)
        positions, targets = hidden.reshape(-1, d), target.reshape(-1, 1)  # [R*C, d], [R*C, 1]
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        loss_sum = hidden.new_zeros((), dtype=torch.float32)
        nll_sum = hidden.new_zeros((), dtype=torch.float32)
        grad_h = torch.zeros_like(positions) if need_grad else None
        grad_w = torch.zeros(V, d, dtype=torch.float32, device=weight.device) if need_grad else None
        grad_b = torch.zeros(V, dtype=torch.float32, device=weight.device)
        for start, end in itertools.pairwise(bounds):
            h = positions[start:end].to(dtype)  # [n, d]
            y = targets[start:end]  # [n, 1]
            keep = (y != pad_id).to(torch.float32)  # [n, 1]
            z = (h @ w.t() if b is None else torch.addmm(b, h, w.t())).float()  # [n, V]
            lse = torch.logsumexp(z, dim=-1, keepdim=True)  # [n, 1]
            nll = lse - z.gather(1, y)
            loss = (1.0 - epsilon) * nll + epsilon * (lse - z.mean(dim=-1, keepdim=True))
            loss_sum = loss_sum + (loss * keep).sum()
            nll_sum = nll_sum + (nll * keep).sum()
            if grad_h is None or grad_w is None:
                continue
            g = (z - lse).exp_().sub_(epsilon / V)  # softmax - eps/V, in place of z
            g = g.scatter_add(1, y, torch.full_like(keep, epsilon - 1.0)).mul_(keep).to(dtype)
            grad_h[start:end] = (g @ w).to(hidden.dtype)
            grad_w += (g.t() @ h).float()
            if b is not None:
                grad_b += g.float().sum(dim=0)
        ctx.mark_non_differentiable(nll_sum)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(
            grad_h.view_as(hidden) if grad_h is not None else None, grad_w, grad_b
        )
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w, grad_b = ctx.saved_tensors
        if grad_h is None:
            raise TrainingError("the fused loss was computed without gradients (need_grad)")
        return (
            grad_h * grad_loss.to(grad_h.dtype),
            grad_w * grad_loss,
            grad_b * grad_loss if ctx.has_bias else None,
            *([None] * 6),
        )


def projected_label_smoothed_loss(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    epsilon: float = 0.1,
    pad_id: int = 0,
    chunks: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The summed label-smoothed loss and NLL (fp32 scalars) of the logits ``hidden @
    weight^T + bias`` against ``target``, pad targets left out, without forming the logits:
    hidden ``[R, C, d]``, weight ``[V, d]``, bias ``[V]`` or None, target ``[R, C]``.

    The same sums and gradients as :func:`label_smoothed_cross_entropy` on the full logits
    (to float tolerance; tested). The R*C positions are cut into ``chunks`` pieces
    (default: as many as keep each piece's logits within :data:`CHUNK_LOGITS`, a count
    that reads the shape: a compiled caller passes its own, so that one graph serves every
    shape; R >= 2 and C >= 8 then keep every piece above one position, a size torch.compile
    would specialise). Under autocast the products run in its dtype."""
    R, C, _ = hidden.shape
    N, V = R * C, weight.size(0)
    if chunks is None:
        chunks = max(1, -(-N * V // CHUNK_LOGITS))
    chunks = max(1, min(chunks, N))
    bounds = tuple(N * k // chunks for k in range(chunks + 1))
    device = hidden.device.type
    enabled = torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if enabled else weight.dtype
    trained = [hidden, weight] + ([bias] if bias is not None else [])
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in trained)
    with torch.autocast(device, enabled=False):  # the casts above and inside say it all
        return _ProjectedSmoothedLoss.apply(
            hidden, weight, bias, target, epsilon, pad_id, bounds, dtype, need_grad
        )
