"""The serving worker's parts on their own (no HTTP): the decoder-cache budget, the
continuous batch (:class:`RunningBatch`: admit, cancel, step -> finished jobs), and the
job lifecycle of :class:`BatchWorker` (every job ends once, through ``finish``; a cancel
while queued or running; a worker thread that dies fails every job it holds)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from aiayn import Transformer
from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.decode import DecodeOptions
from aiayn.decode.core import forced_ids, length_limits, search_limits
from aiayn.inspect.maps import attention_maps
from aiayn.serve.batching import BatchWorker
from aiayn.serve.jobs import (
    BatchKey,
    CacheBudget,
    Job,
    Outcome,
    Settings,
    Status,
    StoppedError,
    TooLargeError,
)
from aiayn.serve.metrics import Metrics
from aiayn.serve.running import RunningBatch
from aiayn.translator import Translator
from conftest import tiny_config
from sample_data import PAIRS
from serve_util import ControlledTranslator

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def translator(sample_model_dir) -> Translator:
    return Translator(*load_model(resolve_checkpoint(sample_model_dir())))


class Outcomes:
    """Replies that record each job's outcome (and that each job is answered once)."""

    def __init__(self) -> None:
        self.got: dict[int, list[Outcome]] = {}
        self.event = threading.Condition()

    def job(self, src: list[list[int]], beam: int = 4, **kwargs) -> Job:
        holder: list[Job] = []

        def reply(outcome: Outcome) -> None:
            with self.event:
                self.got.setdefault(holder[0].id, []).append(outcome)
                self.event.notify_all()

        job = Job(src, Settings(beam=beam, **kwargs), False, reply)
        holder.append(job)
        return job

    def wait(self, job: Job, timeout: float = 30.0) -> Outcome:
        with self.event:
            assert self.event.wait_for(lambda: job.id in self.got, timeout), "no answer"
            return self.got[job.id][0]


@pytest.mark.parametrize("max_len", [64, 256])
def test_the_budget_uses_the_decoders_length_rule(max_len):
    cfg = tiny_config(max_len=max_len)
    for a, b in [(1.0, 50), (1.2, 10), (0.5, 0), (2.0, 200)]:
        budget = CacheBudget(10**9, max_len, a, b)
        lengths = list(range(1, 300))
        src = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for i, n in enumerate(lengths):
            src[i, :n] = 3
        want = length_limits(cfg, src, None, a, b).tolist()
        assert [budget.output_limit(n) for n in lengths] == want
    budget = CacheBudget(1000, max_len)
    assert budget.cost(3, 4, 10) == 3 * 4 * (10 + 60)
    translator = Translator(Transformer(cfg), None)
    assert CacheBudget.for_translator(1000, translator) == budget  # the paper's rule
    translator.defaults = DecodeOptions(max_len_a=1.5, max_len_b=7, max_new_tokens=40)
    assert CacheBudget.for_translator(1000, translator) == CacheBudget(1000, 40, 1.5, 7)
    with pytest.raises(TooLargeError, match="2 sentences x beam 4 x \\(100 source \\+ "):
        budget.check(Outcomes().job([[5] * 100, [], [5] * 7]))


def test_the_budget_counts_a_forced_prefix_as_the_searches_do():
    cfg = tiny_config(max_len=64)
    options = DecodeOptions(max_len_a=0.0, max_len_b=5)  # outputs of at most 5 tokens
    budget = CacheBudget(90, 64, 0.0, 5)
    prefix = [[4] * 20]  # ... but a forced prefix of 20 needs 21, EOS included
    forced = forced_ids(prefix, cfg, 1)
    src = torch.full((1, 3), 3)
    assert budget.output_limit(3, 20) == search_limits(cfg, src, options, forced)[0] == 21
    free = Outcomes().job([[3] * 3])
    budget.check(free)  # 1 x beam 4 x (3 + 5) = 32
    with pytest.raises(TooLargeError, match=r"1 sentences x beam 4 x \(3 source \+ 21 output"):
        budget.check(dataclasses.replace(free, prefix=prefix))  # 4 x (3 + 21) = 96
    assert budget.cost_of([free, dataclasses.replace(free, prefix=prefix)], 1) == 2 * 24


