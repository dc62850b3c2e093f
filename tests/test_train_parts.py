"""Label-smoothed loss and the warmup schedule, against their definitions."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from aiayn.errors import RecipeError
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.train.optim import make_optimizer
from aiayn.train.schedule import NoamSchedule, noam_rate, scheduled_rate


def test_loss_equals_torch_label_smoothing_and_ignores_pads():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0
    loss, nll, n = label_smoothed_cross_entropy(logits, target, epsilon=0.1, pad_id=0)
    expected = F.cross_entropy(
        logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=0.1, reduction="sum"
    )
    assert n == 13
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(
        nll, F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    )
    logits2 = logits.clone()
    logits2[0, 3:] = 100.0  # pad positions: anything
    assert label_smoothed_cross_entropy(logits2, target, 0.1)[0].item() == pytest.approx(
        loss.item()
    )


def test_smoothed_loss_is_minimal_at_the_smoothed_distribution():
    V, eps = 10, 0.1
    target = torch.tensor([3])
    best = torch.full((1, V), eps / V).log()
    best[0, 3] = torch.tensor(1 - eps + eps / V).log()
    sharp = torch.full((1, V), -20.0)
    sharp[0, 3] = 0.0
    assert (
        label_smoothed_cross_entropy(best, target, eps)[0]
        < label_smoothed_cross_entropy(sharp, target, eps)[0]
    )


def test_noam_rate_matches_equation_3():
    d, w = 512, 4000
    for step in (1, 100, 3999, 4000, 4001, 100000):
        expected = d**-0.5 * min(step**-0.5, step * w**-1.5)
        assert noam_rate(step, d, w) == pytest.approx(expected)
    assert noam_rate(4000, d, w) == pytest.approx((d * w) ** -0.5)  # the peak
    assert noam_rate(2000, d, w) < noam_rate(4000, d, w) > noam_rate(8000, d, w)


def test_schedule_drives_the_optimizer_and_resumes():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([param])
    sched = NoamSchedule(opt, d_model=64, warmup=10, scale=2.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(noam_rate(1, 64, 10, 2.0))
    for _ in range(5):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(noam_rate(6, 64, 10, 2.0))
    opt2 = torch.optim.Adam([param])
    resumed = NoamSchedule(opt2, d_model=64, warmup=10, scale=2.0)
    resumed.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_budgeted_schedules_share_the_warmup_and_reach_zero_at_the_end():
    d, w = 256, 100
    peak = noam_rate(w, d, w)
    for kind in ("linear", "cosine", "noam_cooldown"):
        assert scheduled_rate(kind, w, 0.0, d, w) == pytest.approx(peak)  # Eq. 3's peak
        assert scheduled_rate(kind, w // 2, 0.0, d, w) == pytest.approx(peak / 2)  # warmup
        assert scheduled_rate(kind, 5000, 1.0, d, w) == 0.0  # budget spent
        rates = [scheduled_rate(kind, w + i, i / 100, d, w) for i in range(101)]
        assert all(a >= b for a, b in itertools.pairwise(rates))  # only down after warmup
    assert scheduled_rate("linear", w, 0.25, d, w) == pytest.approx(0.75 * peak)
    assert scheduled_rate("cosine", w, 0.5, d, w) == pytest.approx(0.5 * peak)
    # Inverse square root until the cool-down (the last 20%), then linearly to 0.
    assert scheduled_rate("noam_cooldown", 400, 0.8, d, w) == pytest.approx(noam_rate(400, d, w))
    assert scheduled_rate("noam_cooldown", 400, 0.9, d, w) == pytest.approx(
        noam_rate(400, d, w) / 2
    )
    assert scheduled_rate("noam", 400, 0.9, d, w) == noam_rate(400, d, w)  # no budget


def test_a_budgeted_schedule_reads_the_budget_and_resumes():
    used = {"now": 0.0}
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    sched = NoamSchedule(opt, 64, 10, kind="linear", time_used=lambda: used["now"])
    for _ in range(20):
        sched.step()
    used["now"] = 0.5
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * noam_rate(10, 64, 10))
    opt2 = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    resumed = NoamSchedule(opt2, 64, 10, kind="linear", time_used=lambda: used["now"])
    resumed.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    with pytest.raises(RecipeError, match="needs a budget"):
        NoamSchedule(opt, 64, 10, kind="cosine")
    steps = NoamSchedule(opt, 64, 10, kind="linear", max_steps=40)  # updates: 20 of 40 done
    for _ in range(20):
        steps.step()
    assert steps.rate() == pytest.approx(0.5 * noam_rate(10, 64, 10))
    with pytest.raises(RecipeError, match="schedule must be one of"):
        NoamSchedule(opt, 64, 10, kind="step")


def test_weight_decay_is_decoupled_and_spares_the_1d_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    plain = make_optimizer(model)
    assert type(plain) is torch.optim.Adam and len(plain.param_groups) == 1
    opt = make_optimizer(model, weight_decay=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    NoamSchedule(opt, d_model=16, warmup=10)  # sets the rate of both groups
    lr = opt.param_groups[0]["lr"]
    assert lr > 0 and opt.param_groups[1]["lr"] == lr
    for p in model.parameters():  # zero gradients: Adam's own step is 0, only the decay moves
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, p0 in zip(model.parameters(), before, strict=True):
        expected = p0 * (1 - lr * 0.5) if p.ndim >= 2 else p0
        torch.testing.assert_close(p.detach(), expected)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(RecipeError, match="weight_decay"):
            make_optimizer(model, weight_decay=bad)


def test_own_files_with_a_recipe_that_names_a_data_set_fetch_nothing(tmp_path, monkeypatch):
    """recipes/multi30k.yaml names `dataset: multi30k/de-en`; given all four files on the
    command line, training must not fetch Multi30k (offline, that would fail)."""
    from aiayn.distributed import World
    from aiayn.train import rundir
    from aiayn.train.recipe import Recipe

    class PreparedError(Exception):
        pass

    def fetch(*args, **kwargs):
        raise AssertionError("fetched the recipe's data set although every file was given")

    def prepare(*args, **kwargs):
        raise PreparedError

    monkeypatch.setattr(rundir, "pair_files", fetch)
    monkeypatch.setattr(rundir, "prepare", prepare)
    files = {k: str(tmp_path / k) for k in ("train_src", "train_tgt", "valid_src", "valid_tgt")}
    recipe = Recipe.from_dict({"dataset": "multi30k/de-en", **files})
    run = rundir.RunDirectory(tmp_path / "run", World(0, 1, 0), log=print)
    with pytest.raises(PreparedError):
        run.prepared_data(recipe, None)
    recipe = Recipe.from_dict({"dataset": "multi30k/de-en", **files, "valid_tgt": ""})
    with pytest.raises(AssertionError, match="fetched"):  # a missing file is still fetched
        run.prepared_data(recipe, None)
