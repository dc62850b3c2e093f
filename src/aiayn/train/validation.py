"""Validation during training: loss, perplexity and BLEU on the validation split.

On several processes each rank scores its share of the validation batches and translates
its share of the sentences (:meth:`~aiayn.distributed.World.shard`), so no rank idles
while another decodes alone, and validation is W times faster; the sums and the
translations are then put together, and BLEU is the one a single process gets.

The loss scores only the pairs that fit the model's ``max_len`` positions (as training
does), while BLEU translates every source (one longer than that cut to it):
:func:`check_valid_lengths` says how many the loss leaves out, and refuses a validation set of
which none fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from aiayn.data import Tokenizer
from aiayn.data.shards import PreparedData, PreparedSplit
from aiayn.decode import DecodeOptions, inference
from aiayn.distributed import World
from aiayn.errors import RecipeError
from aiayn.metrics import corpus_bleu
from aiayn.model.transformer import Transformer
from aiayn.progress import progress
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.translator import Translator


@torch.no_grad()
def loss_sums(
    model: Transformer,
    data: PreparedSplit,
    max_tokens: int,
    label_smoothing: float,
    world: World | None = None,
    show_progress: bool = False,
) -> list[float]:
    """``[loss, nll, target tokens]`` of ``model`` on the pairs of ``data`` that fit its
    ``max_len`` (teacher forcing), each summed over its batches; on several ranks each
    scores its share of the batches and every rank gets the totals. The model is left in
    training mode. ``show_progress``: a bar of this rank's batches."""
    world = world or World()
    model.eval()
    device, pad_id = next(model.parameters()).device, model.cfg.pad_id
    sums = [0.0, 0.0, 0.0]
    plan = data.plan(max_tokens, 0, 0, model.cfg.max_len)
    share = world.shard(len(plan))
    mine = plan[share.start : share.stop]
    for index in progress(mine, desc="valid loss", unit="batch", disable=not show_progress):
        batch = data.batch(index).to(device)
        logits = model(batch.src, batch.tgt_in)
        loss, nll, n = label_smoothed_cross_entropy(logits, batch.tgt_out, label_smoothing, pad_id)
        sums = [sums[0] + loss.item(), sums[1] + nll.item(), sums[2] + n]
    model.train()
    return world.sum(sums)


def validate(
    model: Transformer,
    data: PreparedSplit,
    hyps: list[str],
    refs: list[str],
    max_tokens: int,
    label_smoothing: float,
    tokenize: str = "13a",
) -> dict[str, float]:
    """``{"loss", "ppl", "bleu"}``: the per-token loss and perplexity of ``model`` on
    ``data`` (teacher forcing; the pairs that fit its ``max_len``: both NaN when none
    does), and the BLEU of ``hyps`` (its translations) against ``refs`` (BLEU's
    ``tokenize``), by this process alone. The model is left in training mode."""
    bleu = corpus_bleu(hyps, refs, tokenize=tokenize).score
    return _figures(loss_sums(model, data, max_tokens, label_smoothing), bleu)


def validate_world(
    model: Transformer,
    tokenizer: Tokenizer,
    data: PreparedSplit,
    src: list[str],
    refs: list[str],
    beam: int,
    max_tokens: int,
    label_smoothing: float,
    world: World,
    tokenize: str = "13a",
    show_progress: bool = False,
) -> dict[str, float]:
    """:func:`validate` with the translations of ``src`` (beam ``beam``; 1 = greedy),
    called on every rank of ``world``: each scores its share of the batches and translates
    its share of the sentences, and every rank returns the figures of one process.
    ``show_progress``: bars of both, on the first rank (its share)."""
    show = show_progress and world.is_main
    sums = loss_sums(model, data, max_tokens, label_smoothing, world, show)
    share = world.shard(len(src))
    mine = src[share.start : share.stop]
    hyps = world.gather(translate_texts(model, tokenizer, mine, beam, show_progress=show))
    bleu = corpus_bleu(hyps, refs, tokenize=tokenize).score if hyps is not None else 0.0
    return _figures(sums, world.broadcast(bleu))


def _figures(sums: list[float], bleu: float) -> dict[str, float]:
    loss, nll, n_tokens = sums
    if not n_tokens:  # nothing scored: no loss to tell (0 and a perplexity of 1 would lie)
        return {"loss": math.nan, "ppl": math.nan, "bleu": bleu}
    return {
        "loss": loss / n_tokens,
        "ppl": math.exp(min(nll / n_tokens, 50.0)),
        "bleu": bleu,
    }


def check_valid_lengths(data: PreparedData, max_len: int, log: Callable[[str], None]) -> None:
    """Logs how many validation pairs of ``data`` are longer than ``max_len`` tokens (on
    either side), which the validation loss leaves out; RecipeError naming the validation
    files and ``max_len`` when that is all of them (the loss would score nothing)."""
    split = data.valid
    pairs, fits = len(split), len(split.usable(max_len))
    if fits == pairs:
        return
    if not fits:
        inputs = data.manifest.get("inputs") or {}
        files = [inputs.get(k, {}).get("path") for k in ("valid_src", "valid_tgt")]
        named = " and ".join(f for f in files if f) or "the validation pairs"
        raise RecipeError(
            f"valid: all {pairs} pairs of {named} (prepared in {data.directory}) are longer "
            f"than model.max_len={max_len} tokens: the validation loss would score none "
            "(raise model.max_len, or validate on shorter pairs)"
        )
    log(
        f"valid: {pairs - fits} of {pairs} pairs longer than {max_len} tokens, left out of the "
        "validation loss (BLEU translates them all)"
    )


def translate_texts(
    model: Transformer,
    tokenizer: Tokenizer,
    texts: list[str],
    beam: int,
    batch_size: int = 128,
    show_progress: bool = False,
) -> list[str]:
    """``texts`` translated (greedy for ``beam=1``), in order, as :class:`Translator` gives
    them; the model is left in the mode it was in. ``show_progress``: a bar of sentences."""
    options = DecodeOptions(beam=beam)
    bar = progress(total=len(texts), desc="valid translate", unit="sent", disable=not show_progress)
    with inference(model), bar:  # once: each decoding step would switch the modes otherwise
        translator = Translator(model, tokenizer)
        found = translator.translate(texts, options, batch_size=batch_size, on_batch=bar.update)
    return [outputs[0] for outputs in found]
