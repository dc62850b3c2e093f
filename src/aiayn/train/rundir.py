"""A training run's directory: what a new or resumed run finds there and writes first.

A new run checks its recipe, its model and the model it starts from before it writes
anything, and makes the directory only then: a run refused up front leaves an existing
directory as it was and no new one behind; one refused by checks of the text it prepared
removes that data/ and the directories it made (:meth:`RunDirectory.discard_new_data`).

On several processes rank 0 alone writes it and decides what it holds (a new run, or one
to resume), and an error it meets, of any kind, is raised on every rank: none is left
waiting for a result that never comes. To resume, every rank reads the checkpoint itself,
onto its own device (so several machines need the run directory at the same path: a
shared file system).
"""

from __future__ import annotations

import os
import pickle
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

try:  # POSIX: a run directory is held with an advisory lock (flock) while a run uses it
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from aiayn.checkpoint import (
    LAST,
    check_vocab,
    load_checkpoint,
    resolve_checkpoint,
    split_model_spec,
)
from aiayn.config import TransformerConfig
from aiayn.data import Tokenizer
from aiayn.data.datasets import pair_files
from aiayn.data.folders import check_writable
from aiayn.data.prepared import prepare
from aiayn.data.shards import MANIFEST, PreparedData, check_tokenizer
from aiayn.distributed import World
from aiayn.errors import AiaynError, CheckpointError, CorpusError
from aiayn.train.model_checks import check_new_model, check_resume
from aiayn.train.recipe import TEXT_FIELDS, Recipe
from aiayn.train.runfolder import (
    check_new_run_folder,
    check_replaced_data,
    data_print,
    remove_stale_temp_files,
    same_text,
)

T = TypeVar("T")


def portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (to be sent to the other ranks), else a
    RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


# Why a rank other than 0 may not find what rank 0 wrote into the run directory.
SHARED = "on several machines, the run directory must be at one path on each (a shared disk)"


