"""Validation during training: loss, perplexity and BLEU on the validation split."""

from __future__ import annotations

import math

import torch

from aiayn.data import Tokenizer, sorted_batches
from aiayn.data.shards import PreparedSplit
from aiayn.decode import generate
from aiayn.metrics import corpus_bleu
from aiayn.model.transformer import Transformer
from aiayn.train.loss import label_smoothed_cross_entropy


@torch.no_grad()
def validate(
    model: Transformer,
    data: PreparedSplit,
    hyps: list[str],
    refs: list[str],
    max_tokens: int,
    label_smoothing: float,
) -> dict[str, float]:
    """``{"loss", "ppl", "bleu"}``: the per-token loss and perplexity of ``model`` on
    ``data`` (teacher forcing), and the BLEU of ``hyps`` (its translations) against
    ``refs``. The model is left in training mode."""
    model.eval()
    device, pad_id = next(model.parameters()).device, model.cfg.pad_id
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    for index in data.plan(max_tokens, 0, 0, model.cfg.max_len):
        batch = data.batch(index).to(device)
        logits = model(batch.src, batch.tgt_in)
        loss, nll, n = label_smoothed_cross_entropy(logits, batch.tgt_out, label_smoothing, pad_id)
        loss_sum, nll_sum, n_tokens = loss_sum + loss.item(), nll_sum + nll.item(), n_tokens + n
    model.train()
    return {
        "loss": loss_sum / max(n_tokens, 1),
        "ppl": math.exp(min(nll_sum / max(n_tokens, 1), 50.0)),
        "bleu": corpus_bleu(hyps, refs).score,
    }


def translate_texts(
    model: Transformer, tokenizer: Tokenizer, texts: list[str], beam: int, batch_size: int = 128
) -> list[str]:
    """``texts`` translated (greedy for ``beam=1``), in order; the model is left in
    training mode."""
    device, limit = next(model.parameters()).device, model.cfg.max_len - 1
    ids = [tokenizer.encode(s, limit) for s in texts]
    hyps = [""] * len(ids)
    for index, src in sorted_batches(ids, batch_size, model.cfg.pad_id):
        nbest = generate(model, src.to(device), beam)  # eval mode inside, restored after
        for i, outputs in zip(index, nbest):
            hyps[i] = tokenizer.decode(outputs[0]) if outputs else ""
    return hyps
