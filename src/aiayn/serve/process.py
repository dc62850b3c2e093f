"""The batching worker in a process of its own.

In one process the model worker shares the GIL with the event loop: every HTTP request's
parsing, JSON and socket work holds up the decoding between two torch calls. Here a child
process (spawned, so no thread or OpenMP state is forked) runs a :class:`BatchWorker` on its
own copy of the translator; the server process keeps the HTTP side and tokenization, and
no copy of the model. They talk over a pipe in small pickled messages:

    server -> worker:  ("job", id, src, settings, prefix, attention) | ("cancel", id, status)
                       | ("metrics",) | ("stop",)
    worker -> server:  ("finished", id, outcome) | ("metrics", state) | ("died", reason)
                       | ("failed", reason) | ("stopped",) | ("alive",) every HEARTBEAT_S

Every job sent is answered with one "finished" message, whatever its ending (done,
failed, cancelled, timed out): the child's :meth:`BatchWorker.finish` sends it, and the
server's :meth:`ProcessWorker.finish` forgets the job and answers the request, so both
processes forget it. :class:`ProcessWorker` has the BatchWorker's interface (``start``,
``submit``, ``cancel``, ``stop``, ``alive``, ``failure``), so the app does not care where
the model runs. Errors keep their type across the pipe (a queue over its limit is still a
:class:`QueueFullError`). If the child dies, its worker thread dies, or either end's pipe
reader raises, every waiting request gets a :class:`StoppedError` and ``alive`` turns
False, with the reason in ``failure``. If the child stops answering (it sends "alive"
every second), :meth:`ProcessWorker.stalled` says so: ``/health`` and ``/ready`` answer
503 and new requests are refused, until it answers again. The server's messages never
wait for the child (:class:`~aiayn.serve.channel.Channel`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import multiprocessing as mp
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from aiayn.distributed import exit_if_bootstrapping
from aiayn.errors import AiaynError
from aiayn.serve.batching import BatchWorker
from aiayn.serve.channel import Channel
from aiayn.serve.jobs import CacheBudget, Job, Outcome, Reply, Status, StoppedError, future_reply
from aiayn.serve.metrics import Metrics
from aiayn.translator import Translator

# The worker process says it is alive this often; silent for STALLED_S, it is taken for
# stopped or hung (SIGSTOP, a frozen machine): /health says so and requests are refused.
HEARTBEAT_S = 1.0
STALLED_S = 10.0
QUIET_S = 3 * HEARTBEAT_S  # silent this long, it is not waited for a metrics answer


class WorkerProcessError(AiaynError):
    """The model worker process could not be started."""


def refuse_in_bootstrap() -> None:
    """Exit, with one line saying why, in a worker process that is still importing the
    main module. A spawned worker imports the script that started the server: without an
    ``if __name__ == "__main__":`` guard, that script would load the model again and start
    a second server from inside the worker, which fails and leaves the first hanging."""
    exit_if_bootstrapping(
        "aiayn: the model worker process ran the script that starts the server again: "
        'start the server under `if __name__ == "__main__":` (a worker process '
        "imports the main module; see docs/serving.md)"
    )


def _portable(outcome: Outcome) -> Outcome:
    """``outcome`` with an error that survives pickling (else a RuntimeError with its
    type and text)."""
    error = outcome.error
    if error is None:
        return outcome
    try:
        pickle.loads(pickle.dumps(error))
        return outcome
    except Exception:
        return replace(outcome, error=RuntimeError(f"{type(error).__name__}: {error}"))


def _child(
    conn: Connection,
    worker_kwargs: dict,
    threads: int,
    device: str | None,
) -> None:
    """The worker process: receive the translator (and move it onto ``device``, if
    given), run a BatchWorker, answer messages until told to stop (or until the server
    process goes away)."""
    # A Ctrl-C reaches the whole process group, and systemd's SIGTERM the whole cgroup:
    # the server process decides when this one stops (a "stop" message, or its exit).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = Channel(conn)
    torch.set_num_threads(threads)
    metrics = Metrics()

    def tell(*message: Any) -> None:
        with contextlib.suppress(OSError):  # the server is gone: nobody to tell
            pipe.send(*message)

    def beat() -> None:  # while this process runs, the server hears from it
        while True:
            tell("alive")
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, name="aiayn-worker-heartbeat", daemon=True).start()

    try:
        translator = pickle.loads(conn.recv_bytes())
        if device is not None:
            for model in translator.models:
                model.to(device)
            translator.device = next(translator.model.parameters()).device
        worker = BatchWorker(
            translator, metrics, on_death=lambda reason: tell("died", reason), **worker_kwargs
        )
    except Exception as e:
        tell("failed", f"{type(e).__name__}: {e}")
        return
    worker.start()

    def reply_for(job_id: int) -> Reply:
        return lambda outcome: tell("finished", job_id, _portable(outcome))

    try:
        while True:
            message = pipe.recv()
            kind = message[0]
            if kind == "job":
                _, job_id, src, settings, prefix, attention = message
                job = Job(src, settings, attention, reply_for(job_id), prefix, id=job_id)
                try:
                    worker.submit(job)
                except AiaynError as e:  # refused (queue full, too large, stopping):
                    job.reply(Outcome.failed(e))  # answered at once, as no job that ran
            elif kind == "cancel":
                cancelled = worker.job(message[1])
                if cancelled is not None:
                    worker.cancel(cancelled, Status(message[2]))
            elif kind == "metrics":
                tell("metrics", metrics.worker_state())
            elif kind == "stop":
                break
    except (EOFError, OSError):  # the server process is gone: nobody waits for answers
        return
    except BaseException as e:  # the server fails every waiting request, then stops us
        tell("died", f"the worker process's pipe reader failed: {type(e).__name__}: {e}")
        return
    worker.stop()  # the queued and running jobs finish first
    tell("stopped")


class ProcessWorker:
    """A :class:`BatchWorker` in a child process (see the module). ``translator`` must be
    picklable; it is copied to the child once, at construction, and not kept here. With
    ``device``, the child moves the model there (so a translator loaded on the CPU here
    runs on a GPU that this process never touches). The child uses as many torch threads
    as this process has when :meth:`start` runs. ``on_death(reason)`` is called once
    if the worker stops serving without being told to (the process killed or failed, its
    worker thread dead), after every waiting request has been answered."""

    def __init__(
        self,
        translator: Translator,
        metrics: Metrics,
        device: str | None = None,
        on_death: Callable[[str], None] | None = None,
        **worker_kwargs: Any,
    ):
        checked = BatchWorker(translator, metrics, **worker_kwargs)  # check the settings here
        self.budget: CacheBudget = checked.budget  # a job too large is refused here
        try:
            self._translator_bytes = pickle.dumps(translator, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise WorkerProcessError(
                f"the translator cannot be copied to a worker process ({type(e).__name__}: "
                f"{e}); serve it with a worker thread instead"
            ) from None
        self.metrics, self._kwargs, self._device = metrics, worker_kwargs, device
        self.on_death = on_death
        self._pending: dict[int, Job] = {}  # sent, not answered yet
        self._metric_waiters: deque[Reply] = deque()  # answers to "metrics", in order
        self._lock = threading.Lock()
        self._stopping = False
        self.failure: str | None = None  # why the worker stopped serving, if it did
        self._process: BaseProcess | None = None
        self._pipe: Channel | None = None
        self._pid: int | None = None
        self._heard: float | None = None  # when the worker last sent a message
        self._reader = threading.Thread(target=self._read, name="aiayn-worker-pipe", daemon=True)

    def start(self) -> None:
        context = mp.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        self._process = context.Process(
            target=_child,
            args=(theirs, self._kwargs, torch.get_num_threads(), self._device),
            name="aiayn-model-worker",
            daemon=True,
        )
        self._process.start()
        self._pid = self._process.pid
        theirs.close()  # so that the child's death reads as EOF here
        # The model goes over our pipe, not as an argument of the process: the spawn pipe
        # stays open here while start() writes, so a child that dies before reading it
        # all (a script without a main guard) would block that write for good.
        with contextlib.suppress(OSError):  # it died already: the reader says so
            ours.send_bytes(self._translator_bytes)
        self._translator_bytes = b""
        self._pipe = Channel(ours)
        self._reader.start()
        # A forced quit (a second Ctrl-C) skips the app's shutdown and so stop(); then
        # multiprocessing's own exit hook sends the child a SIGTERM, which it ignores, and
        # waits for it forever. This hook, registered later, runs first: the child goes.
        atexit.register(self._kill_at_exit)

    def _kill_at_exit(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    @property
    def alive(self) -> bool:
        return (
            self.failure is None
            and self._process is not None
            and self._process.is_alive()
            and self._reader.is_alive()
        )

    def silent(self) -> float:
        """Seconds since the worker process last sent a message (0 before it first spoke)."""
        return time.monotonic() - self._heard if self._heard is not None else 0.0

    def stalled(self) -> str | None:
        """Why the worker process is taken for stopped or hung, or None: it has sent no
        message (it sends one every HEARTBEAT_S) for STALLED_S, since it first spoke."""
        if (silent := self.silent()) < STALLED_S:
            return None
        return f"the model worker process has not answered for {silent:.0f} s (stopped or hung)"

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before :meth:`start`)."""
        return self._pid

    def held(self) -> dict[str, int]:
        """Jobs sent and not answered, and metric requests not answered (0 when idle)."""
        with self._lock:
            return {"pending": len(self._pending), "metric_waiters": len(self._metric_waiters)}

    def submit(self, job: Job) -> None:
        """Send ``job`` to the worker process; its outcome comes back through
        :meth:`finish`. Raises TooLargeError for a job that could never run."""
        self.budget.check(job)
        with self._lock:
            if self._stopping or self._pipe is None:
                raise StoppedError(self.failure or "the server is shutting down")
            if stalled := self.stalled():  # an answer at once, not at the deadline
                raise StoppedError(stalled)
            self._pending[job.id] = job
            self.metrics.set_jobs_pending(len(self._pending))
            # Never blocks (see Channel); a pipe found closed fails every pending job.
            self._pipe.post("job", job.id, job.src, job.settings, job.prefix, job.attention)

    def cancel(self, job: Job, why: Status = Status.CANCELLED) -> None:
        """Nobody waits for ``job`` any more: the worker drops it from its queue or batch,
        and answers it (as ``why``), which ends it here too."""
        with self._lock:
            pipe = self._pipe  # stop() lets it go (None) outside the lock
            if job.id not in self._pending or pipe is None:
                return
        pipe.post("cancel", job.id, why.value)

    def finish(self, job_id: int, outcome: Outcome) -> None:
        """This side's end of a job: forget it and answer its request."""
        with self._lock:
            job = self._pending.pop(job_id, None)
            self.metrics.set_jobs_pending(len(self._pending))
        if job is not None:
            job.status = outcome.status
            job.reply(outcome)

    async def refresh_metrics(self, timeout: float = 5.0) -> None:
        """Copy the worker's counters and gauges (batches, queue) into this process's
        metrics; on no answer within ``timeout`` seconds, at most QUIET_S less the time the
        worker has been silent (a scrape must not wait out a stall's first seconds; a
        healthy worker answers in milliseconds), they stay as they were."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            wait = min(timeout, QUIET_S - self.silent())
            if not self.alive or (pipe := self._pipe) is None or wait <= 0:  # see cancel()
                return
            self._metric_waiters.append(future_reply(loop, future))
            pipe.post("metrics")
        try:
            outcome = await asyncio.wait_for(future, wait)
        except asyncio.TimeoutError:
            return
        if outcome.status is Status.DONE:
            self.metrics.set_worker_state(outcome.value)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Let the worker finish its queued and running jobs (within ``timeout`` seconds),
        then end it; one that has stalled (:meth:`stalled`) is not waited for."""
        with self._lock:
            self._stopping = True
        if self._process is None or self._pipe is None:
            return
        self._pipe.post("stop")
        end = math.inf if timeout is None else time.monotonic() + timeout
        while self._reader.is_alive() and not self.stalled() and time.monotonic() < end:
            self._reader.join(min(0.5, end - time.monotonic()))
        self._pipe.close()
        self._process.join(0 if self.stalled() else 5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        atexit.unregister(self._kill_at_exit)
        # Its reader reads EOF now. Then close our end of the pipe and the process's
        # handles: a stopped app may live on (FastAPI caches its endpoints, which reach
        # this), and 3 descriptors a stop added up.
        self._reader.join(5)
        if not self._reader.is_alive():  # a second stop() finds nothing to stop
            self._pipe.conn.close()
            self._process.close()
            self._process = self._pipe = None

    # -- the reader thread -------------------------------------------------------------
    def _read(self) -> None:
        assert self._pipe is not None and self._process is not None
        try:
            while True:
                message = self._pipe.recv()
                if not self._handle(message):
                    break
        except (EOFError, OSError):
            pass
        except BaseException as e:  # anything at all: no request may be left waiting
            self._fail(f"the worker pipe's reader failed: {type(e).__name__}: {e}")
            self._process.kill()  # nobody reads its answers any more
        self._process.join(1)
        code = self._process.exitcode
        self._fail(f"the model worker process has stopped (exit code {code})")

    def _handle(self, message: tuple[Any, ...]) -> bool:
        """Act on one message from the worker; False when it has stopped."""
        kind, self._heard = message[0], time.monotonic()
        if kind == "alive":
            pass
        elif kind == "finished":
            self.finish(message[1], message[2])
        elif kind == "metrics":
            with self._lock:  # none left when a failure answered them already
                reply = self._metric_waiters.popleft() if self._metric_waiters else None
            if reply is not None:
                reply(Outcome.done(message[1]))
        elif kind == "died":  # its worker thread failed every job it held; it goes
            self._fail(message[1])
            assert self._pipe is not None
            self._pipe.post("stop")
        elif kind == "failed":
            self._fail(f"the model worker process failed to start: {message[1]}")
            return False
        elif kind == "stopped":
            return False
        return True

    def _fail(self, reason: str) -> None:
        """Answer every waiting job and metrics request, and take no more: no request is
        left hanging. The first reason given is kept; ``on_death`` hears of a failure
        that no :meth:`stop` asked for."""
        with self._lock:
            unexpected, self._stopping = not self._stopping, True
            if self.failure is None:
                self.failure = reason
            reason = self.failure
            pending = list(self._pending)
            waiters, self._metric_waiters = self._metric_waiters, deque()
        for job_id in pending:
            self.finish(job_id, Outcome.failed(StoppedError(reason)))
        for reply in waiters:
            reply(Outcome.failed(StoppedError(reason)))
        if unexpected and self.on_death is not None:
            with contextlib.suppress(Exception):
                self.on_death(reason)
