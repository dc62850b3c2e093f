"""A training run's directory: what a new or resumed run finds there and writes first.

On several processes rank 0 alone writes it and decides what it holds (a new run, or one
to resume), and an error it meets, of any kind, is raised on every rank: none is left
waiting for a result that never comes. To resume, every rank reads the checkpoint itself,
onto its own device (so several machines need the run directory at the same path: a
shared file system).
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from aiayn.checkpoint import LAST, check_vocab, load_checkpoint, remove_stale_temp_files
from aiayn.data import Tokenizer
from aiayn.data.prepared import prepare
from aiayn.data.shards import MANIFEST, PreparedData, check_tokenizer
from aiayn.distributed import World
from aiayn.errors import CheckpointError
from aiayn.train.recipe import Recipe

T = TypeVar("T")


def portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (to be sent to the other ranks), else a
    RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class RunDirectory:
    """``out_dir`` of one run, as seen from this process of ``world``."""

    def __init__(self, out_dir: Path, world: World, log: Callable[[str], None]):
        self.out_dir, self.world, self.log = out_dir, world, log
        self.on_main(lambda: out_dir.mkdir(parents=True, exist_ok=True))

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

    def previous_state(self, resume: bool | str, device: str | torch.device = "cpu") -> dict | None:
        """The state to resume from (None for a new run); refuses to overwrite a run.
        ``resume="auto"``: resume if there is a checkpoint. Rank 0 decides; then every rank
        reads the checkpoint itself, mapped to its ``device`` (no rank receives the
        optimizer state from another)."""
        path = self.on_main(lambda: self._resume_path(resume))
        if path is None:
            return None

        def load() -> dict:
            if not path.is_file():
                raise CheckpointError(
                    f"{path}: rank {self.world.rank} cannot read it; to resume on several "
                    "machines, the run directory must be at the same path on each (a shared "
                    "file system)"
                )
            return load_checkpoint(path, map_location=device)

        return self.on_every_rank(load)

    def _resume_path(self, resume: bool | str) -> Path | None:
        last = self.out_dir / LAST
        remove_stale_temp_files(self.out_dir)
        if resume == "auto":
            resume = last.is_file()
        if resume:
            if not last.is_file():
                raise CheckpointError(f"nothing to resume: {last} does not exist")
            return last
        if last.exists():
            raise CheckpointError(
                f"{self.out_dir} already holds a training run ({LAST}); resume it or train "
                "into another directory"
            )
        return None

    def prepared_data(self, r: Recipe, state: dict | None) -> PreparedData:
        """The recipe's prepared directory, or the raw text prepared into the run's
        ``data/`` (kept for --resume, made again for a new run; by rank 0 while the other
        ranks wait)."""
        if r.data:
            directory = Path(r.data)
        else:
            directory = self.out_dir / "data"

            def make() -> None:
                if state is not None and (directory / MANIFEST).is_file():
                    return  # resuming: the run's own prepared data
                if (directory / MANIFEST).is_file():  # ours, from a run that never saved
                    shutil.rmtree(directory)
                prepare(
                    (r.train_src, r.train_tgt), (r.valid_src, r.valid_tgt), directory,
                    vocab_size=r.vocab_size, model_type=r.spm_model_type,
                    max_len_words=r.max_len_words, log=lambda _: None, show_progress=False,
                )  # fmt: skip

            self.on_main(make)
        data = self.on_every_rank(lambda: PreparedData(directory))
        self.log(f"train: {data.summary('train')}")
        self.log(f"valid: {data.summary('valid')}")
        return data

    def tokenizer(self, r: Recipe, data: PreparedData, state: dict | None) -> Tokenizer:
        """The run's tokenizer: the checkpoint's when resuming (which must be the one the
        data was encoded with), else the data's (copied beside the recipe)."""
        if state is not None:
            tokenizer = Tokenizer.from_bytes(state["tokenizer"])
            check_vocab(state, tokenizer.vocab_size, self.out_dir / LAST, "its tokenizer")
            check_tokenizer(
                data.manifest,
                data.directory,
                state["tokenizer"],
                str(self.out_dir / LAST),
            )
        else:
            tokenizer = data.tokenizer

            def write() -> None:
                (self.out_dir / "spm.model").write_bytes(data.spm_bytes)
                r.save(self.out_dir / "recipe.yaml")

            self.on_main(write)
        self.log(f"tokenizer: {tokenizer.vocab_size} joint tokens")
        return tokenizer
