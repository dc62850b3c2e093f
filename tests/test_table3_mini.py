"""benchmarks/table3_mini.py: the row-(B) key-size reduction and the results table
(the benchmark itself trains for an hour and is not part of the suite)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from conftest import tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.table3_mini import ROWS, reduce_key_size, table

from aiayn import Transformer


def test_reduce_key_size_keeps_d_k_features_per_head_through_training():
    torch.manual_seed(0)
    cfg = tiny_config()  # d_model 32, 4 heads: d_k 8
    model = Transformer(cfg)
    n_attention = 3 * cfg.n_layers  # encoder self, decoder self and cross per layer
    masked = reduce_key_size(model, d_k=2)
    assert masked == n_attention * 2 * 4 * (8 - 2) * (32 + 1)  # Q and K rows, 4 heads
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    src = torch.randint(3, cfg.src_vocab_size, (2, 5))
    tgt = torch.randint(3, cfg.tgt_vocab_size, (2, 4))
    for _ in range(3):
        opt.zero_grad()
        model(src, tgt).logsumexp(-1).sum().backward()
        opt.step()
    attn = model.encoder.layers[0].self_attn
    w, b = attn.in_proj.weight, attn.in_proj.bias
    for block in (0, 1):  # W^Q, W^K: per head, rows beyond the first 2 stay exactly zero
        rows = w[block * 32 : (block + 1) * 32].view(4, 8, 32)
        assert (rows[:, 2:] == 0).all() and (rows[:, :2] != 0).any()
        assert (b[block * 32 : (block + 1) * 32].view(4, 8)[:, 2:] == 0).all()
    assert (w[64:] != 0).all()  # W^V keeps d_v = d_model / h


def test_table_lists_the_finished_rows_beside_the_paper():
    result = {"parameters": 1.95e6, "val_ppl": 28.41, "val_bleu": 11.99}
    text = table({"base": result, "A_h1": result}, ROWS)
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, two rows
    assert "| base | base | 1.95M | 28.41 | 11.99 | base | 4.92 | 25.8 |" in lines
    assert lines[3].startswith("| (A) | h=1, d_k=128 |") and lines[3].endswith("| 5.29 | 24.9 |")
