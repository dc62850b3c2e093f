"""The batching worker in a process of its own.

In one process the model worker shares the GIL with the event loop: every HTTP request's
parsing, JSON and socket work holds up the decoding between two torch calls. Here a child
process (spawned, so no thread or OpenMP state is forked) runs a :class:`BatchWorker` on its
own copy of the translator; the server process keeps the HTTP side and tokenization. They
talk over a pipe in small pickled messages:

    server -> worker:  ("job", id, src, settings, attention) | ("cancel", id)
                       | ("metrics",) | ("stop",)
    worker -> server:  ("done", id, result, error) | ("metrics", state) | ("stopped",)

:class:`ProcessWorker` has the BatchWorker's interface (``start``, ``submit``, ``cancel``,
``stop``, ``alive``), so the app does not care where the model runs. Errors keep their type
across the pipe (a queue over its limit is still a :class:`QueueFullError`). If the child
dies, every waiting request gets a :class:`StoppedError` and ``alive`` turns False.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import pickle
import signal
import threading
from collections import deque
from typing import Any

import torch

from aiayn.errors import AiaynError
from aiayn.serve.batching import BatchWorker, Job, Reply, StoppedError, future_reply
from aiayn.serve.metrics import Metrics
from aiayn.translator import Translator


class WorkerProcessError(AiaynError):
    """The model worker process could not be started."""


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError with its type and text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class _Pipe:
    """One end of the pipe: whole pickled messages, sends serialized by a lock (several
    threads send). Plain pickle, not multiprocessing's: tensors in attention maps are
    copied, not moved to shared memory."""

    def __init__(self, conn):
        self.conn, self._lock = conn, threading.Lock()

    def send(self, *message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)

    def recv(self) -> tuple:
        return pickle.loads(self.conn.recv_bytes())


def _child(conn, translator_bytes: bytes, worker_kwargs: dict, threads: int) -> None:
    """The worker process: load the translator, run a BatchWorker, answer messages until
    told to stop (or until the server process goes away)."""
    # A Ctrl-C reaches the whole process group, and systemd's SIGTERM the whole cgroup:
    # the server process decides when this one stops (a "stop" message, or its exit).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = _Pipe(conn)
    torch.set_num_threads(threads)
    metrics = Metrics()
    try:
        translator = pickle.loads(translator_bytes)
        worker = BatchWorker(translator, metrics, **worker_kwargs)
    except Exception as e:
        pipe.send("failed", f"{type(e).__name__}: {e}")
        return
    del translator_bytes
    worker.start()
    jobs: dict[int, Job] = {}

    def reply_for(job_id: int):
        def reply(value: Any, error: BaseException | None) -> None:
            jobs.pop(job_id, None)
            with contextlib.suppress(OSError):  # the server is gone: nobody to tell
                pipe.send("done", job_id, value, None if error is None else _portable(error))

        return reply

    try:
        while True:
            message = pipe.recv()
            kind = message[0]
            if kind == "job":
                _, job_id, src, settings, attention = message
                job = Job(src, settings, attention, reply_for(job_id))
                jobs[job_id] = job
                try:
                    worker.submit(job)
                except AiaynError as e:  # queue full, stopping: answered at once
                    job.resolve(error=e)
            elif kind == "cancel":
                job = jobs.get(message[1])
                if job is not None:
                    worker.cancel(job)
            elif kind == "metrics":
                pipe.send("metrics", metrics.worker_state())
            elif kind == "stop":
                break
    except (EOFError, OSError):  # the server process is gone: nobody waits for answers
        return
    worker.stop()  # the queued and running jobs finish first
    with contextlib.suppress(OSError):
        pipe.send("stopped")


class ProcessWorker:
    """A :class:`BatchWorker` in a child process (see the module). ``translator`` must be
    picklable; it is copied to the child once, at construction. The child uses as many
    torch threads as this process has when :meth:`start` runs."""

    def __init__(self, translator: Translator, metrics: Metrics, **worker_kwargs: Any):
        BatchWorker(translator, metrics, **worker_kwargs)  # check the settings here
        try:
            self._translator_bytes = pickle.dumps(translator, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise WorkerProcessError(
                f"the translator cannot be copied to a worker process ({type(e).__name__}: "
                f"{e}); serve it with a worker thread instead"
            ) from None
        self.metrics, self._kwargs = metrics, worker_kwargs
        self._ids = itertools.count()
        self._pending: dict[int, Job] = {}  # sent, not answered yet
        self._metric_waiters: deque[Reply] = deque()  # answers to "metrics", in order
        self._lock = threading.Lock()
        self._stopping = False
        self._process = None
        self._pipe: _Pipe | None = None
        self._reader = threading.Thread(target=self._read, name="aiayn-worker-pipe", daemon=True)

    def start(self) -> None:
        context = mp.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        self._process = context.Process(
            target=_child,
            args=(theirs, self._translator_bytes, self._kwargs, torch.get_num_threads()),
            name="aiayn-model-worker",
            daemon=True,
        )
        self._process.start()
        theirs.close()  # so that the child's death reads as EOF here
        self._translator_bytes = b""
        self._pipe = _Pipe(ours)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive() and self._reader.is_alive()

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before :meth:`start`)."""
        return self._process.pid if self._process is not None else None

    def submit(self, job: Job) -> None:
        """Send ``job`` to the worker process; its reply comes back through ``job.reply``."""
        with self._lock:
            if self._stopping or not self._reader.is_alive():
                raise StoppedError("the server is shutting down")
            job_id = next(self._ids)
            self._pending[job_id] = job
        try:
            self._pipe.send("job", job_id, job.src, job.settings, job.attention)
        except OSError:
            self._forget(job_id)
            raise StoppedError("the model worker process has stopped") from None

    def cancel(self, job: Job) -> None:
        """Nobody waits for ``job`` any more: the worker drops it from its queue or batch."""
        job.cancelled = True
        with self._lock:  # a rare event: a scan, rather than a second map to keep in step
            job_id = next((i for i, pending in self._pending.items() if pending is job), None)
        if job_id is not None:
            with contextlib.suppress(OSError):
                self._pipe.send("cancel", job_id)

    def _forget(self, job_id: int) -> Job | None:
        with self._lock:
            return self._pending.pop(job_id, None)

    async def refresh_metrics(self, timeout: float = 5.0) -> None:
        """Copy the worker's counters and gauges (batches, queue) into this process's
        metrics; on no answer within ``timeout`` seconds they stay as they were."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if not self.alive:
                return
            self._metric_waiters.append(future_reply(loop, future))
        try:
            self._pipe.send("metrics")
            state = await asyncio.wait_for(future, timeout)
        except (OSError, asyncio.TimeoutError):
            return
        self.metrics.set_worker_state(state)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Let the worker finish its queued and running jobs, then end it."""
        with self._lock:
            self._stopping = True
        if self._process is None:
            return
        with contextlib.suppress(OSError):
            self._pipe.send("stop")
        self._reader.join(timeout)
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    # -- the reader thread -------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                message = self._pipe.recv()
                kind = message[0]
                if kind == "done":
                    _, job_id, result, error = message
                    job = self._forget(job_id)
                    if job is not None:
                        job.resolve(result, error)
                elif kind == "metrics":
                    with self._lock:
                        reply = self._metric_waiters.popleft()
                    reply(message[1], None)
                elif kind == "failed":
                    self._fail(f"the model worker process failed to start: {message[1]}")
                    return
                elif kind == "stopped":
                    break
        except (EOFError, OSError):
            pass
        self._process.join(1)
        code = self._process.exitcode
        self._fail(f"the model worker process has stopped (exit code {code})")

    def _fail(self, message: str) -> None:
        """Answer every waiting job: no request is left hanging."""
        with self._lock:
            self._stopping = True
            pending, self._pending = self._pending, {}
        for job in pending.values():
            job.resolve(error=StoppedError(message))
