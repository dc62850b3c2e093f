"""Batching across requests: one worker thread owns the model.

Requests put a :class:`Job` (their sentences' token ids and decoding settings) on a queue
and await its reply (an asyncio future, through :func:`future_reply`). The event loop never
runs model code. The server runs this worker in a process of its own by default
(:mod:`aiayn.serve.process`), or in a thread beside the event loop.

Beam search (beam >= 2) is batched *continuously*: the worker runs one
:class:`~aiayn.decode.ContinuousBeamSearch`, and between two decoding steps the queued jobs
with the same beam size join it (within a padded-token budget); a job
gets its results as soon as its last sentence is done, while the others go on. So a new
request never waits for a whole batch to finish, and the batch stays full under steady
load. Each sentence's result is the one the Translator gives it offline.

Greedy requests (beam 1), and every request when continuous batching is off, go the
*whole-batch* way: the worker takes the oldest job, adds the queued jobs with the same
settings within the budget, waits up to a short window for more, translates them in one
length-sorted pass and hands each job its own results.

A queued job that cannot join the running batch (another beam size, or greedy) lets later
jobs join for up to ``join_wait_steps`` steps, then stops admission: the batch drains and
the oldest job starts the next one, so nobody waits for long. If the model raises, every
job of that batch gets the exception: nothing is left waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiayn.data.batching import pad
from aiayn.decode import ContinuousBeamSearch
from aiayn.errors import AiaynError
from aiayn.serve.metrics import Metrics
from aiayn.translator import AttentionMap, Translator


class QueueFullError(AiaynError):
    """The queue holds as many sentences as allowed; the client should retry later."""


class StoppedError(AiaynError):
    """The worker is shutting down and takes no new work."""


@dataclass(frozen=True)
class Settings:
    """Decoding settings; only jobs with equal settings share a whole batch. A continuous
    batch needs an equal beam only: alpha only scores a sentence's finished hypotheses,
    and n_best only picks among them."""

    beam: int = 4
    alpha: float = 0.6
    n_best: int = 1


@dataclass
class Result:
    """One job's outputs: per sentence its n-best ids, and attention maps when asked."""

    ids: list[list[list[int]]]
    attention: list[AttentionMap | None] | None = None


Reply = Callable[[Any, "BaseException | None"], None]


@dataclass(eq=False)  # hashable by identity: its sentences are tagged (job, index)
class Job:
    """One request's work. ``reply(result, error)`` is called exactly once, from a thread
    that is not the event loop's (the worker, or a worker process's pipe reader);
    ``cancelled`` is set when nobody waits for the answer any more."""

    src: list[list[int]]  # token ids per sentence; [] for a blank line
    settings: Settings
    attention: bool
    reply: Reply
    cancelled: bool = False
    queued_step: int = 0  # the continuous batch's step count when it was queued
    ids: list[list[list[int]]] = field(default_factory=list)  # filled in by the worker
    left: int = 0  # sentences still in the continuous batch

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.src), default=0)

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        self.reply(value, error)


