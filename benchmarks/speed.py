"""Speed against peers, side by side in one process: training, translation, decode cost
against output length, peak memory. Writes OUT/speed.json, OUT/speed.md (tables ready for
BENCHMARKS.md), OUT/decode_growth.png, OUT/profile_train_ours.txt (and the peers' profiles
in OUT/profile_train_peers.txt).

    python benchmarks/speed.py --checkpoint runs/bench-de-en/checkpoint_best.pt --out bench_out
    python benchmarks/speed.py --quick --threads 1 --out bench_quick     # smoke run, < 2 min
    python benchmarks/speed.py --phases train --max-tokens 3300 --rounds 8   # one phase, resized

Peers (all built here, same sizes, random weights unless stated):

* training: ours (``Transformer``) vs ``torch.nn.Transformer`` with our embeddings,
  positions and tied projection vs ``transformers``' ``MarianMTModel`` from a config. All three
  get the same batches and the same step: forward, projection of the real (non-pad) target
  positions only, label-smoothed cross-entropy 0.1 summed over real tokens, backward, Adam.
  Rounds are interleaved (A, B, C, A, B, C, ...) so machine noise hits all alike.
* translation of test2016: ours (``Translator``, batch 64) vs ``MarianMTModel.generate``
  (same batches, same number of decoder steps per batch: min_new_tokens = max_new_tokens =
  the steps our model took) vs CTranslate2 running our exported model (float32, int8);
  timed batch by batch, every system on a batch before the next batch.
* decode cost: exactly L greedy steps with our KV cache (``model.decode`` + ``DecoderState``)
  and with the whole prefix recomputed at every step.
* peak memory: each (phase, system) in its own child process, VmHWM of that process.

Data: Multi30k (../shared/data/multi30k or $AIAYN_MULTI30K), else the built-in sample with a
throwaway tokenizer. Without --checkpoint nothing is trained: BLEU is then not meaningful.
Needs the ``bench`` extra (transformers, psutil, matplotlib; ctranslate2 optional).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

import sacrebleu
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import TransformerConfig
from aiayn.data import PAD_ID, ParallelDataset, Tokenizer, collate, read_parallel
from aiayn.data.corpus import read_lines
from aiayn.data.sample import multi30k_dir, write_sample
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding
from aiayn.model.transformer import DecoderState, Transformer
from aiayn.train.checkpoint import save_checkpoint
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.train.recipe import Recipe
from aiayn.translator import PRECISIONS, Translator, load_model

ROOT = Path(__file__).resolve().parents[1]
OURS, TORCH_NN, MARIAN = "ours (aiayn)", "torch.nn.Transformer", "Marian (transformers)"
LABEL_SMOOTHING, ALPHA, MAX_LEN_B, BATCH_SIZE = 0.1, 0.6, 50, 64
GROWTH_BUDGET_S = 15.0  # no further repeats of one decode-growth point past this many seconds


# -- sizes -----------------------------------------------------------------------------------
@dataclass
class Plan:
    """How much of everything to run; ``--quick`` shrinks it to a smoke run."""

    max_tokens: int  # training batch budget (padded tokens per side)
    warmup_steps: int  # per peer, untimed
    rounds: int  # interleaved rounds, each peer runs ``steps_per_round`` timed steps per round
    steps_per_round: int
    profile_steps: int
    n_sentences: int  # test2016 sentences translated (0 = all)
    growth_lengths: tuple[int, ...]
    growth_batch: int
    growth_repeats: int  # fewer where one run takes long (see bench_growth)
    memory_sentences: int  # test sentences translated in each translation memory child
    train_pairs: int  # training pairs encoded (0 = all); only the batches used matter
    model_overrides: dict  # applied to the recipe's model when no checkpoint is given


FULL = Plan(
    max_tokens=3300,  # the recipe's
    warmup_steps=3,
    rounds=5,
    steps_per_round=4,
    profile_steps=3,
    n_sentences=0,
    growth_lengths=(10, 25, 50, 100, 200),
    growth_batch=8,
    growth_repeats=3,
    memory_sentences=2 * BATCH_SIZE,
    train_pairs=0,
    model_overrides={},
)
QUICK = Plan(
    max_tokens=600,
    warmup_steps=1,
    rounds=3,
    steps_per_round=1,
    profile_steps=1,
    n_sentences=100,
    growth_lengths=(10, 25, 50, 100),
    growth_batch=4,
    growth_repeats=1,
    memory_sentences=BATCH_SIZE,
    train_pairs=4000,
    model_overrides={"d_model": 128, "n_heads": 4, "n_layers": 2, "d_ff": 512},
)


# -- small helpers ---------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


BF16 = {"on": False}  # --precision (bf16 is the default on a GPU)


def autocast(device: torch.device):
    """bf16 autocast for training (as the trainer's precision=bf16) under --precision bf16."""
    if BF16["on"]:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def inference_precision() -> str:
    """Weights for translation: bf16 under --precision bf16 (as ``aiayn translate
    --precision bf16``), for ours and Marian alike."""
    return "bf16" if BF16["on"] else "fp32"


def peak_rss_mib() -> float:
    """Peak resident set of *this process image* in MiB: VmHWM on Linux. (ru_maxrss is not
    used: Linux carries the parent's high-water mark into a child across fork + exec.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def rss_mib() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None


# -- the three training peers ----------------------------------------------------------------
class TorchNNPeer(nn.Module):
    """``torch.nn.Transformer`` (batch_first, post-LN, ReLU) between our token embedding
    (shared, x sqrt(d_model)), our sinusoidal positions and our tied output projection.
    nn.Transformer ends each stack with an extra LayerNorm; post-LN has none (paper, ours),
    so both are removed, and dropout sits where ours has it (embeddings, residuals). Masks as
    ours: source key padding, causal + target key padding."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        self.src_pos = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.dropout)
        self.tgt_pos = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.dropout)
        self.core = nn.Transformer(
            d_model=cfg.d_model,
            nhead=cfg.n_heads,
            num_encoder_layers=cfg.encoder_layers,
            num_decoder_layers=cfg.decoder_layers,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout,
            activation="relu",
            layer_norm_eps=cfg.layer_norm_eps,
            batch_first=True,
            norm_first=False,
        )
        self.core.encoder.norm = None
        self.core.decoder.norm = None
        # nn.Transformer's one `dropout` also drops attention weights and FFN activations;
        # ours (and Marian here) use cfg.attention_dropout (0) and no activation dropout.
        for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
            layer.dropout = nn.Identity()  # inside the FFN, between the two linears
            layer.self_attn.dropout = cfg.attention_dropout
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = cfg.attention_dropout

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = self.cfg.pad_id
        T = tgt_in.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu_(1)  # True: hide
        src_pad = src.eq(pad)
        return self.core(
            self.src_pos(self.embed(src)),
            self.tgt_pos(self.embed(tgt_in)),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_in.eq(pad),
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )

    def project(self, h: Tensor) -> Tensor:
        return F.linear(h, self.embed.weight)


