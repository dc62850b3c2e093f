"""Shared fixtures: small models that run in milliseconds on a CPU."""

from __future__ import annotations

import pytest
import torch

from aiayn import Transformer, TransformerConfig


def tiny_config(**overrides) -> TransformerConfig:
    kwargs = dict(
        src_vocab_size=23,
        tgt_vocab_size=29,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=64,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


@pytest.fixture
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


def random_batch(cfg: TransformerConfig, lengths_src, lengths_tgt, seed: int = 0):
    """Right-padded src/tgt_in with the given real lengths; tgt_in starts with BOS."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths_src)
    src = torch.full((B, max(lengths_src)), cfg.pad_id, dtype=torch.long)
    tgt = torch.full((B, max(lengths_tgt)), cfg.pad_id, dtype=torch.long)
    for i, (s, t) in enumerate(zip(lengths_src, lengths_tgt)):
        src[i, :s] = torch.randint(3, cfg.src_vocab_size, (s,), generator=g)
        tgt[i, :t] = torch.randint(3, cfg.tgt_vocab_size, (t,), generator=g)
        tgt[i, 0] = cfg.bos_id
    return src, tgt
