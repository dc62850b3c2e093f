"""A training run's directory: what a new or resumed run finds there and writes first.

On several processes rank 0 alone reads and writes it (the others may be on machines that
do not see it) and sends what it found to the others; an error it meets is raised on every
rank, so none is left waiting.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from aiayn.checkpoint import LAST, check_vocab, load_checkpoint, remove_stale_temp_files
from aiayn.data import Tokenizer
from aiayn.data.prepared import prepare
from aiayn.data.shards import MANIFEST, PreparedData, check_tokenizer
from aiayn.distributed import World
from aiayn.errors import AiaynError, CheckpointError
from aiayn.train.recipe import Recipe

T = TypeVar("T")


class RunDirectory:
    """``out_dir`` of one run, as seen from this process of ``world``."""

    def __init__(self, out_dir: Path, world: World, log: Callable[[str], None]):
        self.out_dir, self.world, self.log = out_dir, world, log
        if world.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)

    def on_main(self, work: Callable[[], T]) -> T:
        """``work()`` on rank 0 only, its result on every rank; an error it raises is raised
        on every rank (instead of leaving the others waiting for a result)."""
        result, error = None, None
        if self.world.is_main:
            try:
                result = work()
            except AiaynError as e:
                if self.world.size == 1:
                    raise
                error = e
        result, error = self.world.broadcast((result, error))
        if error is not None:
            raise error
        return result

    def previous_state(self, resume: bool | str) -> dict | None:
        """The state to resume from (None for a new run), read by rank 0 and sent to all;
        refuses to overwrite a run. ``resume="auto"``: resume if there is a checkpoint."""
        return self.on_main(lambda: self._previous_state(resume))

    def _previous_state(self, resume: bool | str) -> dict | None:
        last = self.out_dir / LAST
        remove_stale_temp_files(self.out_dir)
        if resume == "auto":
            resume = last.is_file()
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
        data = PreparedData(directory)
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
            if self.world.is_main:
                (self.out_dir / "spm.model").write_bytes(data.spm_bytes)
                r.save(self.out_dir / "recipe.yaml")
        self.log(f"tokenizer: {tokenizer.vocab_size} joint tokens")
        return tokenizer
