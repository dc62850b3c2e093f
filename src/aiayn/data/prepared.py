"""`aiayn prepare`: parallel text of any size -> a prepared directory (:mod:`.shards`).

The text is streamed (constant memory), validated as it goes, the joint SentencePiece
model is trained on a seeded sample of a fixed number of pairs (or given), and the pairs
are encoded in worker processes, in order, straight into the token files. Everything is
written into a temporary directory beside the output and renamed at the end: a prepare
that is killed leaves no half-valid dataset, and the next run removes its leftovers. A
prepare holds its output while it writes it: a second one into it is refused.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import re
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.data.corpus import PairCounts, clean_pair, cr_note, iter_line_pairs
from aiayn.data.folders import held_output, staged_folder, staged_leftovers
from aiayn.data.shards import (
    FORMAT,
    INPUTS,
    MANIFEST,
    SplitWriter,
    sha256_file,
    token_dtype,
)
from aiayn.data.tokenizer import Tokenizer
from aiayn.distributed import exit_if_bootstrapping
from aiayn.errors import AiaynError, CorpusError, TokenizerError
from aiayn.progress import progress

# Pairs the tokenizer is trained on, at most (1M sentences): SentencePiece's memory and
# time grow with its input, and a million sentences are plenty for a joint vocabulary.
SPM_SAMPLE_PAIRS = 500_000
CHUNK_PAIRS = 20_000  # pairs per task sent to an encoding worker
SPECIAL = ("pad", "bos", "eos", "unk")  # the tokens every vocabulary starts with (ids 0-3)


def sample_pairs(pairs: Iterator[tuple[str, str]], k: int, seed: int) -> list[tuple[str, str]]:
    """A uniform random sample of ``k`` pairs in stream order (reservoir sampling, Vitter's
    algorithm R): memory is ``k`` pairs whatever the corpus. All of them, in order, when
    there are at most ``k``."""
    rng = random.Random(seed)
    chosen: list[tuple[int, tuple[str, str]]] = []
    for n, pair in enumerate(pairs):
        if n < k:
            chosen.append((n, pair))
        else:
            j = rng.randrange(n + 1)
            if j < k:
                chosen[j] = (n, pair)
    return [pair for _, pair in sorted(chosen, key=lambda c: c[0])]


def chunks(pairs: Iterator[tuple[str, str]], size: int) -> Iterator[tuple[list[str], list[str]]]:
    """Consecutive (sources, targets) lists of up to ``size`` pairs."""
    while block := list(islice(pairs, size)):
        yield [s for s, _ in block], [t for _, t in block]


_worker_tokenizer: Tokenizer | None = None  # one per encoding process


def _init_worker(model: bytes) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.from_bytes(model)


Encoded = tuple[list[tuple[np.ndarray, np.ndarray]], PairCounts, tuple[list[str], list[str]]]


def _encode_chunk(
    chunk: tuple[list[str], list[str]], dtype: np.dtype, max_len_words: int | None, text: bool
) -> Encoded:
    """Clean (normalise, drop and count) and encode the raw line pairs of ``chunk``:
    (ids back to back, lengths) per side, the counts, and the kept text if ``text``. The
    workers do the per-pair work; numpy arrays travel back as a few buffers, not as
    millions of Python ints."""
    assert _worker_tokenizer is not None
    counts = PairCounts()
    kept = [p for p in (clean_pair(s, t, max_len_words, counts) for s, t in zip(*chunk)) if p]
    sides = [s for s, _ in kept], [t for _, t in kept]
    encoders = _worker_tokenizer.encode_batch, _worker_tokenizer.encode_target_batch
    # One thread per worker: the workers are the parallelism.
    encoded = [encode(texts, num_threads=1) for texts, encode in zip(sides, encoders)]
    # A side that SentencePiece's normaliser leaves no token of (U+200B alone) is empty too.
    eos = _worker_tokenizer.eos_id
    keep = [i for i, pair in enumerate(zip(*encoded)) if all(set(ids) - {eos} for ids in pair)]
    if len(keep) < len(kept):
        counts.dropped_empty, counts.kept = counts.dropped_empty + len(kept) - len(keep), len(keep)
        encoded = [[side[i] for i in keep] for side in encoded]
        sides = [sides[0][i] for i in keep], [sides[1][i] for i in keep]
    out = []
    for ids in encoded:
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
        out.append((tokens, lengths))
    return out, counts, (sides if text else ([], []))


def _pool_context() -> multiprocessing.context.BaseContext:
    """Where the encoding processes come from: a fork server where there is one, else
    spawn. Not a fork of this process: it may have threads (a progress bar's monitor, a
    test runner's, torch's), and a fork copies the locks they hold, so a child could wait
    forever on one (a prepare under two test workers hung so)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # imported once, by the server
    return context


