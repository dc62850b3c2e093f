"""Prometheus counters, gauges and histograms in the text exposition format (0.0.4),
written by hand: a few dozen lines instead of a dependency. Thread-safe: the event loop
and the batching worker both record."""

from __future__ import annotations

import copy
import threading
from bisect import bisect_left
from collections import defaultdict

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Recorded by the batching worker, wherever it runs; the rest by the HTTP side.
WORKER_FIELDS = (
    "batch_sentences",
    "sentences",
    "batch_errors",
    "queue_sentences",
    "running_sentences",
    "jobs_open",
    "jobs_ended",
)
JOB_ENDINGS = ("done", "failed", "cancelled", "timed_out")  # aiayn.serve.jobs.ENDINGS


class Histogram:
    """Cumulative buckets plus sum and count, as Prometheus expects."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip([*self.buckets, float("inf")], self.counts):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return [*out, f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]


class Metrics:
    """What ``GET /metrics`` reports (all names start with ``aiayn_``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (path, status) -> n
        self.latency = Histogram(LATENCY_BUCKETS)  # POST /translate, seconds
        self.batch_sentences = Histogram(BATCH_BUCKETS)
        self.sentences = 0
        self.batch_errors = 0
        self.queue_sentences = 0  # set by the worker's queue
        self.running_sentences = 0  # in the running batch
        self.jobs_open = 0  # jobs the batching worker holds (queued or running)
        self.jobs_ended: dict[str, int] = dict.fromkeys(JOB_ENDINGS, 0)
        self.jobs_pending = 0  # sent to a worker process, not answered yet
        self.in_flight = 0

    def request_done(self, path: str, status: int, seconds: float | None) -> None:
        with self._lock:
            self.requests[(path, status)] += 1
            if seconds is not None:
                self.latency.observe(seconds)

    def batch_ran(self, n_sentences: int) -> None:
        """One model batch: a decoding step of the running batch."""
        with self._lock:
            self.batch_sentences.observe(n_sentences)

    def sentences_done(self, n_sentences: int) -> None:
        """Sentences answered."""
        with self._lock:
            self.sentences += n_sentences

    def batch_failed(self) -> None:
        with self._lock:
            self.batch_errors += 1

    def job_ended(self, ending: str) -> None:
        """A job ended: "done", "failed", "cancelled" or "timed_out"."""
        with self._lock:
            self.jobs_ended[ending] += 1

    def set_jobs_open(self, n_jobs: int) -> None:
        self.jobs_open = n_jobs  # one int store: atomic under the GIL

    def set_jobs_pending(self, n_jobs: int) -> None:
        self.jobs_pending = n_jobs

    def set_running(self, n_sentences: int) -> None:
        self.running_sentences = n_sentences  # one int store: atomic under the GIL

    def add_in_flight(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta

    def set_queue(self, n_sentences: int) -> None:
        self.queue_sentences = n_sentences  # one int store: atomic under the GIL

    def worker_state(self) -> dict:
        """What the batching worker records (a copy): sent to the server process when the
        worker runs in a process of its own."""
        with self._lock:
            return copy.deepcopy({name: getattr(self, name) for name in WORKER_FIELDS})

    def set_worker_state(self, state: dict) -> None:
        """Take the worker's record from :meth:`worker_state` of the worker's process."""
        with self._lock:
            for name in WORKER_FIELDS:
                setattr(self, name, state[name])

    def render(self) -> str:
        """The text exposition format."""
        with self._lock:
            out = [
                "# HELP aiayn_requests_total HTTP requests answered, by path and status.",
                "# TYPE aiayn_requests_total counter",
            ]
            for (path, status), n in sorted(self.requests.items()):
                out.append(f'aiayn_requests_total{{path="{path}",status="{status}"}} {n}')
            out += [
                "# HELP aiayn_request_duration_seconds Latency of POST /translate.",
                "# TYPE aiayn_request_duration_seconds histogram",
                *self.latency.lines("aiayn_request_duration_seconds"),
                "# HELP aiayn_batch_sentences Sentences per model batch (one decoding "
                "step of the running batch).",
                "# TYPE aiayn_batch_sentences histogram",
                *self.batch_sentences.lines("aiayn_batch_sentences"),
                "# HELP aiayn_sentences_translated_total Sentences translated.",
                "# TYPE aiayn_sentences_translated_total counter",
                f"aiayn_sentences_translated_total {self.sentences}",
                "# HELP aiayn_batch_errors_total Model batches that raised.",
                "# TYPE aiayn_batch_errors_total counter",
                f"aiayn_batch_errors_total {self.batch_errors}",
                "# HELP aiayn_queue_sentences Sentences waiting for the model.",
                "# TYPE aiayn_queue_sentences gauge",
                f"aiayn_queue_sentences {self.queue_sentences}",
                "# HELP aiayn_running_sentences Sentences in the running batch.",
                "# TYPE aiayn_running_sentences gauge",
                f"aiayn_running_sentences {self.running_sentences}",
                "# HELP aiayn_jobs_total Jobs (requests given to the model worker) ended, by "
                "outcome.",
                "# TYPE aiayn_jobs_total counter",
                *(f'aiayn_jobs_total{{outcome="{k}"}} {n}' for k, n in self.jobs_ended.items()),
                "# HELP aiayn_jobs_open Jobs the model worker holds, queued or running.",
                "# TYPE aiayn_jobs_open gauge",
                f"aiayn_jobs_open {self.jobs_open}",
                "# HELP aiayn_jobs_pending Jobs sent to the worker process and not answered "
                "yet (0 with a worker thread).",
                "# TYPE aiayn_jobs_pending gauge",
                f"aiayn_jobs_pending {self.jobs_pending}",
                "# HELP aiayn_requests_in_flight POST /translate requests being served.",
                "# TYPE aiayn_requests_in_flight gauge",
                f"aiayn_requests_in_flight {self.in_flight}",
            ]
        return "\n".join(out) + "\n"
