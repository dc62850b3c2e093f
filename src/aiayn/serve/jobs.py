"""One request's work in the model worker, and the one way it ends.

A :class:`Job` is queued, may run (its sentences in a batch), and ends exactly once with
an :class:`Outcome`: done (a :class:`Result`), failed (an error), cancelled (nobody waits
for it: the client went away) or timed out (past the request's deadline). vLLM's
scheduler keeps one status per request and one abort path that frees what the request
holds; here the status is :attr:`Job.status` and that path is the workers' ``finish``.

Jobs with equal :attr:`Job.key` may share a batch, and :class:`CacheBudget` says what a
batch of them costs in decoder-cache positions, which bounds its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from aiayn.decode import DecodeOptions, Hypothesis
from aiayn.errors import AiaynError
from aiayn.inspect.maps import AttentionMap
from aiayn.translator import Translator


class QueueFullError(AiaynError):
    """The queue holds as many sentences as allowed; the client should retry later."""


class StoppedError(AiaynError):
    """The worker is shutting down, or has died, and takes no new work."""


class TooLargeError(AiaynError):
    """A request whose batch alone would hold more decoder cache than a batch may."""


class CancelledJobError(AiaynError):
    """The job was cancelled: nobody waits for its answer any more."""


class DeadlineError(AiaynError):
    """The job ran past its request's deadline and was dropped."""


class Status(Enum):
    QUEUED = "queued"
    RUNNING = "running"  # in the running batch
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def ended(self) -> bool:
        return self not in (Status.QUEUED, Status.RUNNING)


ENDINGS = (Status.DONE, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT)


# A request's decoding settings: the options every search takes (an alias, for the code
# that named them so before they were one object).
Settings = DecodeOptions


def rows_per_sentence(options: DecodeOptions) -> int:
    """Decoder rows per sentence: the beam, or the samples when sampling."""
    return options.n_best if options.sampling else options.beam


@dataclass(frozen=True)
class BatchKey:
    """Jobs with equal keys decode in one running batch: their options differ at most in
    alpha (which only scores a sentence's finished outputs) and, but in sampling, n_best
    (which only picks among them); ``search`` holds the options they share (alpha 0;
    n_best 1, or in sampling the samples per sentence)."""

    search: DecodeOptions

    @property
    def rows(self) -> int:
        """Decoder rows per sentence."""
        return rows_per_sentence(self.search)


@dataclass
class Result:
    """One job's outputs: per sentence its hypotheses (best first; samples in the order
    drawn; none for a blank line), and attention maps when asked."""

    hypotheses: list[list[Hypothesis]]
    attention: list[AttentionMap | None] | None = None

    @property
    def ids(self) -> list[list[list[int]]]:
        """Per sentence, its n-best output ids."""
        return [[h.tokens for h in candidates] for candidates in self.hypotheses]


@dataclass(frozen=True)
class Outcome:
    """How a job ended: ``status`` is one of :data:`ENDINGS`; ``value`` is the
    :class:`Result` of a done job, ``error`` what made it fail (picklable: an outcome
    crosses the worker process's pipe)."""

    status: Status
    value: Any = None
    error: BaseException | None = None

    @classmethod
    def done(cls, value: Any) -> Outcome:
        return cls(Status.DONE, value)

    @classmethod
    def failed(cls, error: BaseException) -> Outcome:
        return cls(Status.FAILED, error=error)

    def unwrap(self) -> Any:
        """The value of a done job; else the error that says why there is none."""
        if self.status is Status.DONE:
            return self.value
        if self.status is Status.FAILED:
            raise self.error if self.error is not None else AiaynError("the job failed")
        if self.status is Status.TIMED_OUT:
            raise DeadlineError("the request ran past its deadline")
        raise CancelledJobError("the request was cancelled")


Reply = Callable[[Outcome], None]
_ids = itertools.count()


@dataclass(eq=False)  # hashable by identity: its sentences are tagged (job, index)
class Job:
    """One request's work. ``reply(outcome)`` is called exactly once, by the worker's
    ``finish``, from any thread (a :func:`future_reply` hands it to the event loop).
    ``status`` is written under the worker's lock only."""

    src: list[list[int]]  # token ids per sentence; [] for a blank line
    settings: DecodeOptions
    attention: bool
    reply: Reply
    prefix: list[list[int]] | None = None  # forced target ids per sentence
    id: int = field(default_factory=lambda: next(_ids))  # unique in this process
    status: Status = Status.QUEUED
    queued_step: int = 0  # the running batch's step count when it was queued

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.src), default=0)

    @property
    def longest_prefix(self) -> int:
        """Tokens of the longest forced prefix (0: none)."""
        return max((len(p) for p in self.prefix or []), default=0)

    @property
    def rows(self) -> int:
        """Sentences that the model decodes (blank lines get no candidates)."""
        return sum(1 for s in self.src if s)

    @cached_property
    def key(self) -> BatchKey:
        """Jobs with equal keys may share a running batch (forced prefixes or not,
        attention maps or not): see :class:`BatchKey`. Made once: the scheduler compares
        the key of every queued job at every decoding step, and a job's settings never
        change."""
        s = self.settings
        return BatchKey(s.replace(alpha=0.0) if s.sampling else s.replace(alpha=0.0, n_best=1))