def encode_split(
    pairs: Iterator[tuple[str, str]],
    writer: SplitWriter,
    spm_bytes: bytes,
    workers: int,
    max_len_words: int | None = None,
    chunk_pairs: int = CHUNK_PAIRS,
    show_progress: bool = True,
) -> tuple[PairCounts, tuple[list[str], list[str]]]:
    """Clean and encode the raw line ``pairs`` into ``writer``, in their order, with
    ``workers`` processes (1: in this one); returns the counts and, for a validation split
    (``writer.split == "valid"``), the kept text. At most two chunks per worker are in
    flight, so memory stays flat whatever the corpus."""
    counts = PairCounts()
    texts: tuple[list[str], list[str]] = ([], [])
    bar = progress(desc=writer.split, unit="pairs", disable=not show_progress)

    def write(result: Encoded) -> None:
        arrays, chunk_counts, chunk_texts = result
        for side, (tokens, lengths) in zip(("src", "tgt"), arrays):
            writer.write(side, tokens, lengths)
        nonlocal counts
        counts += chunk_counts
        texts[0].extend(chunk_texts[0])
        texts[1].extend(chunk_texts[1])
        bar.update(chunk_counts.lines)

    args = (writer.dtype, max_len_words, writer.split == "valid")
    if workers <= 1:
        _init_worker(spm_bytes)
        for chunk in chunks(pairs, chunk_pairs):
            write(_encode_chunk(chunk, *args))
    else:
        pool = ProcessPoolExecutor(workers, _pool_context(), _init_worker, (spm_bytes,))
        try:
            with pool:
                pending: deque = deque()
                for chunk in chunks(pairs, chunk_pairs):
                    pending.append(pool.submit(_encode_chunk, chunk, *args))
                    while pending and (len(pending) > 2 * workers or pending[0].done()):
                        write(pending.popleft().result())
                while pending:
                    write(pending.popleft().result())
        except (BrokenProcessPool, BrokenPipeError):  # not a Pool, which starts dead ones again
            raise AiaynError(
                "prepare: its encoding processes died (each imports the script that called "
                'prepare: call it under `if __name__ == "__main__":`; or out of memory)'
            ) from None
    bar.close()
    return counts, texts


