"""Gaps that a mutation run of aiayn.serve.jobs found: the decoder-cache budget's bounds
(exactly at the budget, the longest sentence and prefix of a job wherever they are, the
rows of a sampling job), the warm-up sentence cut to the budget, the sampling batch key,
and how an ended job's outcome unwraps and reaches an event loop."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from aiayn import Transformer
from aiayn.errors import AiaynError
from aiayn.serve.jobs import (
    CacheBudget,
    CancelledJobError,
    DeadlineError,
    Job,
    Outcome,
    Settings,
    Status,
    TooLargeError,
    future_reply,
)
from aiayn.translator import Translator
from conftest import tiny_config


def job(src, **settings) -> Job:
    return Job(src, Settings(**settings), False, lambda outcome: None)


def test_a_job_exactly_at_the_budget_fits():
    budget = CacheBudget(32, 64, 0.0, 5)
    budget.check(job([[3] * 3], beam=4))  # 1 x beam 4 x (3 + 5) = 32: fits exactly
    with pytest.raises(TooLargeError, match="needs 32 "):
        CacheBudget(31, 64, 0.0, 5).check(job([[3] * 3], beam=4))


def test_the_longest_sentence_counts_wherever_it_is():
    long_last = job([[5] * 2, [5] * 100], beam=1)
    assert long_last.longest == 100
    budget = CacheBudget(10**9, 256)  # outputs of n + 50 tokens
    assert budget.cost_of([long_last], 1) == 2 * (100 + 150)
    short = job([[5] * 2], beam=1)
    assert budget.cost_of([short, long_last], 1) == 3 * (100 + 150)  # the longest job's
    with pytest.raises(TooLargeError, match=r"\(100 source \+ 64 output"):
        CacheBudget(300, 64).check(long_last)  # 2 x (100 + 64) = 328


def test_the_longest_forced_prefix_counts_wherever_it_is():
    free = job([[3] * 3, [3] * 3], beam=1)
    forced = dataclasses.replace(free, prefix=[[4] * 2, [4] * 20])
    assert forced.longest_prefix == 20
    budget = CacheBudget(10**9, 64, 0.0, 5)
    assert budget.cost_of([forced], 1) == 2 * (3 + 21)  # the prefix of 20, and EOS


def test_a_sampling_job_costs_one_row_per_sample():
    sample = job([[3] * 3], beam=1, n_best=3, sampling=True)
    budget = CacheBudget(20, 64, 0.0, 5)  # one row (3 + 5 = 8) fits, three (24) do not
    with pytest.raises(TooLargeError, match=r"needs 24 .*x 3 samples x"):
        budget.check(sample)


def test_the_warm_up_sentence_is_cut_to_the_longest_that_fits():
    budget = CacheBudget(60, 64)  # cost(1, 1, n) = n + min(n + 50, 64): n = 5 fits exactly
    assert budget.fit(list(range(20))) == list(range(5))
    assert budget.fit([7, 8]) == [7, 8]
    assert CacheBudget(10, 64).fit([7, 8, 9]) == [7]  # one token at least, whatever it costs


def test_a_budget_is_refused_for_what_it_cannot_hold():
    translator = Translator(Transformer(tiny_config(max_len=64)), None)
    least = 1 + 51  # one source token, and 1 + 50 output tokens under the paper's rule
    assert CacheBudget.for_translator(least, translator).max_tokens == least  # just enough
    with pytest.raises(AiaynError, match=f"holds no request: .* needs {least} "):
        CacheBudget.for_translator(least - 1, translator)
    with pytest.raises(AiaynError, match="holds no request"):
        CacheBudget.for_translator(1, translator)
    with pytest.raises(AiaynError, match="must be >= 1 position, got 0"):
        CacheBudget.for_translator(0, translator)


def test_sampling_jobs_that_differ_only_in_alpha_share_a_batch():
    a = job([[5]], beam=1, n_best=2, sampling=True, alpha=0.0)
    b = job([[5]], beam=1, n_best=2, sampling=True, alpha=1.0)
    assert a.key == b.key and a.key.search.alpha == 0.0


@pytest.mark.parametrize(
    ("status", "error"),
    [(Status.TIMED_OUT, DeadlineError), (Status.CANCELLED, CancelledJobError)],
)
def test_an_outcome_without_a_value_unwraps_to_why(status, error):
    with pytest.raises(error):
        Outcome(status).unwrap()


def test_a_reply_to_a_request_that_gave_up_is_dropped_quietly():
    loop = asyncio.new_event_loop()
    errors = []
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    future = loop.create_future()
    future.cancel()  # the request gave up (client gone, deadline) before the job ended
    future_reply(loop, future)(Outcome.done(None))
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    assert errors == []  # set_result on a done future would raise in the loop


def test_a_reply_after_the_loop_closed_is_dropped():
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    loop.close()  # the server is gone: nobody waits any more
    future_reply(loop, future)(Outcome.done(None))  # no RuntimeError in the worker thread
