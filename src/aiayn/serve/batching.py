"""Batching across requests: one worker thread owns the model.

Requests put a :class:`~aiayn.serve.jobs.Job` (their sentences' token ids and decoding
settings) on a queue and await its reply (:func:`~aiayn.serve.jobs.future_reply`); the
event loop never runs model code. The worker runs in a process of its own by default
(:mod:`aiayn.serve.process`), or in a thread beside the event loop.

Every job runs in the one :class:`~aiayn.serve.running.RunningBatch`, stepped by the
engine that decodes offline too, and is answered as soon as its last sentence is done.
Batching is *continuous*: between two decoding steps, queued jobs of the same search
settings join it (within the budgets); with continuous batching off, jobs join only an
empty batch (whole batches, the scheduler before continuous batching, kept for
comparison). Either way each sentence gets what the Translator gives it offline.
Attention maps are made on a thread of their own, so the batch never waits for them.

Every job ends in :meth:`BatchWorker.finish`, whatever the ending; if anything goes wrong
in the worker thread outside a model call, it fails every job it holds and stops, saying
why (:attr:`BatchWorker.failure`): no request is left waiting.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiayn.decode.core import inference
from aiayn.errors import AiaynError
from aiayn.inspect.maps import attention_maps
from aiayn.serve.jobs import (
    CacheBudget,
    Job,
    Outcome,
    QueueFullError,
    Result,
    Status,
    StoppedError,
    TooLargeError,
)
from aiayn.serve.metrics import Metrics
from aiayn.serve.running import Left, Outputs, RunningBatch, best
from aiayn.translator import Translator

# Decoder-cache positions a batch may hold (see CacheBudget): 3 GiB for a base model in
# fp32, 0.6 GiB for the quarter-size Multi30k model (up to twice that for the output
# positions, whose self-attention keys and values are double-buffered).
DEFAULT_CACHE_TOKENS = 1 << 17


class BatchWorker:
    """The thread that owns the model. ``max_batch_tokens`` bounds a batch's padded source
    (sentences x longest source; for a continuous batch, those running plus those joining);
    a job over it runs alone, so a budget of 1 means one request per batch.
    ``max_cache_tokens`` bounds what a batch holds in its decoder cache (see
    :class:`~aiayn.serve.jobs.CacheBudget`): a job that alone is over it is refused at
    :meth:`submit`, so memory stays bounded whatever the beam and lengths.
    ``batch_wait_ms`` is how long to wait for more jobs when a batch starts with room;
    ``max_queue`` bounds the sentences waiting; ``continuous=False`` lets jobs join an
    empty batch only.

    Joining a running batch costs a copy of its decoder cache, so queued sentences join
    together once they number ``join_ratio`` x the sentences running, or once the oldest
    of them has waited ``join_wait_steps`` decoding steps (as TGI's waiting_served_ratio
    and max_waiting_tokens); an idle worker starts at once. ``on_death(reason)`` is
    called if the thread dies (after every job it held has been failed)."""

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
        max_cache_tokens: int = DEFAULT_CACHE_TOKENS,
        on_death: Callable[[str], None] | None = None,
    ):
        if max_batch_tokens < 1 or not 0 <= batch_wait_ms <= 60_000 or max_queue < 1:
            raise AiaynError(  # a NaN or an infinite wait would never start a batch
                "batching needs max_batch_tokens >= 1, batch_wait_ms in [0, 60000] and "
                "max_queue >= 1"
            )
        if not (join_ratio >= 0 and join_wait_steps >= 0):
            raise AiaynError("batching needs join_ratio >= 0 and join_wait_steps >= 0")
        self.translator: Translator | None = translator  # None once stopped
        self.metrics = metrics
        self.budget = CacheBudget.for_translator(max_cache_tokens, translator)
        self.max_batch_tokens, self.max_queue = max_batch_tokens, max_queue
        self.wait_s = batch_wait_ms / 1000.0
        self.continuous = continuous
        self.join_ratio, self.join_wait_steps = join_ratio, join_wait_steps
        self.on_death = on_death
        self.failure: str | None = None  # why the worker thread died
        self._steps = 0  # decoding steps so far
        # Under the lock: the queue (oldest first), every job not ended yet, and the
        # cancellations of running jobs that the worker thread has still to apply.
        self._queue: dict[Job, None] = {}
        self._queued_sentences = 0
        self._jobs: dict[int, Job] = {}
        self._cancels: list[tuple[Job, Status]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="aiayn-batch-worker", daemon=True)
        self._batch = RunningBatch(translator)  # the worker thread's alone
        self._maps = ThreadPoolExecutor(1, thread_name_prefix="aiayn-attention")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish the queued and running jobs, then end the thread and let the model go
        (a stopped app may live on: FastAPI caches its endpoints, which reach this)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._maps.shutdown(wait=True)  # the jobs that wait for their maps are answered
        if not self._thread.is_alive():
            self.translator = self._batch.translator = None

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

    def job(self, job_id: int) -> Job | None:
        """The job with this id, if it has not ended."""
        with self._cond:
            return self._jobs.get(job_id)

    def held(self) -> dict[str, int]:
        """How many jobs each of the worker's records holds, a snapshot (all 0 when
        idle: a job that ended is in none of them)."""
        with self._cond:
            return {
                "jobs": len(self._jobs),
                "queued": len(self._queue),
                "cancels": len(self._cancels),
                "running": len(self._batch.jobs),
                "running_sentences": len(self._batch),
            }

    def submit(self, job: Job) -> None:
        """Queue ``job`` (called on the event loop; takes the lock only briefly). Raises
        TooLargeError for a job that could never run, QueueFullError or StoppedError."""
        self.budget.check(job)
        n = len(job.src)
        if n > self.max_queue:  # a queue-full 429 would never clear for it
            raise TooLargeError(
                f"this request has {n} sentences, more than the queue holds ({self.max_queue})"
            )
        with self._cond:
            if self._stopping:
                raise StoppedError(self.failure or "the server is shutting down")
            if self._queued_sentences + n > self.max_queue:
                raise QueueFullError(
                    f"the queue is full ({self._queued_sentences} sentences waiting, "
                    f"at most {self.max_queue})"
                )
            job.queued_step, job.status = self._steps, Status.QUEUED
            self._queue[job] = None
            self._queued_sentences += n
            self._jobs[job.id] = job
            self.metrics.set_queue(self._queued_sentences)
            self.metrics.set_jobs_open(len(self._jobs))
            self._cond.notify()

    def cancel(self, job: Job, why: Status = Status.CANCELLED) -> None:
        """Nobody waits for ``job`` any more (``why``: CANCELLED or TIMED_OUT). A queued
        job ends here; a running one leaves its batch before the worker's next step."""
        with self._cond:
            if job.status is Status.RUNNING:
                self._cancels.append((job, why))
                self._cond.notify()
                return
            if job.status is not Status.QUEUED:
                return  # ended already
            self._dequeue(job)  # the worker can no longer take it
        self.finish(job, Outcome(why))

    def finish(self, job: Job, outcome: Outcome) -> None:
        """The one place where a job ends, whatever the ending: out of every record (the
        queue, the running batch), counted, and answered, exactly once. A running job is
        the worker thread's: only that thread finishes it (or, once it has left the
        batch, the attention thread)."""
        if job.status is Status.RUNNING:
            self._batch.cancel(job)  # no-op unless its sentences are still decoding
        with self._cond:
            if job.status.ended:
                return
            self._dequeue(job)
            self._jobs.pop(job.id, None)
            job.status = outcome.status
            self.metrics.set_jobs_open(len(self._jobs))
        self.metrics.job_ended(outcome.status.value)
        if outcome.status is Status.DONE:
            self.metrics.sentences_done(len(job.src))
        job.reply(outcome)

    # -- the queue (under the lock) -----------------------------------------------------
    def _dequeue(self, job: Job) -> None:
        if job in self._queue:
            del self._queue[job]
            self._queued_sentences -= len(job.src)
            self.metrics.set_queue(self._queued_sentences)

    def _take(self, jobs: list[Job]) -> list[Job]:
        """The worker takes ``jobs`` off the queue into a batch (see :meth:`finish`)."""
        for job in jobs:
            self._dequeue(job)
            job.status = Status.RUNNING
        return jobs

    def _joining(self, beside: list[Job], rows: int, patience: int | None = None) -> list[Job]:
        """From the oldest queued job on, those of the search settings of ``beside`` (jobs
        of one key, ``rows`` sentences) that fit the budgets beside them, up to the first
        that does not. Jobs of another key are passed over, but one that has waited
        ``patience`` decoding steps ends the walk. Takes none of them."""
        key = beside[0].key
        longest = max((job.longest for job in beside), default=0)
        prefix = max((job.longest_prefix for job in beside), default=0)
        joining: list[Job] = []
        for job in self._queue:
            if job.key != key:
                if patience is not None and self._steps - job.queued_step >= patience:
                    break  # it has waited enough: let the batch drain, it starts next
                continue  # it may wait a few steps while later jobs join
            rows, longest = rows + job.rows, max(longest, job.longest)
            prefix = max(prefix, job.longest_prefix)
            cost = self.budget.cost(rows, key.rows, longest, prefix)
            if rows * longest > self.max_batch_tokens or cost > self.budget.max_tokens:
                break  # keep arrival order: no smaller job jumps ahead
            joining.append(job)
        return joining

    # -- the worker thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            assert self.translator is not None  # until stop()
            with inference(self.translator.models):  # for good: not at every step
                while self._turn():
                    pass
        except BaseException as e:  # anything at all: no job may be left waiting
            self._die(f"{type(e).__name__}: {e}")

    def _turn(self) -> bool:
        """One decoding step of the running batch (queued jobs joining it first, or
        starting it); False once stopping with nothing left to do."""
        self._apply_cancels()
        if len(self._batch):
            self._continue(self._admit() if self.continuous else [])
            return True
        batch = self._next_batch()
        if not batch:  # stopping with the queue drained (it takes no more jobs), or cancels
            return not self._stopping  # of jobs beside the batch, applied at the next turn
        self._apply_cancels()  # of jobs taken while the batch gathered
        self._continue([job for job in batch if not job.status.ended])
        return True

    def _apply_cancels(self) -> None:
        with self._cond:
            cancels, self._cancels = self._cancels, []
        for job, why in cancels:
            self.finish(job, Outcome(why))
        if cancels:
            self.metrics.set_running(len(self._batch))

    def _die(self, reason: str) -> None:
        """Fail every job the worker holds, refuse new ones, and say why."""
        self.failure = f"the batching worker failed: {reason}"
        with self._cond:
            self._stopping = True
            jobs, self._cancels = list(self._jobs.values()), []
        self._batch.clear()  # no model call here: the batch may be what broke
        for job in jobs:
            with contextlib.suppress(Exception):
                self.finish(job, Outcome.failed(StoppedError(self.failure)))
        self.metrics.set_running(0)
        if self.on_death is not None:
            with contextlib.suppress(Exception):
                self.on_death(self.failure)

    def _next_batch(self) -> list[Job]:
        """Block for the oldest job, then gather compatible ones (see the class); none
        when a job's maps are being made (beside the batch) and its client leaves."""
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._stopping or self._cancels)
            if not self._queue:
                return []  # stopping and drained, or cancels to apply
            first = next(iter(self._queue))
            key, batch = first.key, self._take([first])
            deadline = time.perf_counter() + self.wait_s
            while True:
                batch += self._take(self._joining(batch, sum(job.rows for job in batch)))
                left = deadline - time.perf_counter()
                full = any(job.key == key for job in self._queue)  # one did not fit
                if full or left <= 0 or self._stopping or self._cancels:
                    return batch
                self._cond.wait(left)

    # -- the running batch -------------------------------------------------------------
    def _admit(self) -> list[Job]:
        """The queued jobs that join the running batch now (see the class). Never blocks."""
        running = len(self._batch)
        with self._cond:
            joining = self._joining(self._batch.jobs, running, self.join_wait_steps)
            few = sum(job.rows for job in joining) < self.join_ratio * running
            waited = self._steps - joining[0].queued_step if joining else 0
            if few and waited < self.join_wait_steps:
                return []
            return self._take(joining)

    def _continue(self, joining: list[Job]) -> None:
        """Let ``joining`` into the running batch, run one decoding step, and end the jobs
        whose last sentence is done."""
        self._leave(self._batch.admit(joining))
        running = len(self._batch)
        self.metrics.set_running(running)
        if not running:
            return
        left = self._batch.step()
        self._steps += 1
        self.metrics.batch_ran(running)
        self._leave(left)
        self.metrics.set_running(len(self._batch))

    def _leave(self, left: list[Left]) -> None:
        """End the jobs that left the running batch: with their results, or failed."""
        for _ in {id(gone.error) for gone in left if gone.error is not None}:
            self.metrics.batch_failed()  # once per model error, however many jobs it hit
        for gone in left:
            if gone.error is not None:
                self.finish(gone.job, Outcome.failed(gone.error))
            elif gone.job.attention:  # beside the batch: its sentences never wait for maps
                self._maps.submit(self._finish_with_maps, gone.job, gone.outputs)
            else:
                self.finish(gone.job, Outcome.done(Result(gone.outputs)))

    def _finish_with_maps(self, job: Job, outputs: Outputs) -> None:
        """On the attention thread, while the batch steps on: end a job that has left it
        with the attention maps of its outputs (``finish`` touches no batch state)."""
        try:
            assert self.translator is not None  # stop() waits for this thread
            maps = attention_maps(self.translator, job.src, best(outputs))
            outcome = Outcome.done(Result(outputs, maps))
        except Exception as e:
            self.metrics.batch_failed()
            outcome = Outcome.failed(e)
        self.finish(job, outcome)
