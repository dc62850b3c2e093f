"""Label-smoothed cross-entropy (Section 5.4, epsilon_ls = 0.1; Szegedy et al. 2016)."""

from __future__ import annotations

import torch
from torch import Tensor


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
