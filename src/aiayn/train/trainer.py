"""The training loop (Section 5): token-budget batches, label smoothing, Adam with the
warmup schedule, validation with BLEU, atomic checkpoints and exact resume.

Under ``torchrun`` the same loop runs data-parallel: every rank plans the same epoch,
each update takes the next ``world size x update_freq`` batches of that plan and each rank
runs its share (:mod:`aiayn.train.update`). Validation is split the same way: each rank
scores and translates its share of the validation set. Rank 0 alone prints, writes metrics
and saves; the others wait until each save is done, and an error rank 0 meets there is
raised on every rank. The saved position is a position in the global plan, so a run
resumes with any number of processes, each reading the checkpoint itself."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.checkpoint import LAST, load_weights, resolve_device, save_checkpoint
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode.sampling import stream_seed
from aiayn.distributed import World, init_from_env
from aiayn.errors import AiaynError, RecipeError, TrainingError
from aiayn.model.transformer import Transformer
from aiayn.progress import progress as progress_bar
from aiayn.train.duties import PENDING, Duties, drop_later_checkpoints
from aiayn.train.metrics_log import UP_TO_STEP, MetricsLog
from aiayn.train.model_checks import check_data_fits, check_same_recipe, run_config
from aiayn.train.optim import make_optimizer
from aiayn.train.recipe import Recipe, step_settings
from aiayn.train.rng import rng_state, set_rng_state
from aiayn.train.rundir import RunDirectory
from aiayn.train.runfolder import DATA_PRINT, check_resumed_data, data_print
from aiayn.train.schedule import NoamSchedule, budget_spent
from aiayn.train.update import Updater, UpdateResult, whole
from aiayn.train.validation import translate_texts, validate_world


@dataclass
class TrainResult:
    step: int
    epoch: int
    best_bleu: float
    seconds: float
    stopped_by: str  # "max_epochs" | "max_steps" | "time_limit"
    skipped: int = 0  # updates skipped for a non-finite loss or gradient


def _quiet(*_args: object, **_kwargs: object) -> None:
    """The log of ranks other than 0: one process speaks for the run."""


class Trainer:
    """Trains one model into ``out_dir``; ``resume=True`` continues from checkpoint_last.pt
    exactly: same step, same batch order, same RNG streams (on one process; on several,
    ranks other than 0 draw dropout from a stream seeded by rank and step). ``resume=
    "auto"`` resumes when there is a checkpoint and starts anew when there is none, so a
    restarted job (torchrun's ``--max-restarts``) picks up where it stopped.

    ``world`` is this process's place in a torch.distributed job; by default the one that
    torchrun's environment describes (a world of one outside torchrun). ``progress``: show
    the progress of preparing raw text (on rank 0; :meth:`train` takes its own).

    The weights a run trains depend on its recipe, seed and checkpoint alone: the trainer
    keeps its own copy of the global random streams (:mod:`aiayn.train.rng`) from its
    construction, and :meth:`train` starts from it, whatever drew from torch's generator in
    between (another trainer, the caller). A constructor that fails lets go of the run
    directory before it raises."""

    def __init__(
        self,
        recipe: Recipe,
        out_dir: str | Path,
        resume: bool | str = False,
        log: Callable[[str], None] = print,
        world: World | None = None,
        progress: bool = True,
    ):
        if str(out_dir) == "":  # Path("") is the current directory: an unset variable?
            raise AiaynError("run directory: the path is empty")
        if not isinstance(recipe, Recipe):  # a dict, say: an AttributeError before
            raise RecipeError(
                f"recipe: a {type(recipe).__name__}, not a Recipe (Recipe.from_dict reads a dict)"
            )
        r = self.recipe = recipe.check()  # before anything is written
        if r.threads > 0:
            torch.set_num_threads(r.threads)
        device = resolve_device(r.device)
        self.world = world or init_from_env(device.type, r.collective_timeout_minutes)
        self.device = torch.device(self.world.device(str(device)))
        self.out_dir, self.log = Path(out_dir), log if self.world.is_main else _quiet
        check_same_recipe(r, self.world)  # before any rank writes or waits on another
        self.run = RunDirectory(self.out_dir, self.world, self.log)
        try:
            self._set_up(resume, progress)
        except BaseException:
            self.run.discard_new_data()  # a refused run leaves nothing behind
            # A failed trainer lives on in its traceback (a notebook keeps the last one):
            # holding the directory until then would refuse the retry.
            self.run.release()
            raise

    def _set_up(self, resume: bool | str, progress: bool) -> None:
        """The run's data, tokenizer and model, new or resumed (see :meth:`__init__`)."""
        r, run = self.recipe, self.run
        state = run.previous_state(resume, self.device, r)
        # A new run with init_from starts from that model: config, weights, tokenizer.
        init = run.new_run(r, self.device) if state is None else None
        known = state if state is not None else init
        tokenizer = Tokenizer.from_bytes(known["tokenizer"]) if known is not None else None
        self.data = run.prepared_data(r, state, tokenizer, progress)
        self.tokenizer = run.tokenizer(self.data, state, init)  # another one is named first
        check_resumed_data(self.data, state)
        self.cfg = run_config(self.recipe, self.tokenizer, state, init)
        check_data_fits(self.data, self.cfg, r, self.log)  # before a new run writes a file
        run.save_run_files(r, state, self.cfg, self.tokenizer)
        # What a model that came from elsewhere carries along (see aiayn.checkpoint).
        self.generation = dict((known or {}).get("generation") or {})
        self.origin = (known or {}).get("origin")
        if init is not None:
            self.origin = {"init_from": init["path"], "origin": init.get("origin")}
        # Prepared data: the index in memory, ids read from disk when a batch needs them (one
        # data path for raw text and prepared directories alike).
        self.train_data, self.valid_data = self.data.train, self.data.valid
        self.valid_src, self.valid_ref = self.data.valid_src, self.data.valid_tgt

        torch.manual_seed(r.seed)  # the same initial weights on every rank
        self.model = Transformer(self.cfg)
        if init is not None:
            load_weights(self.model, init, init["path"])
            self.log(f"starting from {init['path']} (fresh optimizer and schedule)")
        self.model.to(self.device)
        self.optimizer = make_optimizer(self.model, r.adam_betas, r.adam_eps, r.weight_decay)
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.best_bleu, self.elapsed, self.skipped, self.bad_in_a_row = -1.0, 0.0, 0, 0
        self.schedule = NoamSchedule(
            self.optimizer, self.cfg.d_model, r.warmup, r.lr_scale, r.schedule, r.max_steps,
            self._time_used if r.time_limit_minutes else None, r.cooldown,
        )  # fmt: skip
        self.epoch_checkpoints: list[str] = []
        self._metrics: MetricsLog | None = None  # while train() runs
        self._bars = False  # while train(progress=True) runs: validation shows bars too
        self._resumed_log_size = None if state is None else state.get("metrics_bytes", UP_TO_STEP)
        if state is not None:
            self._restore(state)
            run.on_main(lambda: drop_later_checkpoints(self, bool(state.get(PENDING))))
            self.log(
                f"resumed from {self.out_dir / LAST}: step {self.step}, epoch {self.epoch + 1}"
                f", batch {self.batch_in_epoch} of the epoch's plan"
            )
        # A pending state owes its step's validation and stop (see Duties; checkpoints from
        # before the mark have none: they owe nothing). Kept across train() calls.
        self._duties = Duties(self, bool((state or {}).get(PENDING)))
        self.updater = Updater(
            self.model, self.optimizer, self.schedule, self.world,
            label_smoothing=r.label_smoothing, clip_norm=r.clip_norm,
            **step_settings(r, self.device.type),
        )  # fmt: skip
        if state is not None and state.get("loss_scale"):  # as it went on, not 2^16 again
            self.updater.scaler.load_state_dict(state["loss_scale"])
        self.log(
            f"model: {self.model.num_parameters() / 1e6:.2f}M parameters, d_model="
            f"{self.cfg.d_model}, {self.cfg.encoder_layers}+{self.cfg.decoder_layers} layers, "
            f"device {self.device}"
            + (f", {self.world.size} processes" if self.world.size > 1 else "")
        )
        if self.updater.compiled:  # else a GPU run would sit silent for minutes at its start
            self.log(
                "compiled step: the first batch compiles it first (a minute or two on a "
                "GPU); compile: false starts short runs at once"
            )
        # train() starts from the run's own streams (see the class)
        self._rng = rng_state(self.device.type == "cuda")

    # -- checkpoints ----------------------------------------------------------------------
    def _state(self, pending: bool = False) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "rng": rng_state(self.device.type == "cuda"),  # rank 0's (others: _run_epoch)
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "best_bleu": self.best_bleu,
            "elapsed": self.elapsed,
            "skipped": self.skipped,
            "bad_in_a_row": self.bad_in_a_row,  # non-finite updates: the stop counts on
            "loss_scale": self.updater.scaler.state_dict(),  # fp16's ({} otherwise)
            PENDING: pending,  # saved before its step's validation and stop (see Duties)
            # The log of every step up to this state, on disk first (see MetricsLog).
            "metrics_bytes": self._metrics.size() if self._metrics is not None else None,
            "epoch_checkpoints": list(self.epoch_checkpoints),
            "config": self.cfg.to_dict(),
            "recipe": self.recipe.to_dict(),
            "tokenizer": self.tokenizer.to_bytes(),
            DATA_PRINT: data_print(self.data),  # what it trains on (a resume checks it)
            **({"generation": self.generation} if self.generation else {}),
            **({"origin": self.origin} if self.origin else {}),
        }

    def _restore(self, state: dict) -> None:
        """Continue from ``state`` (read onto this rank's device)."""
        load_weights(self.model, state, self.out_dir / LAST)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as e:  # another number or size of parameter groups
            raise RecipeError(
                f"{self.out_dir / LAST}: its optimizer state does not fit this recipe's "
                f"optimizer (was weight_decay changed since the run started?): {e}"
            ) from None
        set_rng_state(state["rng"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self.best_bleu, self.elapsed = state["best_bleu"], state["elapsed"]
        self.epoch_checkpoints = list(state["epoch_checkpoints"])
        self.skipped = state.get("skipped", 0)  # absent from checkpoints before the guard
        self.bad_in_a_row = state.get("bad_in_a_row", 0)
        self.schedule.load_state_dict(state["schedule"])  # after step and elapsed: its budget

    def save(self, name: str, fence: bool = True, pending: bool = False) -> Path:
        """Rank 0 writes checkpoint ``name`` (atomically); with ``fence``, every rank waits
        until it is on disk, so no rank runs ahead of the last saved state, and an error in
        the writing (a full disk) is raised on every rank. ``pending``: saved before its
        step's validation and stop, which a run resumed from it does first."""
        path = self.out_dir / name

        def write() -> None:
            save_checkpoint(self._state(pending), path)

        if fence:
            self.run.on_main(write)
        elif self.world.is_main:
            write()
        return path

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Loss and perplexity on the validation set, and BLEU of its translations (the
        recipe's ``valid_beam`` and ``valid_tokenize``), the same on every rank; each rank
        does its share."""
        return validate_world(
            self.model, self.tokenizer, self.valid_data, self.valid_src, self.valid_ref,
            self.recipe.valid_beam, self.recipe.max_tokens, self.recipe.label_smoothing,
            self.world, self.recipe.valid_tokenize, self._bars,
        )  # fmt: skip

    def translate_valid(self) -> list[str]:
        """The validation sources translated with the recipe's ``valid_beam``, in order
        (by this process alone)."""
        return translate_texts(self.model, self.tokenizer, self.valid_src, self.recipe.valid_beam)

    # -- the loop -------------------------------------------------------------------------
    def train(self, progress: bool = True) -> TrainResult:
        """Train until the recipe's max_epochs, max_steps or time limit; validation and an
        epoch checkpoint at the end of every epoch (or at a stop), checkpoint_last.pt every
        ``save_every_steps`` updates (see :mod:`aiayn.train.duties`). A resumed run that
        had reached its budget trains no more, but first completes the validation and
        checkpoints of its stop if it was cut short before they were all saved.

        It holds the run directory while it runs and lets it go when it returns or raises;
        called again (after an interrupt), it goes on from the last update done, first
        doing what that step's validation and saves left undone (as a resume would), and
        holds the directory again (AiaynError if another run has taken it since)."""
        # Held since __init__, or let go by an earlier train() (one a notebook interrupted).
        self.run.on_main(self.run.hold)
        set_rng_state(self._rng)  # the run's streams, not what drew from them since
        opened: list[MetricsLog] = []  # rank 0 opens the log; a failure stops every rank
        duties, log_size = self._duties, self._resumed_log_size  # size None: no cut
        self.run.on_main(
            lambda: opened.append(
                MetricsLog(self.out_dir, keep=log_size, step=self.step, pending=duties.pending)
            )
        )
        metrics = opened[0] if opened else MetricsLog(self.out_dir, enabled=False)
        self._resumed_log_size = None  # cut once: a train() called again keeps what this logs
        self._metrics, self._bars = metrics, progress
        self._start = time.perf_counter() - self.elapsed
        stopped_by = budget_spent(self.recipe, self.step, self.elapsed) or "max_epochs"
        owed = stopped_by != "max_epochs" and duties.pending  # even past a lowered max_epochs
        if stopped_by != "max_epochs" and not duties.pending:
            self.log(f"nothing to do: the run already reached its {stopped_by}")  # not 1 update
        elif stopped_by != "max_epochs":  # cut short (a kill, a full disk) while it stopped
            self.log(
                f"the run reached its {stopped_by} but was stopped before its final "
                "validation and checkpoints: doing them now"
            )
            stopped_by = "max_epochs"  # into the epoch, whose owed duties come first
        self.model.train()
        try:
            while (self.epoch < self.recipe.max_epochs or owed) and stopped_by == "max_epochs":
                stopped_by, owed = self._run_epoch(metrics, duties, progress), False
        finally:
            self._rng = rng_state(self.device.type == "cuda")  # a next train() goes on
            metrics.close()
            self._metrics, self._bars = None, False
            self.run.release()
        self.log(
            f"stopped ({stopped_by}) after {self.step} updates, {self.epoch} full epochs"
            + (f" and {self.batch_in_epoch} batches of the next" if self.batch_in_epoch else "")
            + f", {self.elapsed / 60:.1f} min; best valid BLEU {self.best_bleu:.2f}"
            + (f"; {self.skipped} updates skipped (non-finite)" if self.skipped else "")
            + self.updater.compile_note()
        )
        return TrainResult(
            self.step, self.epoch, self.best_bleu, self.elapsed, stopped_by, self.skipped
        )

    def _run_epoch(self, metrics: MetricsLog, duties: Duties, progress: bool) -> str:
        """The rest of the current epoch (from ``batch_in_epoch``, after a resume, once the
        resumed step's owed duties are done); returns why it stopped: "max_epochs" when the
        epoch ran out, else "max_steps"/"time_limit"."""
        r = self.recipe
        # Index arrays only: each batch is read from the token files when its turn comes,
        # so an epoch of millions of pairs costs its plan, not its tensors.
        batches = self.train_data.plan(r.max_tokens, r.seed, self.epoch, self.cfg.max_len)
        per_update = self.world.size * r.update_freq  # batches of the plan per update
        bar = progress_bar(
            total=math.ceil(len(batches) / per_update),
            initial=self.batch_in_epoch // per_update,
            desc=f"epoch {self.epoch + 1}",
            unit="upd",
            disable=not progress or not self.world.is_main,
        )
        stopped_by = duties.owed(metrics)  # a resumed run's, before any update
        tick, tick_tokens = time.perf_counter(), 0
        while stopped_by == "max_epochs" and self.batch_in_epoch < len(batches):
            first = self.batch_in_epoch
            plans = batches[first : first + per_update]
            lr = self.optimizer.param_groups[0]["lr"]  # this update's rate (logged below)
            if self.world.rank > 0:  # rank 0's stream is saved; the others' made again here
                # so that a resumed run draws the dropout masks it drew
                torch.manual_seed(stream_seed(r.seed, self.world.rank, self.epoch, first))
            with whole():  # index arrays in: each rank reads only its share from disk
                result = self.updater.update(plans, self.train_data.batch)
                self.batch_in_epoch += len(plans)
                self._clock()
                if result.skipped:
                    self._skip(result, metrics, first)
                    continue
                self.step, self.bad_in_a_row = self.step + 1, 0
                tick_tokens += result.n_tokens
                metrics.write(
                    "train", self.step, loss=result.loss, nll=result.nll, tokens=result.n_tokens,
                    lr=lr, epoch=self.epoch + 1, seconds=round(self.elapsed, 2),
                    first_batch=first, batches=len(plans),
                )  # fmt: skip
            bar.update(1)
            if self.step % r.log_every == 0:
                now = time.perf_counter()
                rate = tick_tokens / max(now - tick, 1e-9)
                tick, tick_tokens = now, 0
                bar.set_postfix(loss=f"{result.loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}")
                metrics.write("speed", self.step, tokens_per_s=rate)
            last = self.batch_in_epoch >= len(batches) and self.epoch + 1 >= r.max_epochs
            stopped_by = duties.after_update(metrics, last_of_run=last)
        bar.close()
        duties.end(metrics, stopped_by, epoch_done=self.batch_in_epoch >= len(batches))
        return stopped_by

    def _time_used(self) -> float:
        """The fraction of the time limit spent (for the schedules that decay to 0)."""
        return self.elapsed / (self.recipe.time_limit_minutes * 60)

    def _clock(self) -> None:
        """Rank 0's elapsed time, on every rank: the time limit and timed saves are then
        decided alike everywhere (a rank that stopped alone would hang the others)."""
        elapsed = time.perf_counter() - self._start
        if self.world.size > 1:
            elapsed = self.world.sum([elapsed if self.world.is_main else 0.0])[0]
        self.elapsed = elapsed

    def _skip(self, result: UpdateResult, metrics: MetricsLog, first: int) -> None:
        """Log an update that was skipped for a non-finite loss or gradient; stop the run
        after ``max_skipped_updates`` in a row (the checkpoints on disk hold the last good
        state: nothing is saved from here)."""
        self.skipped, self.bad_in_a_row = self.skipped + 1, self.bad_in_a_row + 1
        limit = self.recipe.max_skipped_updates
        self.log(
            f"update after step {self.step} skipped: loss {result.loss:.4g}, gradient norm "
            f"{result.grad_norm:.4g} (not finite; {self.bad_in_a_row} in a row, stop at {limit})"
        )
        metrics.write(
            "skipped", self.step, loss=str(result.loss), grad_norm=str(result.grad_norm),
            first_batch=first, in_a_row=self.bad_in_a_row,
        )  # fmt: skip
        if self.bad_in_a_row >= limit:
            kept = (
                f"the checkpoints in {self.out_dir} keep the last good state"
                if (self.out_dir / LAST).is_file()
                else "no checkpoint was saved yet"
            )
            raise TrainingError(
                f"training stopped: {limit} updates in a row had a non-finite loss or "
                f"gradient (after step {self.step}); {kept}. Lower the learning rate or warm "
                "up longer, clip gradients, or use fp32"
            )
