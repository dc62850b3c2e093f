"""Phase 2: translation of the test set by ours, Marian and CTranslate2 on the very same
batches, interleaved batch by batch; and the per-system translate functions that phase 4
(memory) runs again in its child processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import sacrebleu
import torch
from torch import Tensor

from aiayn.config import TransformerConfig
from aiayn.data import Tokenizer, pad, sorted_batches
from aiayn.model.transformer import Transformer
from aiayn.translator import Translator

from .common import ALPHA, BATCH_SIZE, MARIAN, MAX_LEN_B, OURS, PRECISIONS, load_model, sync
from .context import RunContext
from .ct2 import ct2_compute_type, ct2_vocabulary, export_ct2
from .data import Setup
from .peers import build_marian
from .results import TranslateResult, TranslateRow


def translator_batches(tokenizer: Tokenizer, lines: Sequence[str], cfg: TransformerConfig):
    """Token ids and the batches exactly as ``Translator.translate`` forms them (sorted by
    length, BATCH_SIZE sentences each), so peers decode the very same batches."""
    limit = cfg.max_len - 1
    ids = [tokenizer.encode(line)[:limit] if line.strip() else [] for line in lines]
    return ids, [index for index, _ in sorted_batches(ids, BATCH_SIZE, cfg.pad_id)]


def pad_rows(rows: list[list[int]], pad_id: int, device: torch.device) -> Tensor:
    return pad(rows, pad_id).to(device)


def translate_ours(model: Transformer, tokenizer: Tokenizer, lines, beam: int, device):
    """Our Translator; also returns the decoder steps it ran per batch (calls to decode)."""
    steps, count = [], [0]
    decode = model.decode

    def counting_decode(*a, **k):
        count[0] += 1
        return decode(*a, **k)

    def on_batch(_n: int) -> None:
        steps.append(count[0])
        count[0] = 0

    model.decode = counting_decode  # instance attribute, removed below; ~1 us per step
    try:
        hyps = Translator(model, tokenizer).translate(
            lines, beam=beam, alpha=ALPHA, batch_size=BATCH_SIZE, on_batch=on_batch
        )
    finally:
        del model.decode
    return [h[0] for h in hyps], steps


def translate_marian(mt, tokenizer: Tokenizer, cfg, lines, beam: int, steps, device):
    """MarianMTModel.generate on our batches, each forced to exactly ``steps[b]`` new tokens
    (min_new_tokens = max_new_tokens), the number of decoder steps our model ran on it."""
    ids, batches = translator_batches(tokenizer, lines, cfg)
    if len(batches) != len(steps):
        raise ValueError(f"{len(batches)} batches but {len(steps)} step counts")
    hyps, done_steps = [""] * len(lines), []
    beam_args = {"num_beams": beam, "length_penalty": ALPHA} if beam > 1 else {}
    with torch.inference_mode():
        for chunk, n_steps in zip(batches, steps):
            src = pad_rows([ids[i] for i in chunk], cfg.pad_id, device)
            out = mt.generate(
                input_ids=src,
                attention_mask=src.ne(cfg.pad_id).long(),
                do_sample=False,
                min_new_tokens=n_steps,
                max_new_tokens=n_steps,
                use_cache=True,
                decoder_start_token_id=cfg.bos_id,
                pad_token_id=cfg.pad_id,
                eos_token_id=cfg.eos_id,
                **beam_args,
            )
            done_steps.append(out.size(1) - 1)  # minus the decoder start token
            for i, row in zip(chunk, out[:, 1:].tolist()):
                hyps[i] = tokenizer.decode(row)
    return hyps, done_steps


def translate_ct2(translator, vocab, tokenizer: Tokenizer, cfg, lines, beam: int):
    """CTranslate2 on our batches; natural lengths (at most source length + MAX_LEN_B)."""
    src_vocab, tgt_vocab = vocab
    tgt_index = {t: i for i, t in enumerate(tgt_vocab)}
    ids, batches = translator_batches(tokenizer, lines, cfg)
    hyps = [""] * len(lines)
    for chunk in batches:
        source = [[src_vocab[t] for t in ids[i]] for i in chunk]
        results = translator.translate_batch(
            source,
            beam_size=beam,
            length_penalty=ALPHA,
            max_decoding_length=min(max(map(len, source)) + MAX_LEN_B, cfg.max_len),
            max_batch_size=BATCH_SIZE,
        )
        for i, res in zip(chunk, results):
            hyps[i] = tokenizer.decode(
                [tgt_index.get(t, tokenizer.unk_id) for t in res.hypotheses[0]]
            )
    return hyps


def bench_translate(setup: Setup, ctx: RunContext) -> TranslateResult:
    device, threads, log = ctx.device, ctx.threads, ctx.log
    cfg, tok, lines, refs = setup.cfg, setup.tokenizer, setup.test_src, setup.test_ref
    model, _ = load_model(setup.checkpoint, device, precision=ctx.precision)
    torch.manual_seed(2)
    mt = build_marian(cfg, device).eval().to(PRECISIONS[ctx.precision])
    exported = export_ct2(setup, ctx)
    ct2, ct2_errors = {}, {}
    if exported:
        import ctranslate2

        for name, path in exported.items():
            try:
                translator = ctranslate2.Translator(
                    str(path),
                    device=device.type,
                    compute_type=ct2_compute_type(name, device),
                    intra_threads=threads,
                    inter_threads=1,
                )
                translate_ct2(translator, ct2_vocabulary(path, tok), tok, cfg, lines[:2], 1)
            except Exception as e:  # e.g. a CUDA build that finds no matching cuBLAS
                log(f"CTranslate2 {name} on {device.type} failed: {type(e).__name__}: {e}")
                ct2_errors[name] = f"{type(e).__name__}: {e}"
                continue
            ct2[name] = (translator, ct2_vocabulary(path, tok))

    def bleu(hyps: list[str]) -> float:
        return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)

    def clock(fn: Callable, *fn_args) -> tuple:
        sync(device)
        t0 = time.perf_counter()
        result = fn(*fn_args)
        sync(device)
        return result, time.perf_counter() - t0

    ct2_names = {name: f"CTranslate2 {ct2_compute_type(name, device)} (our model)" for name in ct2}
    systems = [OURS, MARIAN, *ct2_names.values()]
    _, batches = translator_batches(tok, lines, cfg)
    warm = lines[:8]
    rows = []
    for beam in (1, 4):
        decoding = "greedy" if beam == 1 else f"beam {beam}"
        # Warm-up (first-call costs: allocator, lazy init).
        _, warm_steps = translate_ours(model, tok, warm, beam, device)
        translate_marian(mt, tok, cfg, warm, beam, warm_steps, device)
        for translator, vocab in ct2.values():
            translate_ct2(translator, vocab, tok, cfg, warm, beam)
        # Interleaved per batch (ours, Marian, CTranslate2, ... on one batch, then the next)
        # so that machine noise hits every system alike. Translating one length-sorted batch
        # at a time is exactly what Translator does with the whole list.
        seconds = dict.fromkeys(systems, 0.0)
        hyps = {n: [""] * len(lines) for n in systems}
        steps, marian_steps = [], []
        for chunk in batches:
            part = [lines[i] for i in chunk]
            out: dict[str, list[str]] = {}
            (out[OURS], s), sec = clock(translate_ours, model, tok, part, beam, device)
            seconds[OURS] += sec
            steps += s
            (out[MARIAN], m), sec = clock(translate_marian, mt, tok, cfg, part, beam, s, device)
            seconds[MARIAN] += sec
            marian_steps += m
            for name, (translator, vocab) in ct2.items():
                out[ct2_names[name]], sec = clock(
                    translate_ct2, translator, vocab, tok, cfg, part, beam
                )
                seconds[ct2_names[name]] += sec
            for n, texts in out.items():
                for i, text in zip(chunk, texts):
                    hyps[n][i] = text
        if marian_steps != steps:  # generate must have run exactly our steps per batch
            log(f"warning: Marian ran {marian_steps} steps per batch, ours {steps}")
        for n in systems:
            rate = len(lines) / seconds[n]
            row = TranslateRow(
                system=n,
                decoding=decoding,
                seconds=round(seconds[n], 2),
                sentences_per_s=round(rate, 2),
                bleu=bleu(hyps[n]) if setup.trained and n != MARIAN else None,
                lengths="natural (EOS, or source length + 50)",
                decoder_steps=None,
            )
            if n == OURS:
                row.decoder_steps = sum(steps)
            if n == MARIAN:
                row.lengths = "forced: min_new_tokens = max_new_tokens = our steps per batch"
                row.decoder_steps = sum(marian_steps)
            rows.append(row)
            log(f"{decoding}: {n} {rate:.1f} sent/s")
    for row in rows:
        ours = next(r for r in rows if r.system == OURS and r.decoding == row.decoding)
        row.ours_over_this = round(ours.sentences_per_s / row.sentences_per_s, 3)
    return TranslateResult(
        protocol=(
            "warm-up on 8 sentences, then one pass over the set, interleaved per batch (every "
            "system translates batch 1, then batch 2, ...); sentences/s over the whole pass, "
            "tokenization and detokenization included"
        ),
        test_set=setup.test_set,
        sentences=len(lines),
        batch_size=BATCH_SIZE,
        alpha=ALPHA,
        trained=setup.trained,
        ct2=sorted(exported) if exported else "CTranslate2 export not available",
        ct2_dirs={k: str(v) for k, v in exported.items() if k in ct2},
        ct2_errors=ct2_errors,
        rows=rows,
    )