def marian_config(cfg: TransformerConfig):
    """A MarianConfig of the same size as ``cfg``: post-LN, ReLU, embeddings x sqrt(d_model),
    static sinusoidal positions (Marian's only kind), one shared and tied vocabulary."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=cfg.tgt_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function="relu",
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=0.0,
        max_position_embeddings=cfg.max_len,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id,
        bos_token_id=cfg.bos_id,
        decoder_start_token_id=cfg.bos_id,
        forced_eos_token_id=None,
    )


def build_marian(cfg: TransformerConfig, device: torch.device):
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(cfg)).to(device)
    with contextlib.suppress(Exception):  # the fused kernel, as ours uses
        model.set_attn_implementation("sdpa")
    return model


class MarianPeer(nn.Module):
    def __init__(self, cfg: TransformerConfig, device: torch.device):
        super().__init__()
        self.cfg, self.mt = cfg, build_marian(cfg, device)

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = self.cfg.pad_id
        out = self.mt.model(
            input_ids=src,
            attention_mask=src.ne(pad).long(),
            decoder_input_ids=tgt_in,
            decoder_attention_mask=tgt_in.ne(pad).long(),
            use_cache=False,
        )
        return out.last_hidden_state

    def project(self, h: Tensor) -> Tensor:
        return self.mt.lm_head(h) + self.mt.final_logits_bias[0]


class OursPeer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg, self.model = cfg, Transformer(cfg)

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in, project=False)

    def project(self, h: Tensor) -> Tensor:
        return self.model.project(h)


def build_peer(name: str, cfg: TransformerConfig, device: torch.device, seed: int = 1):
    torch.manual_seed(seed)
    if name == OURS:
        peer = OursPeer(cfg)
    elif name == TORCH_NN:
        peer = TorchNNPeer(cfg)
    elif name == MARIAN:
        peer = MarianPeer(cfg, device)
    else:
        raise ValueError(name)
    peer = peer.to(device).train()
    recipe = Recipe()
    optimizer = torch.optim.Adam(
        peer.parameters(), lr=1e-4, betas=recipe.adam_betas, eps=recipe.adam_eps
    )
    return peer, optimizer


def train_step(peer, optimizer, batch, device: torch.device, label: str | None = None) -> None:
    """One update as ``Trainer._update`` does it (update_freq 1, no clipping). ``label``
    names the parts for the profiler."""

    def part(name: str):
        if label is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"{label}/{name}")

    pad = peer.cfg.pad_id
    keep = batch.tgt_out != pad
    optimizer.zero_grad(set_to_none=True)
    with part("forward"), autocast(device):
        hidden = peer.hidden(batch.src, batch.tgt_in)  # [B, T, d]
        logits = peer.project(hidden[keep])  # [N, V]: real positions only
    with part("loss"):
        loss, _, _ = label_smoothed_cross_entropy(logits, batch.tgt_out[keep], LABEL_SMOOTHING, pad)
    with part("backward"):
        (loss / batch.n_tgt_tokens).backward()
    with part("optimizer"):
        optimizer.step()


# -- setup: data, tokenizer, model config ----------------------------------------------------
@dataclass
class Setup:
    cfg: TransformerConfig
    tokenizer: Tokenizer
    batches: list  # training Batches
    test_src: list[str]
    test_ref: list[str]
    data: str  # description
    test_set: str  # name of the translated set
    checkpoint: Path  # our model for translation (trained, or an untrained one saved here)
    trained: bool
    train_cfg: TransformerConfig | None = None  # sizes for phase 1 if not cfg's (--train-model)


def make_setup(args, plan: Plan, work: Path, log) -> Setup:
    recipe = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml")
    src_lang, tgt_lang = args.direction.split("-")
    data_dir = multi30k_dir()
    if data_dir is not None:
        train_files = (data_dir / f"train.{src_lang}.gz", data_dir / f"train.{tgt_lang}.gz")
        test_files = (data_dir / f"test2016.{src_lang}.gz", data_dir / f"test2016.{tgt_lang}.gz")
        data, test_set = f"Multi30k {args.direction} ({data_dir})", "test2016"
    else:
        paths = write_sample(work / "sample")
        train_files = (paths["train.de"], paths["train.en"])
        test_files = (paths["test.de"], paths["test.en"])
        if src_lang == "en":
            train_files, test_files = train_files[::-1], test_files[::-1]
        data = "built-in sample (Multi30k not found): numbers say little"
        test_set = "the sample's test split"
    train = read_parallel(*train_files, recipe.max_len_words)
    train_src, train_tgt = train.src, train.tgt
    if plan.train_pairs:
        train_src, train_tgt = train_src[: plan.train_pairs], train_tgt[: plan.train_pairs]

    if args.checkpoint:
        model, tokenizer = load_model(args.checkpoint)
        cfg, checkpoint, trained = model.cfg, Path(args.checkpoint), True
        log(f"checkpoint {checkpoint}: {model.num_parameters() / 1e6:.1f}M parameters")
    else:
        log("no --checkpoint: training a throwaway tokenizer, translating with random weights")
        tokenizer = Tokenizer.train(
            train_src + train_tgt, work / "spm", recipe.vocab_size, num_threads=args.threads
        )
        V = tokenizer.vocab_size
        cfg = TransformerConfig.from_dict(
            {**recipe.model, **plan.model_overrides, "src_vocab_size": V, "tgt_vocab_size": V}
        )
        torch.manual_seed(1)
        model = Transformer(cfg)
        checkpoint = save_checkpoint(
            {
                "model": model.state_dict(),
                "config": cfg.to_dict(),
                "tokenizer": tokenizer.to_bytes(),
            },
            work / "untrained.pt",
        )
        trained = False

    dataset = ParallelDataset.from_texts(tokenizer, train_src, train_tgt, cfg.max_len)
    all_batches = list(dataset.batches(plan.max_tokens, seed=1, epoch=0))
    need = plan.warmup_steps + plan.rounds * plan.steps_per_round
    batches = [all_batches[i % len(all_batches)] for i in range(need)]
    test_src, test_ref = read_lines(test_files[0]), read_lines(test_files[1])
    if plan.n_sentences:
        test_src, test_ref = test_src[: plan.n_sentences], test_ref[: plan.n_sentences]
    return Setup(cfg, tokenizer, batches, test_src, test_ref, data, test_set, checkpoint, trained)


# -- phase 1: training -----------------------------------------------------------------------
def bench_train(setup: Setup, plan: Plan, device: torch.device, out: Path, log) -> dict:
    names = [OURS, TORCH_NN, MARIAN]
    batches = [b.to(device) for b in setup.batches]
    warm, timed = batches[: plan.warmup_steps], batches[plan.warmup_steps :]
    peers, params = {}, {}
    for name in names:
        peer, opt = build_peer(name, setup.train_cfg or setup.cfg, device)
        peers[name] = (peer, opt)
        params[name] = sum(p.numel() for p in peer.parameters() if p.requires_grad)
        for batch in warm:
            train_step(peer, opt, batch, device)
        sync(device)
    rates: dict[str, list[float]] = {n: [] for n in names}
    step_ms: dict[str, list[float]] = {n: [] for n in names}
    k = plan.steps_per_round
    for r in range(plan.rounds):
        chunk = timed[r * k : (r + 1) * k]
        tokens = sum(b.n_tgt_tokens for b in chunk)
        for name in names:  # A, B, C, A, B, C, ...
            peer, opt = peers[name]
            sync(device)
            t0 = time.perf_counter()
            for batch in chunk:
                train_step(peer, opt, batch, device)
            sync(device)
            seconds = time.perf_counter() - t0
            rates[name].append(tokens / seconds)
            step_ms[name].append(1000 * seconds / len(chunk))
        log(
            f"train round {r + 1}/{plan.rounds}: "
            + ", ".join(f"{n} {rates[n][-1]:.0f} tok/s" for n in names)
        )

    # Where each step spends its time (ours in detail, the peers for comparison).
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    profiles = {}
    for name in names:
        peer, opt = peers[name]
        label = "ours" if name == OURS else "peer"
        with torch.profiler.profile(activities=activities) as prof:
            for batch in timed[: plan.profile_steps]:
                train_step(peer, opt, batch, device, label=label)
            sync(device)
        profiles[name] = prof.key_averages()
    header = f"{plan.profile_steps} training step(s), torch.profiler, sorted by {sort}"

    def table(n: str) -> str:
        body = profiles[n].table(sort_by=sort, row_limit=30, max_name_column_width=60)
        return f"{n}: {header}\n\n{body}\n"

    (out / "profile_train_ours.txt").write_text(table(OURS))
    (out / "profile_train_peers.txt").write_text("\n".join(table(n) for n in names[1:]))
    averages = profiles[OURS]
    ops = [e for e in averages if not e.key.startswith(("ours/", "ProfilerStep"))]
    total_self = sum(getattr(e, sort) for e in ops) or 1.0
    top_ops = [
        {
            "op": e.key,
            "self_ms_per_step": round(getattr(e, sort) / 1000 / plan.profile_steps, 2),
            "share": round(getattr(e, sort) / total_self, 3),
        }
        for e in sorted(ops, key=lambda e: getattr(e, sort), reverse=True)[:10]
    ]

    def parts_of(averages, label: str) -> dict[str, float]:
        return {
            e.key.split("/", 1)[1]: round(e.cpu_time_total / 1000 / plan.profile_steps, 1)
            for e in averages
            if e.key.startswith(f"{label}/")
        }

    parts = parts_of(averages, "ours")
    peer_parts = {n: parts_of(profiles[n], "peer") for n in names if n != OURS}
    del peers

    med = {n: statistics.median(rates[n]) for n in names}
    result = {
        "protocol": (
            f"{plan.warmup_steps} warm-up step(s) per system, then {plan.rounds} interleaved "
            f"rounds of {k} timed step(s) on the same batches (max_tokens {plan.max_tokens}); "
            "step = forward, projection of real target positions, label-smoothed CE "
            f"{LABEL_SMOOTHING}, backward, Adam"
        ),
        "tokens_per_round": [
            sum(b.n_tgt_tokens for b in timed[r * k : (r + 1) * k]) for r in range(plan.rounds)
        ],
        "systems": {},
        "profile": {
            "file": "profile_train_ours.txt",
            "ranked_by": sort,
            "peers_file": "profile_train_peers.txt",
            "parts_ms_per_step": parts,
            "top_ops": top_ops,
            "peers_parts_ms_per_step": peer_parts,
        },
    }
    for n in names:
        paired = [a / b for a, b in zip(rates[OURS], rates[n])]
        result["systems"][n] = {
            "parameters": params[n],
            "tokens_per_s_median": round(med[n], 1),
            "tokens_per_s_rounds": [round(x, 1) for x in rates[n]],
            "step_ms_median": round(statistics.median(step_ms[n]), 1),
            "ours_over_this": round(med[OURS] / med[n], 3),
            "ours_over_this_paired_median": round(statistics.median(paired), 3),
        }
    return result


# -- phase 2: translation --------------------------------------------------------------------
def translator_batches(tokenizer: Tokenizer, lines: Sequence[str], cfg: TransformerConfig):
    """Token ids and the batches exactly as ``Translator.translate`` forms them (sorted by
    length, BATCH_SIZE sentences each), so peers decode the very same batches."""
    limit = cfg.max_len - 1
    ids = [tokenizer.encode(line)[:limit] if line.strip() else [] for line in lines]
    order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
    return ids, [order[s : s + BATCH_SIZE] for s in range(0, len(order), BATCH_SIZE)]


def pad_rows(rows: list[list[int]], pad_id: int, device: torch.device) -> Tensor:
    src = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
    for r, row in enumerate(rows):
        src[r, : len(row)] = torch.tensor(row)
    return src.to(device)


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


def ct2_vocabulary(model_dir: Path, tokenizer: Tokenizer) -> tuple[list[str], list[str]]:
    """Source and target token lists of an exported CTranslate2 model (id order)."""

    def read(name: str) -> list[str] | None:
        if (model_dir / f"{name}.json").is_file():
            return json.loads((model_dir / f"{name}.json").read_text(encoding="utf-8"))
        if (model_dir / f"{name}.txt").is_file():
            return (model_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        return None

    shared = read("shared_vocabulary")
    src, tgt = read("source_vocabulary") or shared, read("target_vocabulary") or shared
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    return src or pieces, tgt or pieces


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


def export_ct2(setup: Setup, work: Path, log) -> dict[str, Path]:
    """Our model exported for CTranslate2, float32 and int8; {} where that is not possible."""
    try:
        from aiayn.export import export_ctranslate2
    except ImportError:
        log("CTranslate2 export not available (aiayn.export); skipping the CTranslate2 rows")
        return {}
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        log("ctranslate2 is not installed; skipping the CTranslate2 rows")
        return {}
    exported = {}
    for name in ("float32", "int8"):
        try:
            exported[name] = export_ctranslate2(
                setup.checkpoint.parent,
                work / f"ct2-{name}",
                checkpoint=str(setup.checkpoint),
                quantization=name,
                force=True,
            )
        except Exception as e:
            log(f"CTranslate2 export ({name}) failed: {type(e).__name__}: {e}; skipping it")
    return exported


def ct2_compute_type(name: str, device: torch.device) -> str:
    if device.type == "cuda":
        return "bfloat16" if name == "float32" else "int8_bfloat16"
    return name


def bench_translate(setup: Setup, plan: Plan, device, threads: int, work: Path, log) -> dict:
    cfg, tok, lines, refs = setup.cfg, setup.tokenizer, setup.test_src, setup.test_ref
    model, _ = load_model(setup.checkpoint, device, precision=inference_precision())
    torch.manual_seed(2)
    mt = build_marian(cfg, device).eval().to(PRECISIONS[inference_precision()])
    exported = export_ct2(setup, work, log)
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
            row = {
                "system": n,
                "decoding": decoding,
                "seconds": round(seconds[n], 2),
                "sentences_per_s": round(rate, 2),
                "bleu": bleu(hyps[n]) if setup.trained and n != MARIAN else None,
                "lengths": "natural (EOS, or source length + 50)",
                "decoder_steps": None,
            }
            if n == OURS:
                row["decoder_steps"] = sum(steps)
            if n == MARIAN:
                row["lengths"] = "forced: min_new_tokens = max_new_tokens = our steps per batch"
                row["decoder_steps"] = sum(marian_steps)
            rows.append(row)
            log(f"{decoding}: {n} {rate:.1f} sent/s")
    for row in rows:
        ours = next(r for r in rows if r["system"] == OURS and r["decoding"] == row["decoding"])
        row["ours_over_this"] = round(ours["sentences_per_s"] / row["sentences_per_s"], 3)
    return {
        "protocol": (
            "warm-up on 8 sentences, then one pass over the set, interleaved per batch (every "
            "system translates batch 1, then batch 2, ...); sentences/s over the whole pass, "
            "tokenization and detokenization included"
        ),
        "test_set": setup.test_set,
        "sentences": len(lines),
        "batch_size": BATCH_SIZE,
        "alpha": ALPHA,
        "trained": setup.trained,
        "ct2": sorted(exported) if exported else "CTranslate2 export not available",
        "ct2_dirs": {k: str(v) for k, v in exported.items() if k in ct2},
        "ct2_errors": ct2_errors,
        "rows": rows,
    }


# -- phase 3: decode cost against output length ----------------------------------------------
def fixed_steps(model: Transformer, src: Tensor, steps: int, use_cache: bool) -> Tensor:
    """Exactly ``steps`` greedy steps (EOS does not stop it), with the KV cache or
    recomputing the whole prefix each step."""
    cfg = model.cfg
    memory = model.encode(src)
    prefix = torch.full((src.size(0), 1), cfg.bos_id, dtype=torch.long, device=src.device)
    state = DecoderState() if use_cache else None
    for _ in range(steps):
        if state is not None:
            logits = model.decode(prefix[:, -1:], memory, src, state)[:, -1]
        else:
            logits = model.decode(prefix, memory, src)[:, -1]
        logits[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")
        prefix = torch.cat([prefix, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return prefix


def bench_growth(setup: Setup, plan: Plan, device: torch.device, out: Path, log) -> dict:
    cfg = setup.cfg
    model, _ = load_model(setup.checkpoint, device, precision=inference_precision())
    ids = [setup.tokenizer.encode(line)[: cfg.max_len - 1] for line in setup.test_src]
    src = pad_rows([i for i in ids if i][: plan.growth_batch], cfg.pad_id, device)
    lengths = [n for n in plan.growth_lengths if n < cfg.max_len]
    times = {"kv_cache": {}, "recompute": {}}
    with torch.inference_mode():
        fixed_steps(model, src, 5, True)  # warm-up
        fixed_steps(model, src, 5, False)
        for L in lengths:
            for name, cache in (("kv_cache", True), ("recompute", False)):
                runs = []
                while len(runs) < plan.growth_repeats and sum(runs) < GROWTH_BUDGET_S:
                    sync(device)
                    t0 = time.perf_counter()
                    fixed_steps(model, src, L, cache)
                    sync(device)
                    runs.append(time.perf_counter() - t0)
                times[name][L] = statistics.median(runs)
            log(
                f"growth L={L}: kv cache {times['kv_cache'][L]:.3f}s, "
                f"recompute {times['recompute'][L]:.3f}s"
            )
    rows = [
        {
            "length": L,
            "kv_cache_s": round(times["kv_cache"][L], 4),
            "recompute_s": round(times["recompute"][L], 4),
            "kv_cache_ms_per_step": round(1000 * times["kv_cache"][L] / L, 3),
            "recompute_ms_per_step": round(1000 * times["recompute"][L] / L, 3),
            "speedup": round(times["recompute"][L] / times["kv_cache"][L], 2),
        }
        for L in lengths
    ]
    plot = plot_growth(rows, src.size(0), out / "decode_growth.png")
    return {
        "batch": src.size(0),
        "source_length": src.size(1),
        "repeats": plan.growth_repeats,
        "protocol": (
            "encode once, then exactly L greedy steps (EOS ignored); median of up to "
            f"{plan.growth_repeats} repeats (fewer once a point has taken {GROWTH_BUDGET_S:.0f} s)"
        ),
        "rows": rows,
        "plot": plot,
    }


def plot_growth(rows: list[dict], batch: int, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    x = [r["length"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["kv_cache_s"] for r in rows], "o-", label="KV cache (DecoderState)")
    ax.plot(x, [r["recompute_s"] for r in rows], "s--", label="recompute prefix each step")
    ax.set_xlabel("output length L (decoder steps)")
    ax.set_ylabel(f"seconds for a batch of {batch}")
    ax.set_title("aiayn greedy decoding: cost against output length")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


# -- phase 4: peak memory, one child process per (phase, system) -----------------------------
def memory_child(job: dict, queue) -> None:
    """Runs in a fresh interpreter (spawn); reports VmHWM after one phase's work. A tiny
    model runs the same code first, so that the baseline already holds the library code
    and kernels that get paged in on first use, and "over baseline" is the work's own."""
    try:
        torch.set_num_threads(job["threads"])
        device = torch.device(job["device"])
        cfg = TransformerConfig.from_dict(job["cfg"])
        tiny = TransformerConfig.from_dict(
            {**job["cfg"], "d_model": 2 * cfg.n_heads, "d_ff": 8, "n_layers": 1}
            | {"n_encoder_layers": None, "n_decoder_layers": None}
        )
        tokenizer = Tokenizer.from_bytes(job["tokenizer"])
        if job["system"] == MARIAN or job.get("ct2_dir"):
            import transformers  # noqa: F401  (same imports as the timed run of that system)
        if job.get("ct2_dir"):
            import ctranslate2
        system, lines, beam = job["system"], job.get("lines"), job.get("beam")
        if job["phase"] == "train":
            batches = [collate(s, t).to(device) for s, t in job["batches"]]
            src, tgt = job["batches"][0]
            for c, work in ((tiny, [collate(src[:2], tgt[:2]).to(device)]), (cfg, batches)):
                if c is cfg:
                    base = rss_mib()
                peer, opt = build_peer(system, c, device)
                for batch in work:
                    train_step(peer, opt, batch, device)
                del peer, opt
        elif system == OURS:
            translate_ours(Transformer(tiny).to(device), tokenizer, lines[:2], beam, device)
            base = rss_mib()
            model, _ = load_model(job["checkpoint"], device)
            translate_ours(model, tokenizer, lines, beam, device)
        elif system == MARIAN:
            mt = build_marian(tiny, device).eval()
            translate_marian(mt, tokenizer, tiny, lines[:2], beam, [5], device)
            del mt
            base = rss_mib()
            mt = build_marian(cfg, device).eval()
            translate_marian(mt, tokenizer, cfg, lines, beam, job["steps"], device)
        else:  # CTranslate2: no tiny model to warm up with; loading is part of the work
            base = rss_mib()
            path = Path(job["ct2_dir"])
            translator = ctranslate2.Translator(
                str(path),
                device=device.type,
                compute_type=job["compute_type"],
                intra_threads=job["threads"],
            )
            vocab = ct2_vocabulary(path, tokenizer)
            translate_ct2(translator, vocab, tokenizer, cfg, lines, beam)
        sync(device)
        result = {"baseline_mib": base, "peak_mib": peak_rss_mib()}
        if device.type == "cuda":
            result["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        queue.put(result)
    except Exception as e:  # report, do not hang the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})


def bench_memory(setup: Setup, plan: Plan, args, translate: dict | None, log) -> dict:
    ctx = mp.get_context("spawn")
    base_job = {
        "threads": args.threads,
        "device": args.device,
        "cfg": setup.cfg.to_dict(),
        "tokenizer": setup.tokenizer.to_bytes(),
    }
    # Training: the largest batches of the timed run (peak follows the batch shape).
    by_size = sorted(setup.batches, key=lambda b: b.src.numel() + b.tgt_in.numel())[-2:]
    train_batches = [(unpad(b.src), unpad(b.tgt_in, drop_first=True)) for b in by_size]
    lines = setup.test_src[: plan.memory_sentences]
    device = torch.device(args.device)
    model, _ = load_model(setup.checkpoint, device)
    _, steps = translate_ours(model, setup.tokenizer, lines, 4, device)
    del model
    jobs = [
        {"phase": "train", "system": s, "batches": train_batches} for s in (OURS, TORCH_NN, MARIAN)
    ]
    tr = {"lines": lines, "beam": 4}
    jobs += [
        {"phase": "translate (beam 4)", "system": OURS, "checkpoint": str(setup.checkpoint), **tr},
        {"phase": "translate (beam 4)", "system": MARIAN, "steps": steps, **tr},
    ]
    for name, path in ((translate or {}).get("ct2_dirs") or {}).items():
        compute = ct2_compute_type(name, torch.device(args.device))
        jobs.append(
            {
                "phase": "translate (beam 4)",
                "system": f"CTranslate2 {compute} (our model)",
                "ct2_dir": path,
                "compute_type": compute,
                **tr,
            }
        )
    rows = []
    for job in jobs:
        queue = ctx.Queue()
        proc = ctx.Process(target=memory_child, args=({**base_job, **job}, queue))
        proc.start()
        result = None
        while result is None:
            try:
                result = queue.get(timeout=2)
            except Empty:
                if not proc.is_alive():  # died without a word (killed for memory, say)
                    with contextlib.suppress(Empty):
                        result = queue.get(timeout=2)
                    result = result or {"error": f"child exited with code {proc.exitcode}"}
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        row = {"phase": job["phase"], "system": job["system"]}
        if "error" in result:
            row["error"] = result["error"]
            log(f"memory {job['phase']} / {job['system']}: {result['error']}")
        else:
            row.update({k: round(v, 1) for k, v in result.items()})
            row["work_mib"] = round(result["peak_mib"] - result["baseline_mib"], 1)
            log(
                f"memory {job['phase']} / {job['system']}: peak {row['peak_mib']:.0f} MiB "
                f"({row['work_mib']:+.0f} over baseline)"
            )
        rows.append(row)
    return {
        "method": (
            "one spawned child process per row; peak = VmHWM (peak RSS) of that process; "
            "baseline = its RSS after imports and a tiny-model run of the same code, before "
            "building the real model (CTranslate2: before loading); training rows run the 2 "
            f"largest batches of the timed set, translation rows {len(lines)} test sentences"
        ),
        "rows": rows,
    }


def unpad(ids: Tensor, drop_first: bool = False) -> list[list[int]]:
    """Rows of a padded id tensor back to lists (pad 0 never occurs inside a sentence)."""
    rows = [[t for t in row if t != PAD_ID] for row in ids.tolist()]
    return [r[1:] for r in rows] if drop_first else rows


# -- report ----------------------------------------------------------------------------------
def fmt(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = [
        "## Speed against peers (`benchmarks/speed.py`)",
        "",
        f"{m['cpu']}, {m['threads']} thread(s), device {m['device']}"
        + (f" ({m['gpu']})" if m.get("gpu") else "")
        + (
            f", cuDNN attention {m['cudnn_attention']} (ours never uses it)"
            if m["device"] == "cuda"
            else ""
        )
        + f"; torch {m['torch']}, "
        f"transformers {m['transformers']}, ctranslate2 {m['ctranslate2'] or 'not installed'}. "
        f"Model: d_model {m['model']['d_model']}, {m['model']['n_heads']} heads, "
        f"{m['model']['layers']} layers, d_ff {m['model']['d_ff']}, "
        f"vocabulary {m['model']['vocab']} ({m['model']['parameters'] / 1e6:.1f}M parameters). "
        f"Data: {m['data']}."
        + (" **Quick (smoke) run: tiny sizes, not for BENCHMARKS.md.**" if m["quick"] else ""),
        "",
    ]
    if "train" in report:
        t = report["train"]
        tm = m.get("train_model")
        sizes = (
            f" Model for this phase: Table 3 {tm['table3']} (d_model {tm['d_model']}, "
            f"{tm['n_heads']} heads, {tm['layers']} layers, d_ff {tm['d_ff']}, dropout "
            f"{tm['dropout']}, vocabulary {tm['vocab']}, {tm['parameters'] / 1e6:.1f}M)."
            if tm
            else ""
        )
        precision = " bf16 autocast, every system." if m.get("precision") == "bf16" else ""
        lines += [
            "### Training throughput",
            "",
            f"{t['protocol']}. Median over rounds.{precision}{sizes}",
            "",
            "| system | parameters | target tokens/s | ms/step | ours / system (paired) |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, s in t["systems"].items():
            lines.append(
                f"| {name} | {s['parameters'] / 1e6:.2f}M | {fmt(s['tokens_per_s_median'], 0)} | "
                f"{fmt(s['step_ms_median'])} | {s['ours_over_this']:.2f}x "
                f"({s['ours_over_this_paired_median']:.2f}x) |"
            )
        p = t["profile"]
        parts = ", ".join(f"{k} {v:.0f} ms" for k, v in p["parts_ms_per_step"].items())
        top = ", ".join(f"`{o['op']}` {100 * o['share']:.0f}%" for o in p["top_ops"][:6])
        lines += [
            "",
            f"Our step ({p['file']}): {parts}. Top ops by self CPU time: {top}.",
            "",
        ]
    if "translate" in report:
        t = report["translate"]
        lines += [
            f"### Translation of {t['test_set']} ({t['sentences']} sentences, "
            f"batch {t['batch_size']}"
            + (", bf16 weights for ours and Marian)" if m.get("precision") == "bf16" else ")"),
            "",
            "| system | decoding | sentences/s | ours / system | BLEU | output lengths |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in t["rows"]:
            lines.append(
                f"| {r['system']} | {r['decoding']} | {fmt(r['sentences_per_s'])} | "
                f"{r['ours_over_this']:.2f}x | {fmt(r['bleu'], 2)} | {r['lengths']} |"
            )
        notes = [
            f"{t['protocol'][0].upper()}{t['protocol'][1:]}.",
            "Marian has random weights (no hub download), so its BLEU is meaningless; to make the "
            "speed comparison fair it decodes the very same batches (sorted by length, "
            f"{t['batch_size']} each) with `min_new_tokens = max_new_tokens` = the number of "
            "decoder steps our model ran on that batch, so both run the same number of steps "
            "(Marian keeps finished rows in the batch, ours drops them).",
        ]
        if not t["trained"]:
            notes.append(
                "No --checkpoint: our model is untrained too, so BLEU is not meaningful "
                "(speed only); outputs mostly run to source length + 50."
            )
        if isinstance(t["ct2"], str):
            notes.append(f"CTranslate2 rows skipped: {t['ct2']}.")
        else:
            notes.append(
                "CTranslate2 runs our exported weights with its own length penalty "
                f"(length^{t['alpha']}, ours GNMT's ((5+|Y|)/6)^{t['alpha']})."
            )
        for name, error in (t.get("ct2_errors") or {}).items():
            notes.append(f"CTranslate2 {name} could not run here: {error}")
        lines += ["", *notes, ""]
    if "growth" in report:
        g = report["growth"]
        lines += [
            f"### Decode cost against output length (ours, batch {g['batch']})",
            "",
            f"{g['protocol']}." + (f" Plot: `{g['plot']}`." if g["plot"] else ""),
            "",
            "| L | KV cache s | recompute s | KV ms/step | recompute ms/step | speed-up |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in g["rows"]:
            lines.append(
                f"| {r['length']} | {r['kv_cache_s']:.3f} | {r['recompute_s']:.3f} | "
                f"{r['kv_cache_ms_per_step']:.2f} | {r['recompute_ms_per_step']:.2f} | "
                f"{r['speedup']:.1f}x |"
            )
        lines.append("")
    if "memory" in report:
        mem = report["memory"]
        lines += [
            "### Peak memory",
            "",
            f"{mem['method']}.",
            "",
            "| phase | system | peak RSS MiB | over baseline MiB |",
            "|---|---|---:|---:|",
        ]
        for r in mem["rows"]:
            if "error" in r:
                lines.append(f"| {r['phase']} | {r['system']} | error: {r['error']} | |")
            else:
                extra = f" (GPU {r['cuda_peak_mib']:.0f})" if "cuda_peak_mib" in r else ""
                lines.append(
                    f"| {r['phase']} | {r['system']} | {r['peak_mib']:.0f}{extra} | "
                    f"{r['work_mib']:.0f} |"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--checkpoint", help="trained aiayn checkpoint (BLEU is meaningful)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--threads", type=int, default=2, help="torch / CTranslate2 threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--direction", choices=["de-en", "en-de"], default="de-en")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="every system alike: bf16 autocast in training, bf16 weights in translation "
        "(default: bf16 on a GPU, fp32 on the CPU); CTranslate2 keeps its own compute types",
    )
    parser.add_argument(
        "--no-cudnn-attention",
        action="store_true",
        help="GPU: switch cuDNN's fused attention off for every system (ours never uses it: "
        "it builds a plan per new shape); without this the peers use torch's default",
    )
    parser.add_argument(
        "--train-model",
        choices=["recipe", "base", "big"],
        default="recipe",
        help="sizes for the training phase: the recipe's (or the checkpoint's) model, or "
        "Table 3 base / big with the same vocabulary (random weights; for GPUs)",
    )
    parser.add_argument(
        "--phases", default="train,translate,growth,memory", help="comma-separated subset"
    )
    sizes = parser.add_argument_group("override the sizes of --quick or of the full run")
    for name in ("max_tokens", "warmup_steps", "rounds", "steps_per_round", "n_sentences"):
        sizes.add_argument("--" + name.replace("_", "-"), type=int)
    args = parser.parse_args()
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"train", "translate", "growth", "memory"}
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU")
    plan = QUICK if args.quick else FULL
    overrides = {
        k: getattr(args, k)
        for k in ("max_tokens", "warmup_steps", "rounds", "steps_per_round", "n_sentences")
        if getattr(args, k) is not None
    }
    plan = dataclasses.replace(plan, **overrides)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    BF16["on"] = (args.precision or ("bf16" if device.type == "cuda" else "fp32")) == "bf16"
    out = Path(args.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    setup = make_setup(args, plan, work, log)
    cfg = setup.cfg
    if args.train_model != "recipe":
        table3 = getattr(TransformerConfig, args.train_model)
        setup.train_cfg = table3(cfg.tgt_vocab_size, max_len=cfg.max_len)
        log(f"training phase: Table 3 {args.train_model}, {setup.train_cfg}")
    report: dict = {
        "meta": {
            "cpu": cpu_name(),
            "threads": args.threads,
            "device": args.device,
            "precision": "bf16" if BF16["on"] else "fp32",
            "cudnn_attention": "off for every system" if args.no_cudnn_attention else "default",
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "ctranslate2": version("ctranslate2"),
            "python": platform.python_version(),
            "commit": git_commit(),
            "quick": args.quick,
            "data": setup.data,
            "checkpoint": str(args.checkpoint) if args.checkpoint else None,
            "model": {
                "d_model": cfg.d_model,
                "n_heads": cfg.n_heads,
                "layers": f"{cfg.encoder_layers}+{cfg.decoder_layers}",
                "d_ff": cfg.d_ff,
                "vocab": cfg.tgt_vocab_size,
                "parameters": Transformer(cfg).num_parameters(),
            },
        }
    }
    if setup.train_cfg is not None:
        tc = setup.train_cfg
        report["meta"]["train_model"] = {
            "table3": args.train_model,
            "d_model": tc.d_model,
            "n_heads": tc.n_heads,
            "layers": f"{tc.encoder_layers}+{tc.decoder_layers}",
            "d_ff": tc.d_ff,
            "dropout": tc.dropout,
            "vocab": tc.tgt_vocab_size,
            "parameters": Transformer(tc).num_parameters(),
        }
    if "train" in phases:
        report["train"] = bench_train(setup, plan, device, out, log)
    if "translate" in phases:
        report["translate"] = bench_translate(setup, plan, device, args.threads, work, log)
    if "growth" in phases:
        report["growth"] = bench_growth(setup, plan, device, out, log)
    if "memory" in phases:
        report["memory"] = bench_memory(setup, plan, args, report.get("translate"), log)
    report["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
    (out / "speed.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "speed.md").write_text(markdown(report))
    log(f"wrote {out / 'speed.json'} and {out / 'speed.md'}")
    print()
    print(markdown(report))


if __name__ == "__main__":
    main()
