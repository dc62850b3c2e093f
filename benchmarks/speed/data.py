"""Data, tokenizer and model config of a run: Multi30k (or the built-in sample), the timed
training batches, the test sentences, and our model for translation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.config import TransformerConfig
from aiayn.data import ParallelDataset, Tokenizer, read_parallel
from aiayn.data.corpus import read_lines
from aiayn.model.transformer import Transformer
from aiayn.train.recipe import Recipe

from .common import ROOT, load_model, multi30k_dir, save_checkpoint, write_sample
from .context import RunContext


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


def make_setup(ctx: RunContext) -> Setup:
    plan, work, log = ctx.plan, ctx.work, ctx.log
    recipe = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml")
    src_lang, tgt_lang = ctx.direction.split("-")
    data_dir = multi30k_dir()
    if data_dir is not None:
        train_files = (data_dir / f"train.{src_lang}.gz", data_dir / f"train.{tgt_lang}.gz")
        test_files = (data_dir / f"test2016.{src_lang}.gz", data_dir / f"test2016.{tgt_lang}.gz")
        data, test_set = f"Multi30k {ctx.direction} ({data_dir})", "test2016"
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

    if ctx.checkpoint:
        model, tokenizer = load_model(ctx.checkpoint)
        cfg, checkpoint, trained = model.cfg, Path(ctx.checkpoint), True
        log(f"checkpoint {checkpoint}: {model.num_parameters() / 1e6:.1f}M parameters")
    else:
        log("no --checkpoint: training a throwaway tokenizer, translating with random weights")
        tokenizer = Tokenizer.train(
            train_src + train_tgt, work / "spm", recipe.vocab_size, num_threads=ctx.threads
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
    setup = Setup(cfg, tokenizer, batches, test_src, test_ref, data, test_set, checkpoint, trained)
    if ctx.train_model != "recipe":
        table3 = getattr(TransformerConfig, ctx.train_model)
        setup.train_cfg = table3(cfg.tgt_vocab_size, max_len=cfg.max_len)
        log(f"training phase: Table 3 {ctx.train_model}, {setup.train_cfg}")
    return setup