def prepare(
    train: tuple[str | Path, str | Path],
    valid: tuple[str | Path, str | Path],
    out: str | Path,
    vocab_size: int = 8000,
    spm_model: str | Path | None = None,
    model_type: str = "bpe",
    max_len_words: int | None = 100,
    workers: int = 1,
    sample: int = SPM_SAMPLE_PAIRS,
    seed: int = 1,
    chunk_pairs: int = CHUNK_PAIRS,
    log: Callable[[str], Any] = print,
    show_progress: bool = True,
    tokenizer: Tokenizer | None = None,
) -> dict[str, Any]:
    """Prepare ``train`` and ``valid`` (source path, target path) into the directory
    ``out`` and return its manifest.

    Training pairs with an empty side or a side over ``max_len_words`` words are dropped
    (validation pairs only when empty), and counted. The tokenizer is ``tokenizer``, or
    the one ``spm_model`` holds (a SentencePiece model, a tokenizer file or a model
    directory: :meth:`Tokenizer.load`), or a joint one of ``vocab_size`` trained on
    ``sample`` pairs drawn with ``seed``.
    Raises CorpusError (file and line) for unusable text, and when ``out`` exists;
    AiaynError naming ``out`` when its files cannot be written (a full disk), and when
    another prepare is writing it (the second is refused; the first goes on). With
    several ``workers`` each encoding process imports the calling script: call prepare
    under ``if __name__ == "__main__":`` there (else it exits, saying so).
    """
    exit_if_bootstrapping(  # in an encoding process importing an unguarded script
        "aiayn: prepare ran again in its encoding process: call it under `if __name__ == "
        '"__main__":` (each encoding process imports the script that called it)'
    )
    out = Path(out)
    for name, value in (("workers", workers), ("sample", sample), ("chunk_pairs", chunk_pairs)):
        if value < 1:
            raise AiaynError(f"prepare: {name} must be at least 1, got {value}")
    if max_len_words is not None and max_len_words < 0:
        raise AiaynError(f"prepare: max_len_words must be >= 0 (0: no limit), got {max_len_words}")
    if tokenizer is None and spm_model is None and vocab_size <= len(SPECIAL):
        raise AiaynError(
            f"prepare: vocab_size must be more than the {len(SPECIAL)} special tokens "
            f"({', '.join(SPECIAL)}), got {vocab_size}"
        )
    _check_new(out)  # before anything is written
    _check_valid(*valid)  # before the work on the training text, which may take hours
    busy = f"another prepare is writing {out}; let it finish, or prepare into another directory"
    with held_output(out, busy):
        _check_new(out)  # again: a prepare that held it until now may have written it
        # No other prepare is writing ``out`` while we hold it: these are a killed one's.
        for stale in staged_leftovers(out):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            with staged_folder(out, what="the prepared data") as tmp:
                if tokenizer is None and spm_model is not None:
                    tokenizer = Tokenizer.load(spm_model)
                manifest = _prepare_into(
                    tmp, train, valid, vocab_size, tokenizer, spm_model, model_type,
                    max_len_words, workers, sample, seed, chunk_pairs, log, show_progress,
                )  # fmt: skip
        except OSError as e:  # writing the files (a full disk); the text's are CorpusErrors
            why = e.strerror or e
            raise AiaynError(f"{out}: cannot write the prepared data ({why})") from None
    log(f"prepared {out}")
    return manifest


def _check_valid(src: str | Path, tgt: str | Path) -> None:
    """CorpusError (file and line) unless the validation text is usable (it is read
    again, and encoded, after the training text)."""
    counts = PairCounts()
    for s, t in iter_line_pairs(src, tgt):
        clean_pair(s, t, None, counts)
    counts.check(src, tgt)


