"""The optimizer of Section 5.3: Adam with beta1 0.9, beta2 0.98, eps 1e-9.

A recipe may add decoupled weight decay (AdamW, Loshchilov & Hutter 2019; not in the
paper). It shrinks each matrix by ``lr * weight_decay`` per update, so it follows the
schedule; biases and LayerNorm gains (the 1-d parameters) are left alone, as is usual.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from aiayn.errors import RecipeError


def make_optimizer(
    model: nn.Module,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """Adam over ``model``'s trainable parameters, in one parameter group; with
    ``weight_decay`` > 0, AdamW with two groups: the matrices (decayed) and the 1-d
    parameters (not). Fused (one kernel for all the parameters) when they are on CUDA.
    RecipeError for a negative or non-finite ``weight_decay``."""
    if not (math.isfinite(weight_decay) and weight_decay >= 0.0):
        raise RecipeError(f"weight_decay must be a finite number >= 0, got {weight_decay}")
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and params[0].is_cuda  # on CUDA one kernel for every parameter
    if weight_decay == 0.0:
        return torch.optim.Adam(params, betas=betas, eps=eps, fused=fused or None)
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, betas=betas, eps=eps, fused=fused or None)
