"""Head statistics of aiayn.inspect.attention (used by the tour and docs/figures)."""

from __future__ import annotations

import pytest
import torch

from aiayn.errors import AiaynError
from aiayn.inspect.attention import mean_attention_distance, offset_attention


def test_offset_attention_finds_a_previous_token_head():
    T = 5
    previous = torch.zeros(T, T)
    previous[0, 0] = 1.0
    previous[torch.arange(1, T), torch.arange(T - 1)] = 1.0  # query t looks at t-1
    own = torch.eye(T)
    uniform = torch.full((T, T), 1 / T)
    weights = torch.stack([previous, own, uniform])  # [h=3, T, T]
    assert offset_attention(weights).tolist() == pytest.approx([1.0, 0.0, 1 / T])
    assert offset_attention(weights, offset=0).tolist() == pytest.approx([0.2, 1.0, 1 / T])
    assert offset_attention(weights[None]).shape == (1, 3)  # leading dims kept


def test_offset_attention_needs_such_a_key():
    with pytest.raises(AiaynError):
        offset_attention(torch.ones(2, 1, 1), offset=-1)


def test_mean_attention_distance():
    T = 4
    own = torch.eye(T)
    first = torch.zeros(T, T)
    first[:, 0] = 1.0  # every query looks at position 0: distances 0, 1, 2, 3
    weights = torch.stack([own, first])
    assert mean_attention_distance(weights).tolist() == pytest.approx([0.0, 1.5])
    cross = torch.full((2, 3), 1 / 3)  # [T=2 queries, S=3 keys], uniform
    # query 0: (0 + 1 + 2) / 3 = 1; query 1: (1 + 0 + 1) / 3 = 2/3
    assert mean_attention_distance(cross).item() == pytest.approx((1 + 2 / 3) / 2)
