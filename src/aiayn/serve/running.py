"""The running batch: which jobs are in it and their outputs so far.

One :class:`RunningBatch` owns one :class:`~aiayn.decode.BeamEngine` and the
jobs whose sentences are in it, so there is one record of what is running: a job joins
whole (:meth:`~RunningBatch.admit`), leaves when its last sentence is done
(:meth:`~RunningBatch.step`) or when it is cancelled (:meth:`~RunningBatch.cancel`).
It never answers a job: it hands back the jobs that left with what they got, and the
worker ends them (its one ``finish`` path). Used by the worker thread only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiayn.data.batching import pad
from aiayn.decode import BeamEngine, Hypothesis
from aiayn.serve.jobs import BatchKey, Job
from aiayn.translator import Translator

Outputs = list[list[Hypothesis]]  # per sentence of a job, its n-best hypotheses


def best(outputs: Outputs) -> list[list[int]]:
    """The tokens of each sentence's best hypothesis ([] for a blank line)."""
    return [candidates[0].tokens if candidates else [] for candidates in outputs]


@dataclass
class _Running:
    """A job in the batch: its outputs so far and how many of its sentences still run."""

    outputs: Outputs
    left: int


@dataclass
class Left:
    """A job that left the batch: with all its outputs, or with the error that stopped it."""

    job: Job
    outputs: Outputs = field(default_factory=list)
    error: BaseException | None = None


class RunningBatch:
    """The jobs of one search setting that decode together, a step at a time (see the
    module). Empty, it holds no search; the first job admitted sets the key."""

    def __init__(self, translator: Translator):
        self.translator: Translator | None = translator  # None once its worker stopped
        self.key: BatchKey | None = None
        self._search: BeamEngine[tuple[Job, int]] | None = None  # tags: (job, row)
        self._jobs: dict[Job, _Running] = {}

    def __len__(self) -> int:
        """Sentences running."""
        return len(self._search) if self._search is not None else 0

    @property
    def jobs(self) -> list[Job]:
        return list(self._jobs)

    def admit(self, jobs: list[Job]) -> list[Left]:
        """Let ``jobs`` (of this batch's key; any when empty) join between two steps.
        Returns those that leave at once: all-blank jobs (done, no outputs) and jobs whose
        sentences the model rejected (with the error; the running ones are unchanged)."""
        if not jobs:
            return []
        assert self.translator is not None  # a stopped worker admits no job
        if self._search is None:
            key = jobs[0].key
            try:
                self._search = self.translator.continuous_search(key.search)
            except Exception as e:  # these jobs fail; nothing was running
                return [Left(job, error=e) for job in jobs]
            self.key = key
        left: list[Left] = []
        # One add (one copy of the batch's cache) per length penalty among them.
        for alpha in dict.fromkeys(job.settings.alpha for job in jobs):
            left += self._add([job for job in jobs if job.settings.alpha == alpha], alpha)
        self._drop_search_if_empty()
        return left

    def _add(self, group: list[Job], alpha: float) -> list[Left]:
        """Add the sentences of ``group`` (of one length penalty) to the search; returns
        the jobs that leave at once. If the model rejects the group, each job is tried
        alone: only those it rejects fail, not the jobs that came with them."""
        assert self._search is not None and self.translator is not None  # as admit
        tags = [(job, i) for job in group for i, src in enumerate(job.src) if src]
        prefix = [job.prefix[i] if job.prefix else [] for job, i in tags]
        try:
            if tags:  # a sentence's index in its request seeds its samples
                src = pad([job.src[i] for job, i in tags], self.translator.model.cfg.pad_id)
                lines = [i for _, i in tags]
                self._search.add(src, tags, prefix=prefix, alpha=alpha, lines=lines)
        except Exception as e:
            if len(group) == 1:
                return [Left(group[0], error=e)]
            return [gone for job in group for gone in self._add([job], alpha)]
        left: list[Left] = []
        for job in group:
            outputs: Outputs = [[] for _ in job.src]  # a blank line gets no candidates
            if job.rows:
                self._jobs[job] = _Running(outputs, job.rows)
            else:
                left.append(Left(job, outputs))
        return left

    def step(self) -> list[Left]:
        """One decoding step of every running sentence; returns the jobs whose last
        sentence is done, with their outputs. If the model raises, every job leaves with
        the error and the batch is empty."""
        if self._search is None or not len(self._search):
            return []
        try:
            done = self._search.step()
        except Exception as e:
            return [Left(job, error=e) for job in self.clear()]
        finished = []
        for (job, i), hypotheses in done:
            running = self._jobs[job]
            running.outputs[i] = hypotheses[: job.settings.n_best]
            running.left -= 1
            if not running.left:
                finished.append(Left(job, self._jobs.pop(job).outputs))
        self._drop_search_if_empty()
        return finished

    def cancel(self, job: Job) -> None:
        """Stop decoding ``job``'s sentences (nobody waits for them any more)."""
        if self._jobs.pop(job, None) is None or self._search is None:
            return
        self._search.remove({(job, i) for i in range(len(job.src))})
        self._drop_search_if_empty()

    def clear(self) -> list[Job]:
        """Drop every job (and the search); returns them."""
        jobs = list(self._jobs)
        self._jobs.clear()
        self._search, self.key = None, None
        return jobs

    def _drop_search_if_empty(self) -> None:
        """A search with no sentences goes: the next job may bring another beam size."""
        if not self._jobs:
            self._search, self.key = None, None