def test_batch_keys_are_frozen_dataclasses():
    outcomes = Outcomes()
    a, b = outcomes.job([[5]], beam=4, alpha=0.2), outcomes.job([[6]], beam=4, alpha=1.0)
    # alpha may differ (and n_best): the search's other settings may not
    assert a.key == b.key == BatchKey(Settings(4, 0.0))
    c = outcomes.job([[6]], beam=4, length_penalty="hf")
    assert c.key != a.key and c.key.rows == 4
    greedy = outcomes.job([[5]], beam=1, alpha=0.2)
    assert greedy.key == BatchKey(Settings(1, 0.0)) != a.key
    # sampling: n_best is the rows per sentence, so it is part of the key
    sample = outcomes.job([[5]], beam=1, n_best=3, sampling=True)
    assert sample.key.rows == 3
    assert sample.key != outcomes.job([[5]], beam=1, n_best=2, sampling=True).key
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.key.search = Settings(5)  # type: ignore[misc]


def test_a_running_batch_admits_steps_and_cancels(translator):
    ids = [translator.encode(de) for de, _ in PAIRS[:6]]
    outcomes = Outcomes()
    a = outcomes.job([ids[0], [], ids[1]], beam=3)
    b = outcomes.job([ids[2]], beam=3, alpha=1.0, n_best=2)
    c = outcomes.job([ids[3], ids[4]], beam=3)
    blank = outcomes.job([[]], beam=3)
    batch = RunningBatch(translator)
    assert batch.admit([a, blank]) and batch.key == BatchKey(Settings(3, 0.0))  # blank leaves
    assert len(batch) == 2 and batch.jobs == [a]
    batch.step()
    assert batch.admit([b, c]) == []  # two length penalties: two adds
    assert len(batch) == 5 and batch.jobs == [a, b, c]
    batch.step()
    batch.cancel(c)  # its two sentences leave; nobody gets its outputs
    assert len(batch) == 3 and batch.jobs == [a, b]
    finished = {}
    while len(batch):
        for gone in batch.step():
            assert gone.error is None
            finished[gone.job.id] = [[h.tokens for h in c] for c in gone.outputs]
    assert set(finished) == {a.id, b.id}
    for job in (a, b):
        offline = translator.hypotheses(job.src, job.settings)
        assert finished[job.id] == [[h.tokens for h in c] for c in offline]
    assert batch.key is None and batch.jobs == []


def test_a_failing_step_empties_the_batch_and_names_every_job(translator):
    controlled = ControlledTranslator(translator.model, translator.tokenizer)
    controlled.fail_at_running = 1
    outcomes = Outcomes()
    jobs = [outcomes.job([translator.encode(de)], beam=2) for de, _ in PAIRS[:2]]
    batch = RunningBatch(controlled)
    batch.admit(jobs)
    left = batch.step()
    assert [gone.job for gone in left] == jobs
    assert all("fell over" in str(gone.error) for gone in left)
    assert len(batch) == 0 and batch.key is None


def test_cancel_while_queued_and_while_running_ends_each_job_once(translator):
    controlled = ControlledTranslator(translator.model, translator.tokenizer)
    metrics = Metrics()
    worker = BatchWorker(controlled, metrics, batch_wait_ms=0, join_ratio=0)
    outcomes = Outcomes()
    ids = [translator.encode(de) for de, _ in PAIRS[:3]]
    running, queued, late = (outcomes.job([s], beam=b) for s, b in zip(ids, (4, 2, 4)))
    controlled.gate.clear()
    worker.start()
    try:
        worker.submit(running)
        assert controlled.entered.wait(10)  # its first step waits at the gate
        worker.submit(queued)  # another beam size: waits for the batch to drain
        worker.submit(late)
        assert worker.held()["queued"] == 2 and metrics.queue_sentences == 2
        worker.cancel(queued)  # queued: ends here and now
        assert outcomes.wait(queued).status is Status.CANCELLED
        assert worker.held()["queued"] == 1 and metrics.queue_sentences == 1
        worker.cancel(running, Status.TIMED_OUT)  # running: leaves before the next step
        controlled.gate.set()
        assert outcomes.wait(running).status is Status.TIMED_OUT
        assert outcomes.wait(late).status is Status.DONE
        worker.cancel(late)  # ended already: nothing happens
        worker.cancel(queued)
    finally:
        controlled.gate.set()
        worker.stop()
    assert all(len(got) == 1 for got in outcomes.got.values()), outcomes.got
    assert set(worker.held().values()) == {0}, worker.held()
    assert metrics.jobs_ended == {"done": 1, "failed": 0, "cancelled": 1, "timed_out": 1}
    assert metrics.jobs_open == metrics.queue_sentences == metrics.running_sentences == 0