def _check_new(out: Path) -> None:
    """CorpusError unless ``out`` is missing or an empty folder (nothing in it is lost)."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise CorpusError(f"{out} already exists; remove it or prepare into a new directory")


def _train_tokenizer(
    pairs: list[tuple[str, str]], prefix: Path, vocab_size: int, model_type: str
) -> Tokenizer:
    """The joint tokenizer of ``pairs``; a vocabulary too small for their characters is a
    TokenizerError that says how large it must be (SentencePiece's own text names its
    source file and an option aiayn does not have)."""
    try:  # its default threads, not ``workers``: the model file records the thread count
        return Tokenizer.train(
            [s for s, _ in pairs] + [t for _, t in pairs], prefix, vocab_size, model_type
        )
    except TokenizerError as e:
        need = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
        if need is None:
            raise
        raise TokenizerError(
            f"prepare: vocab_size {vocab_size} is too small: the characters of the training "
            f"text and the {len(SPECIAL)} special tokens need at least {need[1]}"
        ) from None


def _prepare_into(
    tmp: Path,
    train: tuple[str | Path, str | Path],
    valid: tuple[str | Path, str | Path],
    vocab_size: int,
    tokenizer: Tokenizer | None,
    spm_model: str | Path | None,
    model_type: str,
    max_len_words: int | None,
    workers: int,
    sample: int,
    seed: int,
    chunk_pairs: int,
    log: Callable[[str], Any],
    show_progress: bool,
) -> dict[str, Any]:
    start = time.perf_counter()
    if tokenizer is not None:
        (tmp / tokenizer.file_name).write_bytes(tokenizer.to_bytes())
        trained: dict[str, Any] = {"from": str(spm_model or "given")}
    else:
        # Pass 1 over the training text: line counts and UTF-8 checked, a sample of raw
        # pairs drawn; only the sample is cleaned here (the workers clean the rest).
        pairs = progress(
            iter_line_pairs(*train), desc="sample", unit="pairs", disable=not show_progress
        )
        chosen: list = sample_pairs(iter(pairs), sample, seed)
        whole = len(chosen) < sample  # the corpus is smaller than the sample
        counts = PairCounts()
        for i, (s, t) in enumerate(chosen):  # in place: the raw lines go as they are cleaned
            chosen[i] = clean_pair(s, t, max_len_words, counts)
        chosen = [p for p in chosen if p is not None]
        if not chosen and not whole:  # a sample of unusable pairs only: the rest may not be
            counts = PairCounts()
            usable = (clean_pair(s, t, max_len_words, counts) for s, t in iter_line_pairs(*train))
            chosen = sample_pairs((p for p in usable if p is not None), sample, seed)
        counts.check(*train)
        tokenizer = _train_tokenizer(chosen, tmp / "spm", vocab_size, model_type)
        del chosen
        trained = {"vocab_size": vocab_size, "model_type": model_type, "sample_pairs": sample}
        trained["seed"] = seed
        fewer = tokenizer.vocab_size < vocab_size  # SentencePiece's ceiling on a small text
        asked = f"; vocab_size {vocab_size} asked, the text holds no more" if fewer else ""
        took = time.perf_counter() - start
        log(f"tokenizer: {tokenizer.vocab_size} joint tokens{asked} ({took:.0f} s)")
    spm_bytes = tokenizer.to_bytes()
    dtype = token_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    splits: dict[str, dict[str, int]] = {}
    for split, (src, tgt), limit in (("train", train, max_len_words), ("valid", valid, None)):
        writer = SplitWriter(tmp, split, dtype)
        try:
            counts, texts = encode_split(
                iter_line_pairs(src, tgt), writer, spm_bytes, workers, limit, chunk_pairs,
                show_progress,
            )  # fmt: skip
        except BaseException:
            writer.discard()
            raise
        counts.check(src, tgt)
        splits[split] = writer.close()
        splits[split].update(
            lines=counts.lines, dropped_empty=counts.dropped_empty, dropped_long=counts.dropped_long
        )
        if split == "valid":  # also kept as text: the references of validation BLEU
            for side, lines in zip(("src", "tgt"), texts):
                (tmp / f"valid.{side}.txt").write_text("".join(t + "\n" for t in lines), "utf-8")
        n = splits[split]
        log(
            f"{split}: {n['pairs']} pairs of {n['lines']} lines, {n['src_tokens']} + "
            f"{n['tgt_tokens']} tokens ({n['dropped_empty']} empty, {n['dropped_long']} long "
            f"dropped){cr_note(counts.with_cr)}"
        )
    inputs = {
        name: {
            "path": str(Path(p).resolve()),
            "sha256": sha256_file(p),
            "bytes": Path(p).stat().st_size,
        }
        for name, p in zip(INPUTS, (*train, *valid))
    }
    manifest = {
        "format": FORMAT,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "spm_model": tokenizer.file_name,
        "spm_sha256": hashlib.sha256(spm_bytes).hexdigest(),
        "tokenizer": trained,
        "max_len_words": max_len_words,
        "splits": splits,
        "inputs": inputs,
        "seconds": round(time.perf_counter() - start, 1),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