def future_reply(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> Reply:
    """A :class:`Job` reply that sets ``future``'s result to the outcome, on ``loop``
    (futures are not thread-safe, so whichever thread ends the job hands it over)."""

    def complete(outcome: Outcome) -> None:
        if not future.done():  # the request gave up already (client gone, deadline)
            future.set_result(outcome)

    def reply(outcome: Outcome) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(complete, outcome)

    return reply


@dataclass(frozen=True)
class CacheBudget:
    """What a batch may hold in its decoder cache: ``max_tokens`` positions, counted as
    rows x beam x (longest source + longest allowed output), the self-attention keys
    and values every beam row may reach plus the encoder-decoder ones it attends to
    (for a base model in fp32, 24 KiB a position; the self-attention keys and values are
    held in two buffers with up to 32 spare columns each, since a beam reorder gathers
    from one into the other, so their positions may take up to twice that). The
    output-length rule is the decoder's (``max_len_a * source + max_len_b``, fairseq's;
    see :func:`aiayn.decode.core.length_limits`), capped by ``max_len``: the model's
    positions, or fewer where the decoding settings say so."""

    max_tokens: int
    max_len: int
    max_len_a: float = DecodeOptions.max_len_a
    max_len_b: int = DecodeOptions.max_len_b

    @classmethod
    def for_translator(cls, max_tokens: int, translator: Translator) -> CacheBudget:
        """The budget of ``max_tokens`` positions under the length rule that
        ``translator`` decodes with by default (the server's requests set no other)."""
        if max_tokens < 1:
            raise AiaynError(f"the decoder-cache budget must be >= 1 position, got {max_tokens}")
        rule, cap = translator.defaults, translator.max_len
        if rule.max_new_tokens is not None:
            cap = min(cap, rule.max_new_tokens)
        budget = cls(max_tokens, cap, rule.max_len_a, rule.max_len_b)
        if (least := budget.cost(1, 1, 1)) > max_tokens:  # not even the smallest request
            raise AiaynError(
                f"a decoder-cache budget of {max_tokens} positions holds no request: one "
                f"sentence of one token, decoded greedily, needs {least} (1 source + "
                f"{least - 1} output tokens under the length rule)"
            )
        return budget

    def output_limit(self, src_len: int, prefix: int = 0) -> int:
        """The most tokens (EOS included) a sentence of ``src_len`` tokens may produce; a
        forced prefix of ``prefix`` tokens raises it to the prefix and EOS, as the
        searches do (:func:`aiayn.decode.core.search_limits`), whatever the cap."""
        limit = min(int(src_len * self.max_len_a + self.max_len_b), self.max_len)
        return max(limit, prefix + 1) if prefix else limit

    def cost(self, rows: int, beam: int, longest: int, prefix: int = 0) -> int:
        """Positions that ``rows`` sentences, the longest ``longest`` tokens and the
        longest forced prefix ``prefix`` tokens, hold at beam size ``beam``."""
        return rows * beam * (longest + self.output_limit(longest, prefix)) if rows else 0

    def fit(self, ids: list[int]) -> list[int]:
        """``ids`` cut to a source that one sentence, decoded greedily, fits the budget with
        (one token at least): the warm-up translation of a server with a small budget."""
        n = len(ids)
        while n > 1 and self.cost(1, 1, n) > self.max_tokens:
            n -= 1
        return ids[:n]

    def cost_of(self, jobs: Sequence[Job], beam: int) -> int:
        rows = sum(job.rows for job in jobs)
        longest = max((job.longest for job in jobs), default=0)
        return self.cost(rows, beam, longest, max((j.longest_prefix for j in jobs), default=0))

    def check(self, job: Job) -> None:
        """TooLargeError when ``job`` alone is over the budget: it could never run."""
        rows = rows_per_sentence(job.settings)
        need = self.cost_of([job], rows)
        if need > self.max_tokens:
            per = f"{rows} samples" if job.settings.sampling else f"beam {rows}"
            out = self.output_limit(job.longest, job.longest_prefix)
            raise TooLargeError(
                f"this request needs {need} decoder-cache positions ({job.rows} sentences x "
                f"{per} x ({job.longest} source + {out} output tokens)), more than a batch may "
                f"hold ({self.max_tokens}): send fewer or shorter sentences, or a smaller beam"
            )
