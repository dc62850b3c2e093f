"""The training loop (Section 5): token-budget batches, label smoothing, Adam with the
warmup schedule, validation with BLEU, atomic checkpoints and exact resume."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.checkpoint import (
    BEST,
    LAST,
    check_vocab,
    epoch_checkpoint_name,
    load_checkpoint,
    remove_stale_temp_files,
    resolve_device,
    save_checkpoint,
    step_checkpoint_name,
)
from aiayn.config import TransformerConfig
from aiayn.data import Tokenizer, sorted_batches
from aiayn.data.prepared import prepare
from aiayn.data.shards import MANIFEST, PreparedData, check_tokenizer
from aiayn.decode import generate
from aiayn.errors import CheckpointError
from aiayn.metrics import corpus_bleu
from aiayn.model.transformer import Transformer
from aiayn.progress import progress as progress_bar
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.train.recipe import Recipe
from aiayn.train.schedule import NoamSchedule


@dataclass
class TrainResult:
    step: int
    epoch: int
    best_bleu: float
    seconds: float
    stopped_by: str  # "max_epochs" | "max_steps" | "time_limit"


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, and mirrors scalars to
    TensorBoard when the ``tensorboard`` package is installed."""

    def __init__(self, out_dir: Path, tensorboard: bool = True):
        self.file = (out_dir / "metrics.jsonl").open("a", encoding="utf-8")
        self.flushed_train = False
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:  # optional dependency
                self.tb = None

    def write(self, kind: str, step: int, **values: float) -> None:
        self.file.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        # Current for `tail -f` without a flush per update: the first update shows at once.
        if kind != "train" or not self.flushed_train:
            self.file.flush()
            self.flushed_train = self.flushed_train or kind == "train"
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


