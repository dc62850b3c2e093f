"""Label-smoothed loss, the warmup schedule and the optimizer against their definitions, and
validation's translations against the Translator's."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from aiayn.errors import RecipeError
from aiayn.train.loss import label_smoothed_cross_entropy, token_losses
from aiayn.train.optim import make_optimizer
from aiayn.train.recipe import Recipe
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


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_losses_per_position_of_a_batch_without_pads(eps):
    """[B, T, V] logits with no pad target (the path that keeps the batch's shape): per
    position and summed, as torch computes them; epsilon 0.1 (the paper's) by default."""
    torch.manual_seed(1)
    logits, target = torch.randn(2, 4, 7), torch.randint(1, 7, (2, 4))
    want = F.cross_entropy(logits.transpose(1, 2), target, label_smoothing=eps, reduction="none")
    nll = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    loss, got_nll = token_losses(logits, target, eps)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(got_nll, nll)
    total, total_nll, n = label_smoothed_cross_entropy(logits, target, eps)
    torch.testing.assert_close(total, want.sum())
    torch.testing.assert_close(total_nll, nll.sum())
    assert n == 8
    if eps == 0.1:  # the defaults
        torch.testing.assert_close(token_losses(logits, target)[0], want)
        torch.testing.assert_close(label_smoothed_cross_entropy(logits, target)[0], want.sum())
    target[1, 2:] = 0  # pad id 0 by default: those positions drop out
    assert label_smoothed_cross_entropy(logits, target, eps)[2] == 6


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


def test_the_optimizer_is_section_5_3s_adam_and_takes_the_settings_given():
    """No test looked at the optimizer's settings: torch's default beta2 0.999 in place of
    0.98, or the betas dropped on the way to torch.optim.Adam, trained on unnoticed."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    assert (Recipe().adam_betas, Recipe().adam_eps) == ((0.9, 0.98), 1e-9)
    for decay in (0.0, 0.1):  # Adam, and AdamW's two groups
        paper = make_optimizer(model, weight_decay=decay).param_groups
        assert [(g["betas"], g["eps"]) for g in paper] == [((0.9, 0.98), 1e-9)] * len(paper)
        given = make_optimizer(model, (0.8, 0.9), 1e-7, decay).param_groups
        assert [(g["betas"], g["eps"]) for g in given] == [((0.8, 0.9), 1e-7)] * len(given)


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


def test_schedule_edges_defaults_and_refusals():
    d, w = 256, 100
    peak = noam_rate(w, d, w)
    # The budget fraction is clamped to [0, 1]: over budget the rate stays 0.
    assert scheduled_rate("linear", w, 1.5, d, w) == 0.0
    assert scheduled_rate("linear", w, -0.5, d, w) == pytest.approx(peak)
    # The scale multiplies every kind, warmup and cool-down alike.
    assert scheduled_rate("linear", w, 0.0, d, w, scale=2.0) == pytest.approx(2 * peak)
    half = noam_rate(400, d, w) / 2
    assert scheduled_rate("noam_cooldown", 400, 0.9, d, w, scale=3.0) == pytest.approx(3 * half)
    # Step 1 is the first warmup step (step 0 counts as 1).
    for step in (0, 1):
        assert scheduled_rate("cosine", step, 0.0, d, w) == pytest.approx(peak / w)
    names = "noam, linear, cosine, noam_cooldown"
    with pytest.raises(RecipeError) as e:
        scheduled_rate("step", 1, 0.0, d, w)
    assert str(e.value) == f"schedule must be one of {names}, got 'step'"

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert NoamSchedule(opt, 512).rate() == pytest.approx(noam_rate(1, 512, 4000))  # default
    NoamSchedule(opt, 64, warmup=1)  # the least warmup
    refusals = [
        (dict(warmup=0), "warmup must be >= 1 step, got 0"),
        (dict(kind="step"), f"schedule must be one of {names}, got 'step'"),
        (
            dict(kind="linear"),
            "schedule 'linear' decays to 0 at the end of the run: it needs a budget "
            "(max_steps or time_limit_minutes)",
        ),
        (dict(cooldown=0.0), "cooldown must be a fraction in (0, 1], got 0.0"),
        (dict(cooldown=1.5), "cooldown must be a fraction in (0, 1], got 1.5"),
    ]
    for options, message in refusals:
        with pytest.raises(RecipeError) as e:
            NoamSchedule(opt, 64, **options)
        assert str(e.value) == message
    # The whole budget as cool-down, and a rate asked for at a given step.
    sched = NoamSchedule(opt, 64, warmup=10, kind="noam_cooldown", max_steps=100, cooldown=1.0)
    for _ in range(50):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(noam_rate(51, 64, 10) * 0.5)
    sched = NoamSchedule(opt, 64, warmup=10, kind="noam_cooldown", max_steps=100, cooldown=0.5)
    for _ in range(75):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(noam_rate(76, 64, 10) * 0.5)
    assert sched.rate(20) == pytest.approx(noam_rate(20, 64, 10) * 0.5)
    assert sched.state_dict() == {"step_count": 75, "warmup": 10, "scale": 1.0}


def test_validation_translates_as_the_translator_and_keeps_the_models_mode(sample_model_dir):
    """Validation's translations are the Translator's (a blank line gets ""), and the model
    comes back in the mode it was in: training goes on right after."""
    from aiayn.checkpoint import load_model, resolve_checkpoint
    from aiayn.train.validation import translate_texts
    from aiayn.translator import Translator
    from sample_data import PAIRS

    model, tokenizer, *_ = load_model(resolve_checkpoint(sample_model_dir()))
    lines = [de for de, _ in PAIRS[:6]] + ["  "]
    for beam in (1, 3):
        model.train()
        got = translate_texts(model, tokenizer, lines, beam, batch_size=4)
        assert model.training
        want = Translator(model, tokenizer).translate(lines, beam=beam)
        assert got == [outputs[0] for outputs in want] and got[-1] == ""
        assert len(set(got[:-1])) > 1  # real, different translations
    model.eval()
    translate_texts(model, tokenizer, lines[:2], 1)
    assert not model.training
