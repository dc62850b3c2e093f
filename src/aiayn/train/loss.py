"""Label-smoothed cross-entropy (Section 5.4, epsilon_ls = 0.1; Szegedy et al. 2016)."""

from __future__ import annotations

import torch
from torch import Tensor


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
    logp = torch.log_softmax(logits.float(), dim=-1)  # float32 even under autocast
    keep = target != pad_id
    if not bool(keep.all()):  # callers that already dropped pad positions skip this copy
        logp, target = logp[keep], target[keep]  # [N, V], [N]
    logp, target = logp.reshape(-1, logp.size(-1)), target.reshape(-1)
    nll = -logp.gather(-1, target[:, None]).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum(), int(target.numel())