def test_a_worker_that_dies_fails_every_job_and_refuses_new_ones(translator):
    controlled = ControlledTranslator(translator.model, translator.tokenizer)
    deaths: list[str] = []
    worker = BatchWorker(controlled, Metrics(), batch_wait_ms=0, on_death=deaths.append)
    outcomes = Outcomes()
    ids = [translator.encode(de) for de, _ in PAIRS[:2]]
    first, second = outcomes.job([ids[0]], beam=4), outcomes.job([ids[1]], beam=2)

    def broken_admit():
        raise ZeroDivisionError("a bug in the scheduler")

    worker._admit = broken_admit  # runs between two steps, outside any model call
    controlled.gate.clear()
    worker.start()
    try:
        worker.submit(first)
        assert controlled.entered.wait(10)
        worker.submit(second)
        controlled.gate.set()
        for job in (first, second):
            outcome = outcomes.wait(job)
            assert outcome.status is Status.FAILED and isinstance(outcome.error, StoppedError)
            assert "the batching worker failed: ZeroDivisionError: a bug" in str(outcome.error)
        worker._thread.join(10)
        assert not worker.alive and deaths == [worker.failure]
        with pytest.raises(StoppedError, match="ZeroDivisionError"):
            worker.submit(outcomes.job([ids[0]]))
    finally:
        controlled.gate.set()
        worker.stop()
    assert set(worker.held().values()) == {0}


def held_maps(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The worker's attention maps, made only once the test sets ``release``: (``entered``,
    set when the attention thread starts on a job's maps, ``release``)."""
    entered, release = threading.Event(), threading.Event()

    def slow_maps(*args, **kwargs):
        entered.set()
        assert release.wait(30), "the test never released the maps"
        return attention_maps(*args, **kwargs)

    monkeypatch.setattr("aiayn.serve.batching.attention_maps", slow_maps)
    return entered, release


def test_attention_maps_are_made_beside_the_running_batch(translator, monkeypatch):
    """A job that asks for attention leaves the batch for the attention thread: while its
    maps are being made (held here until ``release``), the worker goes on decoding."""
    entered, release = held_maps(monkeypatch)
    worker = BatchWorker(translator, Metrics(), batch_wait_ms=0, join_ratio=0)
    outcomes = Outcomes()
    ids = [translator.encode(de) for de, _ in PAIRS[:2]]
    mapped, plain = outcomes.job([ids[0]], beam=2), outcomes.job([ids[1]], beam=2)
    mapped.attention = True
    worker.start()
    try:
        worker.submit(mapped)
        assert entered.wait(30)  # its maps are being made, and held
        worker.submit(plain)
        assert outcomes.wait(plain, timeout=10).status is Status.DONE
        assert mapped.id not in outcomes.got
        release.set()
        done = outcomes.wait(mapped)
        assert done.status is Status.DONE and done.value.attention[0] is not None
    finally:
        release.set()
        worker.stop()


def test_a_job_cancelled_while_its_maps_are_made_by_an_idle_worker_is_cancelled(
    translator, monkeypatch
):
    """A client that left while its attention maps were made, the worker otherwise idle:
    the cancel waited in the worker's records (held() not 0 when idle) until another
    request came, and the job was counted done, where a busy worker counted it cancelled."""
    entered, release = held_maps(monkeypatch)
    metrics = Metrics()
    worker = BatchWorker(translator, metrics, batch_wait_ms=0, join_ratio=0)
    outcomes = Outcomes()
    mapped = outcomes.job([translator.encode(PAIRS[0][0])], beam=2)
    mapped.attention = True
    worker.start()
    try:
        worker.submit(mapped)
        assert entered.wait(30)  # decoded; its maps are being made, and held
        time.sleep(0.3)  # the worker waits for a job now (it then slept through the cancel)
        worker.cancel(mapped)
        assert outcomes.wait(mapped, timeout=10).status is Status.CANCELLED
        assert set(worker.held().values()) == {0}, worker.held()
    finally:
        release.set()
        worker.stop()
    assert metrics.jobs_ended == {"done": 0, "failed": 0, "cancelled": 1, "timed_out": 0}
    assert len(outcomes.got[mapped.id]) == 1  # the maps, made after, answer nothing


def test_the_running_batch_decodes_ensembles_and_forced_prefixes(translator):
    """An ensemble Translator's continuous batch decodes with every model, and a job with
    forced prefixes joins it like any other: each gets its offline hypotheses."""
    other = Transformer(translator.model.cfg).eval()
    other.load_state_dict(translator.model.state_dict())
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.9)  # a second member that changes the averaged distribution
    ensemble = Translator([translator.model, other], translator.tokenizer)
    ids = [translator.encode(de) for de, _ in PAIRS[:4]]
    prefix = [translator.tokenizer.encode_target(t) for t in ("A", "Two men")]
    outcomes = Outcomes()
    free = outcomes.job(ids[:2], beam=3, n_best=2)
    forced = outcomes.job(ids[2:], beam=3, n_best=2)
    forced.prefix = prefix
    assert free.key == forced.key  # one running batch
    batch = RunningBatch(ensemble)
    batch.admit([free])
    batch.step()
    assert batch.admit([forced]) == []
    finished = {}
    while len(batch):
        for gone in batch.step():
            finished[gone.job.id] = [[h.tokens for h in c] for c in gone.outputs]
    for job, alone in ((free, None), (forced, prefix)):
        want = ensemble.hypotheses(job.src, job.settings, alone)
        assert finished[job.id] == [[h.tokens for h in c] for c in want]
        single = translator.hypotheses(job.src, job.settings, alone)
        assert finished[job.id] != [[h.tokens for h in c] for c in single]  # both models
    assert all(c[0][: len(p)] == p for c, p in zip(finished[forced.id], prefix))