def future_reply(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> Reply:
    """A :class:`Job` reply that completes ``future`` on ``loop`` (futures are not
    thread-safe, so the worker thread hands the result to the loop)."""

    def reply(value: Any, error: BaseException | None) -> None:
        def complete() -> None:
            if future.done():  # the client went away and the request was cancelled
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(complete)

    return reply


class BatchWorker:
    """The thread that owns the model. ``max_batch_tokens`` bounds a batch's padded size
    (sentences x longest source; for a continuous batch, those running plus those joining);
    a job over the budget runs alone, so a budget of 1 means one request per batch.
    ``batch_wait_ms`` is how long to wait for more jobs when a batch starts with room;
    ``max_queue`` bounds the sentences waiting; ``continuous=False`` batches whole
    requests only (the scheduler before continuous batching, kept for comparison).

    Joining a running batch costs a copy of its decoder cache, so queued sentences join
    together once they number ``join_ratio`` x the sentences running, or once the oldest
    of them has waited ``join_wait_steps`` decoding steps (as TGI's waiting_served_ratio
    and max_waiting_tokens); an idle worker starts at once."""

    def __init__(
        self,
        translator: Translator,
        metrics: Metrics,
        max_batch_tokens: int = 4096,
        batch_wait_ms: float = 5.0,
        max_queue: int = 1024,
        continuous: bool = True,
        join_ratio: float = 0.25,
        join_wait_steps: int = 8,
    ):
        if max_batch_tokens < 1 or batch_wait_ms < 0 or max_queue < 1:
            raise AiaynError(
                "batching needs max_batch_tokens >= 1, batch_wait_ms >= 0 and max_queue >= 1"
            )
        if not (join_ratio >= 0 and join_wait_steps >= 0):
            raise AiaynError("batching needs join_ratio >= 0 and join_wait_steps >= 0")
        self.translator, self.metrics = translator, metrics
        self.max_batch_tokens, self.max_queue = max_batch_tokens, max_queue
        self.wait_s = batch_wait_ms / 1000.0
        self.continuous = continuous
        self.join_ratio, self.join_wait_steps = join_ratio, join_wait_steps
        self._steps = 0  # decoding steps of continuous batches so far
        self._queue: deque[Job] = deque()
        self._queued_sentences = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="aiayn-batch-worker", daemon=True)
        # The continuous batch (worker thread only): its search and the jobs in it.
        self._search: ContinuousBeamSearch | None = None
        self._search_key: tuple = ()
        self._running: list[Job] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish the queued and running jobs, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def pid(self) -> int:
        """The process the model runs in: this one."""
        return os.getpid()

    async def refresh_metrics(self) -> None:
        """Nothing to do: this worker records straight into the server's metrics (a
        :class:`~aiayn.serve.process.ProcessWorker` fetches them from its process)."""

    def cancel(self, job: Job) -> None:
        """Nobody waits for ``job`` any more: drop it from the queue or the batch."""
        job.cancelled = True  # one store, read by the worker between steps

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
            job.queued_step = self._steps
            self._queue.append(job)
            self._queued_sentences += n
            self.metrics.set_queue(self._queued_sentences)
            self._cond.notify()

    # -- the worker thread: taking jobs off the queue ----------------------------------
    def _key(self, job: Job) -> tuple:
        """Jobs with equal keys may share a batch."""
        s = job.settings
        if self.continuous and s.beam > 1:
            return ("continuous", s.beam)
        return ("whole", s, job.attention)

    def _take(self, job: Job) -> None:
        self._queue.remove(job)
        self._queued_sentences -= len(job.src)
        self.metrics.set_queue(self._queued_sentences)

    def _next_batch(self) -> list[Job]:
        """Block for the oldest job, then gather compatible ones (see the class)."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return []  # stopping and drained
            first = self._queue[0]
            self._take(first)
            key, batch = self._key(first), [first]
            rows, longest = len(first.src), first.longest
            deadline = time.perf_counter() + self.wait_s
            full = False
            while not full:
                for job in list(self._queue):
                    if self._key(job) != key:
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
        return [job for job in batch if not job.cancelled]

    def _admit(self) -> list[Job]:
        """The queued jobs that join the running continuous batch now: from the oldest on,
        those with its beam size while the budget allows; none until enough of them wait
        or the oldest has waited long enough (see the class). Never blocks."""
        running = rows = len(self._search)
        longest, joining = self._search.width, []
        with self._cond:
            for job in list(self._queue):
                if job.cancelled:
                    self._take(job)
                    continue
                if self._key(job) != self._search_key:
                    if self._steps - job.queued_step >= self.join_wait_steps:
                        break  # it has waited enough: let the batch drain, it starts next
                    continue  # it may wait a few steps while later jobs join
                grow = max(longest, job.longest)
                if (rows + len(job.src)) * grow > self.max_batch_tokens:
                    break
                joining.append(job)
                rows, longest = rows + len(job.src), grow
            waited = self._steps - joining[0].queued_step if joining else 0
            if rows - running < self.join_ratio * running and waited < self.join_wait_steps:
                return []
            for job in joining:
                self._take(job)
        return joining

    def _run(self) -> None:
        while True:
            if self._search is not None and self._running:
                self._continue(self._admit())
                continue
            batch = self._next_batch()
            if not batch:
                with self._cond:
                    if self._stopping and not self._queue:
                        return
                continue
            if self._key(batch[0])[0] == "continuous":
                self._continue(batch)
            else:
                self._translate(batch)

    # -- continuous batching -----------------------------------------------------------
    def _continue(self, joining: list[Job]) -> None:
        """Let ``joining`` into the continuous batch, run one decoding step, and answer
        the jobs whose last sentence is done."""
        if joining and not self._running:  # a new batch: its first job sets the beam
            try:
                self._search = self.translator.continuous_search(joining[0].settings.beam)
            except Exception as e:  # these jobs fail; the worker carries on
                self.metrics.batch_failed()
                for job in joining:
                    job.resolve(error=e)
                self._search = None
                return
            self._search_key = self._key(joining[0])
        if joining:
            self._join(joining)
        gone = [job for job in self._running if job.cancelled]
        if gone:  # nobody waits for these any more: stop decoding them
            self._search.remove({(job, i) for job in gone for i in range(len(job.src))})
            self._running = [job for job in self._running if job not in gone]
        running = len(self._search)
        self.metrics.set_running(running)
        if not running:
            return
        try:
            done = self._search.step()
        except Exception as e:  # every job in the batch gets it; the worker carries on
            self.metrics.batch_failed()
            for job in self._running:
                job.resolve(error=e)
            self._running, self._search = [], None
            self.metrics.set_running(0)
            return
        self._steps += 1
        self.metrics.batch_ran(running)
        for (job, i), hypotheses in done:
            job.ids[i] = [h.tokens for h in hypotheses[: job.settings.n_best]]
            job.left -= 1
            if not job.left:
                self._finish(job)
        self._running = [job for job in self._running if job.left]
        self.metrics.set_running(len(self._search))

    def _join(self, joining: list[Job]) -> None:
        """Add the jobs' sentences to the search: one add (one copy of the batch's cache)
        per length penalty among them."""
        for alpha in dict.fromkeys(job.settings.alpha for job in joining):
            jobs = [job for job in joining if job.settings.alpha == alpha]
            rows, tags = [], []
            for job in jobs:
                job.ids = [[] for _ in job.src]  # a blank line gets no candidates
                job.left = sum(1 for src in job.src if src)
                rows += [src for src in job.src if src]
                tags += [(job, i) for i, src in enumerate(job.src) if src]
            try:
                if rows:
                    pad_id = self.translator.model.cfg.pad_id
                    self._search.add(pad(rows, pad_id), tags, alpha)
            except Exception as e:  # the running batch is unchanged: only these jobs fail
                self.metrics.batch_failed()
                for job in jobs:
                    job.resolve(error=e)
                continue
            for job in jobs:
                if job.left:
                    self._running.append(job)
                else:
                    self._finish(job)

    def _finish(self, job: Job) -> None:
        try:
            maps = self._attention(job.src, job.ids) if job.attention else None
        except Exception as e:
            self.metrics.batch_failed()
            job.resolve(error=e)
            return
        self.metrics.sentences_done(len(job.src))
        job.resolve(Result(job.ids, maps))

    def _attention(self, rows: list[list[int]], outputs: list[list[list[int]]]):
        """The attention maps of each row's best output (None for a blank row)."""
        real = [i for i, src in enumerate(rows) if src]
        found = self.translator.attention_maps(
            [rows[i] for i in real], [outputs[i][0] if outputs[i] else [] for i in real]
        )
        maps: list[AttentionMap | None] = [None] * len(rows)
        for i, amap in zip(real, found):
            maps[i] = amap
        return maps

    # -- whole batches -----------------------------------------------------------------
    def _translate(self, batch: list[Job]) -> None:
        rows = [src for job in batch for src in job.src]
        s = batch[0].settings
        try:
            outputs = self.translator.translate_ids(
                rows, beam=s.beam, alpha=s.alpha, n_best=s.n_best, batch_size=max(len(rows), 1)
            )
            maps = self._attention(rows, outputs) if batch[0].attention else None
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
