"""serve.running.RunningBatch: gaps the suite left (found by a mutation run)."""

from __future__ import annotations

from aiayn.serve.running import RunningBatch
from sample_data import PAIRS
from test_serve_jobs import Outcomes, translator  # noqa: F401 - the fixture


def test_an_empty_batch_steps_to_no_jobs(translator):  # noqa: F811
    batch = RunningBatch(translator)
    assert batch.step() == [] and len(batch) == 0 and batch.key is None


def test_cancelling_a_job_that_is_not_running_leaves_the_others_as_they_were(translator):  # noqa: F811
    ids = [translator.encode(de) for de, _ in PAIRS[:3]]
    outcomes = Outcomes()
    running = outcomes.job([ids[0], ids[1]], beam=2)
    stranger = outcomes.job([ids[2]], beam=2)
    batch = RunningBatch(translator)
    assert batch.admit([running]) == []
    batch.cancel(stranger)  # never admitted (or already gone): nothing happens
    batch.cancel(stranger)
    assert len(batch) == 2 and batch.jobs == [running]
    _decode(batch, translator, running)


def test_jobs_whose_search_cannot_start_leave_with_the_error(translator, monkeypatch):  # noqa: F811
    """admit: a search the translator refuses to start fails the jobs admitted, each
    with the error, and leaves the batch empty and without a key."""
    boom = RuntimeError("no search for you")

    def refuse(options):
        raise boom

    outcomes = Outcomes()
    jobs = [outcomes.job([translator.encode(de)], beam=2) for de, _ in PAIRS[:2]]
    batch = RunningBatch(translator)
    monkeypatch.setattr(translator, "continuous_search", refuse)
    left = batch.admit(jobs)
    assert [gone.job for gone in left] == jobs
    assert all(gone.error is boom and gone.outputs == [] for gone in left)
    assert len(batch) == 0 and batch.key is None and batch.jobs == []


def test_admitting_no_jobs_admits_nothing(translator):  # noqa: F811
    batch = RunningBatch(translator)
    assert batch.admit([]) == [] and batch.key is None and len(batch) == 0


def _decode(batch, translator, job):  # noqa: F811
    finished = []
    while len(batch):
        finished += batch.step()
    assert [gone.job for gone in finished] == [job]
    offline = translator.hypotheses(job.src, job.settings)
    assert [[h.tokens for h in c] for c in finished[0].outputs] == [
        [h.tokens for h in c] for c in offline
    ]


def test_a_batch_left_empty_takes_the_next_jobs_search_setting(translator):  # noqa: F811
    """The search goes with its last job (all-blank jobs leaving at once, a cancel, a
    failed step): the next job sets the key and decodes with its own beam."""
    from aiayn.serve.jobs import BatchKey, Settings
    from serve_util import ControlledTranslator

    ids = [translator.encode(de) for de, _ in PAIRS[:3]]
    outcomes = Outcomes()
    batch = RunningBatch(translator)
    blank = outcomes.job([[], []], beam=3)
    (gone,) = batch.admit([blank])
    assert gone.job is blank and gone.outputs == [[], []] and gone.error is None
    assert batch.key is None and batch.jobs == []
    one = outcomes.job([ids[0]], beam=2)
    assert batch.admit([one]) == [] and batch.key == BatchKey(Settings(2, 0.0))
    batch.cancel(one)
    assert batch.key is None and batch.jobs == [] and len(batch) == 0
    four = outcomes.job([ids[1]], beam=4)
    assert batch.admit([four]) == [] and batch.key == BatchKey(Settings(4, 0.0))
    _decode(batch, translator, four)
    assert batch.key is None

    controlled = ControlledTranslator(translator.model, translator.tokenizer)
    controlled.fail_at_running = 1
    failing = RunningBatch(controlled)
    job = outcomes.job([ids[2]], beam=2)
    failing.admit([job])
    (left,) = failing.step()
    assert left.job is job and left.error is not None
    assert failing.jobs == [] and failing.key is None and failing.clear() == []
