"""Dynamic batching across requests: one worker thread owns the model.

Requests put a :class:`Job` (their sentences' token ids and decoding settings) on a
queue and await an asyncio future. The worker takes the oldest job, adds every queued job
with the same settings while the batch stays within a padded-token budget, waits up to a
short window for more when there is room, translates the batch in one length-sorted pass
and hands each job exactly its own results. If the model raises, every job of that batch
gets the exception: nothing is left waiting. The event loop never runs model code.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiayn.errors import AiaynError
from aiayn.serve.metrics import Metrics
from aiayn.translator import AttentionMap, Translator


class QueueFullError(AiaynError):
    """The queue holds as many sentences as allowed; the client should retry later."""


class StoppedError(AiaynError):
    """The worker is shutting down and takes no new work."""


@dataclass(frozen=True)
class Settings:
    """Decoding settings; only jobs with equal settings share a batch."""

    beam: int = 4
    alpha: float = 0.6
    n_best: int = 1


@dataclass
class Result:
    """One job's outputs: per sentence its n-best ids, and attention maps when asked."""

    ids: list[list[list[int]]]
    attention: list[AttentionMap | None] | None = None


@dataclass
class Job:
    src: list[list[int]]  # token ids per sentence; [] for a blank line
    settings: Settings
    attention: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.src), default=0)

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        """Complete the future from the worker thread (futures are not thread-safe)."""

        def complete() -> None:
            if self.future.done():  # the client went away and the request was cancelled
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(complete)


class BatchWorker:
    """The thread that owns the model. ``max_batch_tokens`` bounds a batch's padded size
    (sentences x longest source); a job over the budget runs alone, so a budget of 1
    means one request per batch. ``batch_wait_ms`` is how long to wait for more jobs when
    the batch has room; ``max_queue`` bounds the sentences waiting."""

    def __init__(
        self,
        translator: Translator,
        metrics: Metrics,
        max_batch_tokens: int = 4096,
        batch_wait_ms: float = 5.0,
        max_queue: int = 1024,
    ):
        if max_batch_tokens < 1 or batch_wait_ms < 0 or max_queue < 1:
            raise AiaynError(
                "batching needs max_batch_tokens >= 1, batch_wait_ms >= 0 and max_queue >= 1"
            )
        self.translator, self.metrics = translator, metrics
        self.max_batch_tokens, self.max_queue = max_batch_tokens, max_queue
        self.wait_s = batch_wait_ms / 1000.0
        self._queue: deque[Job] = deque()
        self._queued_sentences = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="aiayn-batch-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish the queued jobs, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        """Queue ``job`` (called on the event loop; takes the lock only briefly)."""
        n = len(job.src)
        with self._cond:
            if self._stopping:
                raise StoppedError("the server is shutting down")
            if self._queued_sentences + n > self.max_queue:
                raise QueueFullError(
                    f"the queue is full ({self._queued_sentences} sentences waiting, "
                    f"at most {self.max_queue})"
                )
            self._queue.append(job)
            self._queued_sentences += n
            self.metrics.set_queue(self._queued_sentences)
            self._cond.notify()

    # -- the worker thread -------------------------------------------------------------
    def _take(self, job: Job) -> None:
        self._queue.remove(job)
        self._queued_sentences -= len(job.src)

    def _next_batch(self) -> list[Job]:
        """Block for the oldest job, then gather compatible ones (see the class)."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return []  # stopping and drained
            first = self._queue[0]
            self._take(first)
            batch, rows, longest = [first], len(first.src), first.longest
            deadline = time.perf_counter() + self.wait_s
            full = False
            while not full:
                for job in list(self._queue):
                    if job.settings != first.settings or job.attention != first.attention:
                        continue
                    grow = max(longest, job.longest)
                    if (rows + len(job.src)) * grow > self.max_batch_tokens:
                        full = True  # keep arrival order: no smaller job jumps ahead
                        break
                    self._take(job)
                    batch.append(job)
                    rows, longest = rows + len(job.src), grow
                left = deadline - time.perf_counter()
                if full or left <= 0 or self._stopping:
                    break
                self._cond.wait(left)
            self.metrics.set_queue(self._queued_sentences)
        return [job for job in batch if not job.future.cancelled()]

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                with self._cond:
                    if self._stopping and not self._queue:
                        return
                continue
            self._translate(batch)

    def _translate(self, batch: list[Job]) -> None:
        rows = [src for job in batch for src in job.src]
        s = batch[0].settings
        try:
            outputs = self.translator.translate_ids(
                rows, s.beam, s.alpha, s.n_best, batch_size=max(len(rows), 1)
            )
            maps = None
            if batch[0].attention:
                real = [i for i, src in enumerate(rows) if src]
                found = self.translator.attention_maps(
                    [rows[i] for i in real], [outputs[i][0] if outputs[i] else [] for i in real]
                )
                maps = [None] * len(rows)
                for i, amap in zip(real, found):
                    maps[i] = amap
        except Exception as e:  # every waiting request gets it; the worker carries on
            self.metrics.batch_done(len(rows), ok=False)
            for job in batch:
                job.resolve(error=e)
            return
        self.metrics.batch_done(len(rows), ok=True)
        start = 0
        for job in batch:
            end = start + len(job.src)
            job.resolve(Result(outputs[start:end], maps[start:end] if maps else None))
            start = end