class RunDirectory:
    """``out_dir`` of one run, as seen from this process of ``world``."""

    def __init__(self, out_dir: Path, world: World, log: Callable[[str], None]):
        self.out_dir, self.world, self.log = out_dir, world, log
        self._held: weakref.finalize | None = None  # closes rank 0's lock on the directory
        self._made: list[Path] = []  # the run directory and parents this run made (rank 0)
        self._prepared: Path | None = None  # data/ a new run prepared, until its recipe
        self.on_main(self._check_place)

    def hold(self) -> None:
        """Hold the run directory, once it exists, until :meth:`release`, this object is
        collected or the process ends (an flock on the directory itself, so nothing is
        written; closing the descriptor lets it go): a second run into it, new or resumed,
        is refused instead of interleaving checkpoints and metrics. Held already: nothing
        to do; released: taken again (AiaynError if another run holds it now)."""
        if self._held is not None or fcntl is None or not self.out_dir.is_dir():
            return
        fd = os.open(self.out_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise AiaynError(
                f"{self.out_dir}: another run is using this run directory; let it finish, "
                "or choose another directory"
            ) from None
        self._held = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        """Let another run use the directory (the run is over)."""
        if self._held is not None:
            self._held()  # closes the descriptor, once
            self._held = None  # so that hold() takes it again (train() after an interrupt)

    def _check_place(self) -> None:
        """Rank 0: the run directory is one (or does not exist yet), held if it exists."""
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise AiaynError(f"{self.out_dir}: not a directory (the run directory must be one)")
        self.hold()

    def write(self, work: Callable[[], T]) -> T:
        """``work()`` on rank 0 (see :meth:`on_main`), once the run directory exists: made
        here if it does not (AiaynError naming it if it cannot be). If ``work`` fails, the
        directories it made are removed again while empty (see :meth:`discard_new_data`)."""

        def made_then_work() -> T:
            made = [p for p in (self.out_dir, *self.out_dir.parents) if not p.exists()]
            self._made += made
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise AiaynError(
                    f"{self.out_dir}: cannot create the run directory ({e.strerror or e})"
                ) from None
            self.hold()  # a new run holds its directory from its first write
            try:
                return work()
            except BaseException:
                self.discard_new_data(made)
                raise

        return self.on_main(made_then_work)

    def discard_new_data(self, made: list[Path] | None = None) -> None:
        """For a new run that failed before writing its recipe (refused by a check of its
        prepared pairs): removes the data/ it prepared (it would refuse a run of other text),
        then the directories ``made`` (default: all it made) while empty; nothing else."""
        if self._prepared is not None:  # set on rank 0 alone, by a new run
            shutil.rmtree(self._prepared, ignore_errors=True)
            self._prepared = None
        for directory in self._made if made is None else made:
            if not directory.is_dir() or any(directory.iterdir()):
                break
            directory.rmdir()

    def on_main(self, work: Callable[[], T]) -> T:
        """``work()`` on rank 0 only, its result on every rank. Whatever it raises (not
        only a library error: an OSError, a bug) is raised on every rank, so that each exits
        with rank 0's message instead of waiting for a result that never comes. A fence
        too: no rank goes on before rank 0 is done."""
        result: Any = None
        error: BaseException | None = None
        if self.world.is_main:
            try:
                result = work()
            except Exception as e:
                if self.world.size == 1:
                    raise
                error = e
        sent = self.world.broadcast((result, None if error is None else portable(error)))
        if error is not None:
            raise error  # rank 0: its own, with its traceback
        if sent[1] is not None:
            raise sent[1]
        return sent[0]

    def on_every_rank(self, work: Callable[[], T]) -> T:
        """``work()`` on every rank; if it raises on any rank, the first such rank's error
        is raised on every rank (none goes on alone into a collective)."""
        result: Any = None
        error: BaseException | None = None
        try:
            result = work()
        except Exception as e:
            if self.world.size == 1:
                raise
            error = e
        if self.world.size > 1:
            errors = self.world.gather([None if error is None else portable(error)])
            first = next((e for e in errors or [] if e is not None), None)
            first = self.world.broadcast(first)
            if error is not None:
                raise error
            if first is not None:
                raise first
        return result

    def previous_state(
        self, resume: bool | str, device: str | torch.device = "cpu", recipe: Recipe | None = None
    ) -> dict | None:
        """The state to resume from (None for a new run); refuses to overwrite a run.
        ``resume="auto"``: resume if there is a checkpoint. Rank 0 decides; then every rank
        reads the checkpoint itself, mapped to its ``device`` (no rank receives the
        optimizer state from another). With ``recipe``, refuses a recipe whose settings
        resuming would ignore (:func:`check_resume`)."""
        path = self.on_main(lambda: self._resume_path(resume))
        if path is None:
            return None

        def load() -> dict:
            if not path.is_file():
                raise CheckpointError(f"{path}: rank {self.world.rank} cannot read it; {SHARED}")
            state = load_checkpoint(path, map_location=device)
            if missing := [k for k in ("optimizer", "schedule", "step") if k not in state]:
                raise CheckpointError(  # an averaged or exported file put in its place
                    f"{path}: holds no training state to resume ({', '.join(missing)} "
                    "missing): weights only, as an averaged checkpoint holds"
                )
            if recipe is not None:
                check_resume(recipe, state, str(path), start=self.world.is_main)
            return state

        return self.on_every_rank(load)

    def _resume_path(self, resume: bool | str) -> Path | None:
        last = self.out_dir / LAST
        remove_stale_temp_files(self.out_dir)
        if last.is_symlink() and not last.exists():  # neither a run to resume nor no run
            raise CheckpointError(
                f"{last}: a broken link to {os.readlink(last)}; restore what it points to "
                "(to resume) or remove it"
            )
        if last.is_dir():
            raise CheckpointError(f"{last}: a folder, not a checkpoint; move it away")
        if resume == "auto":
            resume = last.is_file()
        if resume:
            if not last.is_file():
                raise CheckpointError(f"nothing to resume: {last} does not exist")
            check_writable(self.out_dir)  # before the updates its first save would lose
            return last
        if last.exists():
            raise CheckpointError(
                f"{self.out_dir} already holds a training run ({LAST}); resume it or train "
                "into another directory"
            )
        # A run stopped before its first checkpoint_last.pt (or whose last was deleted)
        # can still have saved its best, epoch or timed checkpoints: a new run would
        # overwrite them. Only a folder with none of them is a failed run to replace.
        kept = sorted(p.name for p in self.out_dir.glob("checkpoint*.pt"))
        if kept:
            raise CheckpointError(
                f"{self.out_dir} holds checkpoints of an earlier run ({', '.join(kept[:3])}"
                f"{', ...' if len(kept) > 3 else ''}) but no {LAST} to resume from; train "
                "into another directory, or move them away first"
            )
        check_new_run_folder(self.out_dir)  # nothing but what such a run leaves
        return None

    def new_run(self, r: Recipe, device: torch.device | None = None) -> dict | None:
        """For a new run: the state of the model it starts from (``init_from``; see
        :meth:`init_state`), or None; the recipe's model fields are checked either way
        (:func:`check_new_model`, against the memory of ``device``), before anything is
        written."""
        init = self.init_state(r) if r.init_from else None
        check_new_model(r, init, device)
        return init

    def init_state(self, r: Recipe) -> dict:
        """The checkpoint ``r.init_from`` names (its model, config, tokenizer and the
        settings it carries), read by rank 0 and sent to all; ``path`` is added."""

        def read() -> dict:
            model_dir, which = split_model_spec(r.init_from)
            path = resolve_checkpoint(model_dir, which)
            state = load_checkpoint(path, map_location="cpu")
            if "tokenizer" not in state:
                raise CheckpointError(f"{path}: checkpoint holds no tokenizer")
            check_vocab(state, Tokenizer.from_bytes(state["tokenizer"]), path, "its tokenizer")
            keep = ("model", "config", "tokenizer", "generation", "origin")
            return {**{k: state[k] for k in keep if k in state}, "path": str(path)}

        return self.on_main(read)

    def prepared_data(
        self,
        r: Recipe,
        state: dict | None,
        tokenizer: Tokenizer | None = None,
        progress: bool = True,
    ) -> PreparedData:
        """The recipe's prepared directory, or the raw text prepared into the run's
        ``data/`` (kept for --resume, made again for a new run; by rank 0 while the other
        ranks wait, logging its steps, and showing its progress when ``progress``),
        encoded with ``tokenizer`` when given (that of the model a run starts from), else
        with a joint tokenizer trained on it."""
        if r.data:
            directory = Path(r.data)
        else:
            directory = self.out_dir / "data"
            empty = [k for k in TEXT_FIELDS if not getattr(r, k)]
            if r.dataset and empty:  # fetched (when the cache lacks it) by rank 0 alone
                named = self.on_main(  # training reads no test set: none is fetched
                    lambda: pair_files(r.dataset, roles=("train", "valid"), log=self.log)
                )
                for key in empty:
                    setattr(r, key, str(named[key]))

            def make() -> None:
                if state is not None and (directory / MANIFEST).is_file():
                    return same_text(r, directory)  # resuming: the run's own prepared data
                if (directory / MANIFEST).is_file():  # from a run that never saved, if ours
                    check_replaced_data(r, self.out_dir, directory)
                    shutil.rmtree(directory)
                # A large corpus takes minutes: say what is being done, and show how far.
                self.log(f"preparing the text into {directory}")
                prepare(
                    (r.train_src, r.train_tgt), (r.valid_src, r.valid_tgt), directory,
                    vocab_size=r.vocab_size, model_type=r.spm_model_type,
                    max_len_words=r.max_len_words, log=self.log, show_progress=progress,
                    tokenizer=tokenizer,
                )  # fmt: skip
                self._prepared = None if state else directory  # see discard_new_data

            self.write(make)

        def read() -> PreparedData:
            if not r.data and not directory.is_dir():  # rank 0 made it: not on this machine
                raise CorpusError(f"{directory}: rank {self.world.rank} cannot see it; {SHARED}")
            return PreparedData(directory)

        data = self.on_every_rank(read)
        self._same_data_everywhere(data)
        self.log(f"train: {data.summary('train')}")
        self.log(f"valid: {data.summary('valid')}")
        return data

    def _same_data_everywhere(self, data: PreparedData) -> None:
        """CorpusError on every rank when a rank's prepared data (its machine's copy at the
        path) is not rank 0's: each rank plans the epoch from its own copy, so copies that
        differ would skip some pairs and repeat others, or leave ranks in collectives that
        never match. Compared: the tokenizer, the token counts and the texts' sha256."""
        if self.world.size == 1:
            return
        mine = data_print(data)
        prints = self.world.gather([mine])
        other = next((r for r, p in enumerate(prints or []) if p != mine), None)
        other = self.world.broadcast(other)
        if other is not None:
            raise CorpusError(
                f"{data.directory}: rank {other} has other prepared data than rank 0 "
                "(another tokenizer, corpus or token count); every process must read the "
                "same data: one shared directory, or identical copies on each machine"
            )

    def tokenizer(
        self, data: PreparedData, state: dict | None, init: dict | None = None
    ) -> Tokenizer:
        """The run's tokenizer: the checkpoint's when resuming, else that of the model the
        run starts from (``init``), else the data's; the first two must be the one the
        data was encoded with (:meth:`save_run_files` writes its files for a new run)."""
        source = state if state is not None else init
        if source is not None:
            path = self.out_dir / LAST if state is not None else Path(source["path"])
            tokenizer = Tokenizer.from_bytes(source["tokenizer"])
            check_vocab(source, tokenizer, path, "its tokenizer")
            check_tokenizer(data.manifest, data.directory, source["tokenizer"], str(path))
        else:
            tokenizer = data.tokenizer
        self.log(f"tokenizer: {tokenizer.describe()}")
        return tokenizer

    def save_run_files(
        self, r: Recipe, state: dict | None, cfg: TransformerConfig, tokenizer: Tokenizer
    ) -> None:
        """A new run writes its tokenizer's files and its recipe, once its model config is
        known to be good (nothing overwritten for a run refused before), and drops the logs
        of a run it replaces (one that saved no checkpoint); one that starts from a model
        (``init_from``) writes the model fields it really has (the starting model's), not
        the recipe defaults. A resumed run writes its recipe alone: the one it goes on
        with, overrides (a larger ``max_steps``) included, so that it resumes the run."""
        if r.init_from:
            skip = {"src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"}
            r.model = {k: v for k, v in cfg.to_dict().items() if k not in skip}

        def save() -> None:
            # The recipe first: a folder a run left, however far it got, is known for one
            # by its recipe.yaml (see check_new_run_folder).
            what = "recipe.yaml"
            try:  # a full disk: one line naming the file, not an OSError from pathlib
                r.save(self.out_dir / "recipe.yaml")
                what = "the tokenizer's files"
                if state is None:
                    tokenizer.save(self.out_dir)
            except OSError as e:
                raise AiaynError(
                    f"{self.out_dir}: cannot write {what} ({e.strerror or e})"
                ) from None
            if state is None:
                # The logs of the run being replaced (one that saved no checkpoint: checked
                # by _resume_path to hold nothing else) would mix with this run's.
                (self.out_dir / "metrics.jsonl").unlink(missing_ok=True)
                shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)

        self.write(save)
        self._prepared = None  # the run's own data/ from here: kept whatever comes