def test_an_ensemble_serves_within_its_fewest_positions(translator):
    """The server checked prefixes against the first member's positions while the engine
    decodes within the fewest: a prefix that fits the first member only was a 500 for its
    request and for every request admitted beside it. Now a 422 when parsed; and a job the
    model rejects in the running batch fails alone."""
    from fastapi.testclient import TestClient

    from aiayn.serve import ServeConfig, create_app

    cfg = translator.model.cfg
    short = Transformer(dataclasses.replace(cfg, max_len=cfg.max_len // 2)).eval()
    short.load_state_dict(translator.model.state_dict())  # the position table is computed
    ensemble = Translator([translator.model, short], translator.tokenizer)
    assert ensemble.max_len == cfg.max_len // 2
    assert f"within the model's {cfg.max_len // 2} positions" in ensemble.length_rule
    ids = [translator.encode(de) for de, _ in PAIRS[:2]]
    outcomes = Outcomes()
    innocent, bad = outcomes.job(ids[:1], beam=2), outcomes.job(ids[1:], beam=2)
    bad.prefix = [[translator.tokenizer.encode_target("A")[0]] * (cfg.max_len // 2)]
    batch = RunningBatch(ensemble)
    left = batch.admit([innocent, bad])
    assert [gone.job for gone in left] == [bad] and "leave no room for EOS" in str(left[0].error)
    assert batch.jobs == [innocent]
    while len(batch):
        for gone in batch.step():
            assert gone.job is innocent and gone.error is None
    words = " ".join(["A"] * (cfg.max_len // 2))
    with TestClient(create_app(ensemble, ServeConfig(worker="thread"))) as c:
        r = c.post("/translate", json={"src": [PAIRS[0][0]], "beam": 2, "prefix": words})
        assert r.status_code == 422 and "prefix" in r.text, r.text
        info = c.get("/info").json()["model"]
        assert f"within the model's {cfg.max_len // 2} positions" in info["length_rule"]
        r = c.post("/translate", json={"src": [PAIRS[0][0]], "beam": 2})
        assert r.status_code == 200, r.text


def test_serve_takes_several_models_as_an_ensemble(sample_model_dir):
    """`aiayn serve --model A --model B` loads an ensemble, as `aiayn translate` does."""
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    from fastapi.testclient import TestClient

    from aiayn.cli import build_parser
    from aiayn.cli.flags import translator_for
    from aiayn.serve import ServeConfig, create_app

    folder = str(sample_model_dir())
    args = build_parser().parse_args(["serve", "--model", folder, "--model", folder])
    assert args.model == [folder, folder]
    ensemble = translator_for(args)
    assert len(ensemble.models) == 2
    with TestClient(create_app(ensemble, ServeConfig(worker="thread"))) as c:
        info = c.get("/info").json()["model"]  # what runs: two models, each counted
    assert info["models"] == 2
    assert info["parameters"] == 2 * ensemble.model.num_parameters()