class Trainer:
    """Trains one model into ``out_dir``; ``resume=True`` continues from checkpoint_last.pt
    exactly: same step, same batch order, same RNG streams."""

    def __init__(self, recipe: Recipe, out_dir: str | Path, resume: bool = False, log=print):
        self.recipe, self.out_dir, self.log = recipe, Path(out_dir), log
        self.out_dir.mkdir(parents=True, exist_ok=True)
        r = recipe
        if r.threads > 0:
            torch.set_num_threads(r.threads)
        self.device = resolve_device(r.device)
        state = self._previous_run(resume)
        self.data = self._prepared_data(state)
        self.tokenizer = self._tokenizer(state)
        V = self.tokenizer.vocab_size
        self.cfg = TransformerConfig.from_dict(
            state["config"]
            if state is not None
            else {**r.model, "src_vocab_size": V, "tgt_vocab_size": V}
        )
        # Prepared data: the index in memory, ids read from disk when a batch needs them (one
        # data path for raw text and prepared directories alike).
        self.train_data, self.valid_data = self.data.train, self.data.valid
        self.valid_src, self.valid_ref = self.data.valid_src, self.data.valid_tgt
        too_long = len(self.train_data) - len(self.train_data.usable(self.cfg.max_len))
        if too_long:
            self.log(f"train: {too_long} pairs longer than {self.cfg.max_len} tokens skipped")

        torch.manual_seed(r.seed)
        self.model = Transformer(self.cfg).to(self.device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), betas=r.adam_betas, eps=r.adam_eps
        )
        self.schedule = NoamSchedule(self.optimizer, self.cfg.d_model, r.warmup, r.lr_scale)
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.best_bleu, self.elapsed = -1.0, 0.0
        self.epoch_checkpoints: list[str] = []
        if state is not None:
            self._restore(state)
            self.log(
                f"resumed from {self.out_dir / LAST}: step {self.step}, epoch {self.epoch + 1}"
            )
        self.log(
            f"model: {self.model.num_parameters() / 1e6:.2f}M parameters, d_model="
            f"{self.cfg.d_model}, {self.cfg.encoder_layers}+{self.cfg.decoder_layers} layers, "
            f"device {self.device}"
        )

    def _previous_run(self, resume: bool) -> dict | None:
        """The state to resume from (None for a new run); refuses to overwrite a run."""
        last = self.out_dir / LAST
        remove_stale_temp_files(self.out_dir)
        if resume:
            if not last.is_file():
                raise CheckpointError(f"nothing to resume: {last} does not exist")
            return load_checkpoint(last, map_location="cpu")
        if last.exists():
            raise CheckpointError(
                f"{self.out_dir} already holds a training run ({LAST}); resume it or train "
                "into another directory"
            )
        return None

    def _prepared_data(self, state: dict | None) -> PreparedData:
        """The recipe's prepared directory, or the raw text prepared into the run's
        ``data/`` (kept for --resume, made again for a new run)."""
        r = self.recipe
        if r.data:
            directory = Path(r.data)
        else:
            directory = self.out_dir / "data"
            if state is None or not (directory / MANIFEST).is_file():
                if (directory / MANIFEST).is_file():  # ours, from a run that never saved
                    shutil.rmtree(directory)
                prepare(
                    (r.train_src, r.train_tgt), (r.valid_src, r.valid_tgt), directory,
                    vocab_size=r.vocab_size, model_type=r.spm_model_type,
                    max_len_words=r.max_len_words, log=lambda _: None, show_progress=False,
                )  # fmt: skip
        data = PreparedData(directory)
        self.log(f"train: {data.summary('train')}")
        self.log(f"valid: {data.summary('valid')}")
        return data

    def _tokenizer(self, state: dict | None) -> Tokenizer:
        """The run's tokenizer: the checkpoint's when resuming (which must be the one the
        data was encoded with), else the data's (copied beside the recipe)."""
        r = self.recipe
        if state is not None:
            tokenizer = Tokenizer.from_bytes(state["tokenizer"])
            check_vocab(state, tokenizer.vocab_size, self.out_dir / LAST, "its tokenizer")
            check_tokenizer(
                self.data.manifest,
                self.data.directory,
                state["tokenizer"],
                str(self.out_dir / LAST),
            )
        else:
            tokenizer = self.data.tokenizer
            (self.out_dir / "spm.model").write_bytes(self.data.spm_bytes)
            r.save(self.out_dir / "recipe.yaml")
        self.log(f"tokenizer: {tokenizer.vocab_size} joint tokens")
        return tokenizer

    # -- checkpoints ----------------------------------------------------------------------
    def _state(self) -> dict:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "rng": rng,
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "best_bleu": self.best_bleu,
            "elapsed": self.elapsed,
            "epoch_checkpoints": list(self.epoch_checkpoints),
            "config": self.cfg.to_dict(),
            "recipe": self.recipe.to_dict(),
            "tokenizer": self.tokenizer.to_bytes(),
        }

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self.best_bleu, self.elapsed = state["best_bleu"], state["elapsed"]
        self.epoch_checkpoints = list(state["epoch_checkpoints"])

    def save(self, name: str) -> Path:
        return save_checkpoint(self._state(), self.out_dir / name)

    def _save_kept(self, name: str) -> None:
        """Save an epoch or timed checkpoint; only the last ``keep_last`` stay on disk."""
        self.save(name)
        # A time-limited run saves its partial epoch; finishing that epoch after --resume
        # rewrites the same file, which must not count twice (or be pruned as "old").
        if name in self.epoch_checkpoints:
            self.epoch_checkpoints.remove(name)
        self.epoch_checkpoints.append(name)
        while len(self.epoch_checkpoints) > self.recipe.keep_last:
            (self.out_dir / self.epoch_checkpoints.pop(0)).unlink(missing_ok=True)

    # -- validation -----------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and perplexity on the validation set, and BLEU of its translations."""
        self.model.eval()
        loss_sum = nll_sum = 0.0
        n_tokens = 0
        for index in self.valid_data.plan(self.recipe.max_tokens, 0, 0, self.cfg.max_len):
            batch = self.valid_data.batch(index).to(self.device)
            logits = self.model(batch.src, batch.tgt_in)
            loss, nll, n = label_smoothed_cross_entropy(
                logits, batch.tgt_out, self.recipe.label_smoothing, self.cfg.pad_id
            )
            loss_sum, nll_sum, n_tokens = loss_sum + loss.item(), nll_sum + nll.item(), n_tokens + n
        bleu = corpus_bleu(self.translate_valid(), self.valid_ref)
        self.model.train()
        return {
            "loss": loss_sum / max(n_tokens, 1),
            "ppl": math.exp(min(nll_sum / max(n_tokens, 1), 50.0)),
            "bleu": bleu.score,
        }

    def translate_valid(self, batch_size: int = 128) -> list[str]:
        """The validation sources translated with the recipe's ``valid_beam``, in order."""
        limit = self.cfg.max_len - 1
        ids = [self.tokenizer.encode(s)[:limit] for s in self.valid_src]
        hyps = [""] * len(ids)
        for index, src in sorted_batches(ids, batch_size, self.cfg.pad_id):
            nbest = generate(self.model, src.to(self.device), self.recipe.valid_beam)
            for i, outputs in zip(index, nbest):
                hyps[i] = self.tokenizer.decode(outputs[0]) if outputs else ""
        return hyps

    def _validate_and_keep_best(self, metrics: MetricsLog) -> None:
        v = self.validate()
        metrics.write("valid", self.step, epoch=self.epoch + 1, seconds=round(self.elapsed, 2), **v)
        improved = v["bleu"] > self.best_bleu
        if improved:
            self.best_bleu = v["bleu"]
        self.log(
            f"valid epoch {self.epoch + 1} step {self.step}: loss {v['loss']:.3f} "
            f"ppl {v['ppl']:.2f} BLEU {v['bleu']:.2f}" + (" (best)" if improved else "")
        )
        if improved:
            self.save(BEST)

    # -- the loop -------------------------------------------------------------------------
    def train(self, progress: bool = True) -> TrainResult:
        """Train until the recipe's max_epochs, max_steps or time limit; validation and an
        epoch checkpoint at the end of every epoch (or at a stop), checkpoint_last.pt every
        ``save_every_steps`` updates."""
        metrics = MetricsLog(self.out_dir)
        self._start = time.perf_counter() - self.elapsed
        period = self.recipe.save_every_minutes * 60  # the next multiple of it, after a resume
        self._timed_save_at = (math.floor(self.elapsed / period) + 1) * period if period else 0
        stopped_by = "max_epochs"
        self.model.train()
        try:
            while self.epoch < self.recipe.max_epochs and stopped_by == "max_epochs":
                stopped_by = self._run_epoch(metrics, progress)
        finally:
            metrics.close()
        self.log(
            f"stopped ({stopped_by}) after {self.step} updates, {self.epoch} epochs, "
            f"{self.elapsed / 60:.1f} min; best valid BLEU {self.best_bleu:.2f}"
        )
        return TrainResult(self.step, self.epoch, self.best_bleu, self.elapsed, stopped_by)

    def _run_epoch(self, metrics: MetricsLog, progress: bool) -> str:
        """The rest of the current epoch (from ``batch_in_epoch``, after a resume); returns
        why it stopped: "max_epochs" when the epoch ran out, else "max_steps"/"time_limit"."""
        r = self.recipe
        # Index arrays only: each batch is read from the token files when its turn comes,
        # so an epoch of millions of pairs costs its plan, not its tensors.
        batches = self.train_data.plan(r.max_tokens, r.seed, self.epoch, self.cfg.max_len)
        bar = progress_bar(
            total=math.ceil(len(batches) / r.update_freq),
            initial=self.batch_in_epoch // r.update_freq,
            desc=f"epoch {self.epoch + 1}",
            unit="upd",
            disable=not progress,
        )
        stopped_by = "max_epochs"
        tick, tick_tokens = time.perf_counter(), 0
        while self.batch_in_epoch < len(batches):
            plans = batches[self.batch_in_epoch : self.batch_in_epoch + r.update_freq]
            group = [self.train_data.batch(index) for index in plans]
            loss, nll, n_tokens = self._update(group)
            self.batch_in_epoch += len(group)
            self.step += 1
            tick_tokens += n_tokens
            self.elapsed = time.perf_counter() - self._start
            lr = self.optimizer.param_groups[0]["lr"]
            metrics.write(
                "train", self.step, loss=loss, nll=nll, tokens=n_tokens, lr=lr,
                epoch=self.epoch + 1, seconds=round(self.elapsed, 2),
            )  # fmt: skip
            bar.update(1)
            if self.step % r.log_every == 0:
                now = time.perf_counter()
                rate = tick_tokens / max(now - tick, 1e-9)
                tick, tick_tokens = now, 0
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}")
                metrics.write("speed", self.step, tokens_per_s=rate)
            stopped_by = self._save_validate_or_stop(metrics)
            if stopped_by != "max_epochs":
                break
        bar.close()
        epoch_done = self.batch_in_epoch >= len(batches)
        if epoch_done or stopped_by != "max_epochs":
            if not r.valid_every_steps or stopped_by != "max_epochs":
                self._validate_and_keep_best(metrics)
            self._save_kept(epoch_checkpoint_name(self.epoch + 1))
        if epoch_done:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.save(LAST)
        return stopped_by

    def _save_validate_or_stop(self, metrics: MetricsLog) -> str:
        """The recipe's per-update duties; "max_steps"/"time_limit" when training must stop."""
        r = self.recipe
        if r.save_every_steps and self.step % r.save_every_steps == 0:
            self.save(LAST)
        period = r.save_every_minutes * 60
        if period and self.elapsed >= self._timed_save_at:
            self._timed_save_at = (math.floor(self.elapsed / period) + 1) * period
            self._save_kept(step_checkpoint_name(self.step))
        if r.valid_every_steps and self.step % r.valid_every_steps == 0:
            self._validate_and_keep_best(metrics)
        if r.max_steps and self.step >= r.max_steps:
            return "max_steps"
        if r.time_limit_minutes and self.elapsed >= r.time_limit_minutes * 60:
            return "time_limit"
        return "max_epochs"

    def _update(self, group) -> tuple[float, float, int]:
        """One optimizer update over ``group`` batches (gradient accumulation); returns
        the per-token loss, per-token NLL and the number of target tokens."""
        r = self.recipe
        use_bf16 = r.precision == "bf16"
        n_total = sum(b.n_tgt_tokens for b in group)
        loss_sum = nll_sum = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for batch in group:
            batch = batch.to(self.device)
            keep = batch.tgt_out != self.cfg.pad_id
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
                hidden = self.model(batch.src, batch.tgt_in, project=False)  # [B, T, d]
                # Project only real positions: pads would cost a [d_model x V] product each.
                logits = self.model.project(hidden[keep])  # [N, V]
            loss, nll, _ = label_smoothed_cross_entropy(
                logits, batch.tgt_out[keep], r.label_smoothing, self.cfg.pad_id
            )
            (loss / n_total).backward()  # gradient of the mean over all tokens of the update
            loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
        if r.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), r.clip_norm)
        self.optimizer.step()
        self.schedule.step()
        return loss_sum / n_total, nll_sum / n_total, n_total
