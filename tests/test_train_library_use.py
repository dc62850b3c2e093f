"""Training driven from Python, as a notebook drives it: train() again after an interrupt
holds the run directory again and finishes the duties of the step it was cut short in, a
Trainer that fails lets go of it while its traceback lives on, a run's weights do not
depend on what drew from the global random streams between Trainer() and train(), a
Recipe built in code is the one from_dict builds, and an empty output path or a model
field the tokenizer sets is refused in words that fit."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.errors import AiaynError, RecipeError
from aiayn.train.model_checks import check_new_model
from aiayn.train.recipe import MODEL_DEFAULTS, Recipe
from aiayn.train.trainer import Trainer
from cli_util import one_line_error
from test_train_refusals import TINY_RUN


def tiny(prepared: Path, *settings: str) -> Recipe:
    """A TINY_RUN recipe training on ``prepared``, with ``settings`` (key=value)."""
    return Recipe.from_dict({"data": str(prepared)}).override([*TINY_RUN, *settings])


def quiet(_line: str) -> None:
    pass


def held(directory: Path) -> bool:
    """Whether a run holds ``directory`` (its flock; see RunDirectory.hold)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # lets go of a lock taken here
    return False


def test_the_trainers_optimizer_takes_the_recipes_adam_settings(tmp_path, sample_prepared):
    settings = ("adam_betas=[0.85, 0.95]", "adam_eps=1e-6")
    trainer = Trainer(tiny(sample_prepared, "max_steps=1", *settings), tmp_path / "r", log=quiet)
    try:
        groups = trainer.optimizer.param_groups
        assert [(g["betas"], g["eps"]) for g in groups] == [((0.85, 0.95), 1e-6)] * len(groups)
    finally:
        trainer.run.release()


def test_train_again_after_an_interrupt_holds_the_run_directory(
    tmp_path, sample_prepared, monkeypatch
):
    """A KeyboardInterrupt lets the directory go (train() ended); the next train() took it
    no more, and another run was let in beside it."""
    out = tmp_path / "run"
    trainer = Trainer(tiny(sample_prepared, "max_steps=4"), out, log=quiet)
    run_epoch, seen = trainer._run_epoch, []

    def interrupted(*_args: object) -> str:
        raise KeyboardInterrupt

    def watched(*args: object) -> str:
        seen.append(held(out))
        return run_epoch(*args)

    monkeypatch.setattr(trainer, "_run_epoch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(progress=False)
    assert not held(out)

    def beside(*_args: object) -> str:
        raise AssertionError("trained beside another run")

    monkeypatch.setattr(trainer, "_run_epoch", beside)
    other = os.open(out, os.O_RDONLY)  # another run takes the directory meanwhile
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(AiaynError, match="another run is using this run directory"):
            trainer.train(progress=False)
    finally:
        os.close(other)
    monkeypatch.setattr(trainer, "_run_epoch", watched)
    assert trainer.train(progress=False).step == 4
    assert seen and all(seen) and not held(out)


def test_train_again_after_a_ctrl_c_inside_an_update_ends_as_an_uninterrupted_run(
    tmp_path, sample_prepared
):
    """A Ctrl-C inside an update (most of a run's time) left it half done: its weights
    stepped or its dropout drawn, and its batch not counted. train() again then applied it
    twice or drew other masks (weights up to 0.36 apart). The update now ends first."""
    import signal

    recipe = tiny(sample_prepared, "max_steps=4", "model.dropout=0.3")
    whole_run = Trainer(recipe, tmp_path / "whole", log=quiet)
    whole_run.train(progress=False)
    trainer = Trainer(recipe, tmp_path / "cut", log=quiet)
    forwards = []

    def ctrl_c(module: torch.nn.Module, _inputs: object) -> None:
        forwards.append(module.training)
        if forwards.count(True) == 3:  # inside the third update
            signal.raise_signal(signal.SIGINT)

    hook = trainer.model.register_forward_pre_hook(ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(progress=False)
    hook.remove()
    assert trainer.step == 3  # the update the Ctrl-C came in was done whole
    assert trainer.train(progress=False).step == 4
    for name, weight in whole_run.model.state_dict().items():
        assert torch.equal(weight, trainer.model.state_dict()[name]), name
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_inside_an_update_stops_at_once(capfd):
    import signal

    from aiayn.train.update import whole

    reached = []
    with pytest.raises(KeyboardInterrupt), whole():
        signal.raise_signal(signal.SIGINT)
        reached.append("after the first")  # deferred to the block's end
        signal.raise_signal(signal.SIGINT)
        reached.append("after the second")
    assert reached == ["after the first"]
    assert "stopping once this update is done (Ctrl-C again: at once)" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with whole():  # no Ctrl-C: nothing raised
        reached.append("quiet")
    assert reached[-1] == "quiet"


def outcome(out: Path) -> tuple[list[dict], dict[str, tuple]]:
    """What a run left in ``out``: its log (without its times) and, per checkpoint, the
    position it holds and whether it is pending."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    log = [{k: v for k, v in r.items() if k != "seconds"} for r in lines if r["kind"] != "speed"]
    keys = ("step", "epoch", "batch_in_epoch", "duties_pending", "best_bleu")
    saved = {p.name: load_checkpoint(p) for p in sorted(out.glob("checkpoint*.pt"))}
    return log, {name: tuple(state[k] for k in keys) for name, state in saved.items()}


@pytest.mark.parametrize(
    ("cut", "at", "settings"),
    [
        ("validation", 5, ("max_steps=5", "save_every_steps=2", "valid_every_steps=100")),
        ("validation", 2, ("max_steps=5", "valid_every_steps=2")),  # mid-run
        ("checkpoint_best.pt", 2, ("max_steps=2", "valid_every_steps=2")),
        ("checkpoint_last.pt", 3, ("max_steps=3", "save_every_steps=3")),  # at the epoch's end
    ],
)
def test_train_again_after_an_interrupt_in_a_steps_duties_does_them(
    tmp_path, sample_prepared, monkeypatch, cut, at, settings
):
    """Ctrl-C in a validation (or a save) of a step, then train() again: the step's duties
    were left undone (a resume does them, from the pending checkpoint). At the stop,
    "nothing to do": no final validation, best or epoch checkpoint, and checkpoint_last.pt
    of an earlier step; mid-run, the step was never validated. Now the run ends as one that
    was not interrupted: the same log, checkpoints and weights."""
    import aiayn.train.trainer as trainer_module

    alone = Trainer(tiny(sample_prepared, *settings), tmp_path / "alone", log=quiet)
    alone.train(progress=False)
    out = tmp_path / "run"
    trainer = Trainer(tiny(sample_prepared, *settings), out, log=quiet)
    validate, save, cuts = trainer.validate, trainer_module.save_checkpoint, []

    def cut_once() -> None:
        if not cuts:
            cuts.append(trainer.step)
            raise KeyboardInterrupt

    def validated() -> dict[str, float]:
        if cut == "validation":
            cut_once()
        return validate()

    def saved(state: dict, path: Path) -> Path:
        if Path(path).name == cut and not state["duties_pending"]:
            cut_once()
        return save(state, path)

    monkeypatch.setattr(trainer, "validate", validated)
    monkeypatch.setattr(trainer_module, "save_checkpoint", saved)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(progress=False)
    assert cuts == [at]
    result = trainer.train(progress=False)
    assert outcome(out) == outcome(tmp_path / "alone")
    assert same(weights(trainer), weights(alone))
    assert result.best_bleu == alone.best_bleu > -1


def test_train_again_keeps_what_a_resumed_trainer_logged(tmp_path, sample_prepared, monkeypatch):
    """A resumed trainer cut its log back to its checkpoint at every train(): called again
    after an interrupt, it cut away what the first call had logged (steps 3 and on)."""
    runs = []
    for name in ("alone", "run"):
        Trainer(tiny(sample_prepared, "max_steps=2"), tmp_path / name, log=quiet).train(
            progress=False
        )
        recipe = tiny(sample_prepared, "max_steps=5")
        runs.append(Trainer(recipe, tmp_path / name, resume=True, log=quiet))
    alone, resumed = runs
    alone.train(progress=False)
    validate = resumed.validate

    def interrupted() -> dict[str, float]:  # in its first validation (step 3: epoch end)
        monkeypatch.setattr(resumed, "validate", validate)
        raise KeyboardInterrupt

    monkeypatch.setattr(resumed, "validate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resumed.train(progress=False)
    resumed.train(progress=False)
    assert outcome(tmp_path / "run") == outcome(tmp_path / "alone")
    assert [r["step"] for r in outcome(tmp_path / "run")[0] if r["kind"] == "train"] == [
        *range(1, 6)
    ]


def test_a_trainer_that_fails_lets_go_of_the_run_directory(tmp_path, sample_prepared):
    """The exception, kept (as a notebook keeps the last one), holds the failed trainer in
    its traceback: the retry was refused as "another run is using this run directory"."""
    out = tmp_path / "run"
    out.mkdir()  # held from the start: it exists
    with pytest.raises(RecipeError, match=r"longer than model\.max_len=3") as failed:
        Trainer(tiny(sample_prepared, "model.max_len=3"), out, log=quiet)
    assert failed.value.__traceback__ is not None and not held(out)
    retry = Trainer(tiny(sample_prepared, "max_steps=1"), out, log=quiet)
    assert held(out)
    assert retry.train(progress=False).step == 1


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_does_not_depend_on_what_drew_from_the_global_streams(tmp_path, sample_prepared):
    """Dropout draws from torch's global generator: a draw between Trainer() and train(),
    or another trainer built or trained in between, changed the weights a recipe trains,
    new or resumed."""
    settings = ("model.dropout=0.3", "save_every_steps=1")
    alone = Trainer(tiny(sample_prepared, "max_steps=3", *settings), tmp_path / "a", log=quiet)
    alone.train(progress=False)
    wanted = weights(alone)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    first = Trainer(tiny(sample_prepared, "max_steps=3", *settings), tmp_path / "1", log=quiet)
    second = Trainer(tiny(sample_prepared, "max_steps=3", *settings), tmp_path / "2", log=quiet)
    torch.rand(3), random.random()
    first.train(progress=False)
    second.train(progress=False)
    assert same(weights(first), wanted) and same(weights(second), wanted)
    resumed = []  # from the same checkpoint, with and without a draw in between
    for name in ("a", "b"):
        recipe = tiny(sample_prepared, "max_steps=5", *settings)
        resumed.append(Trainer(recipe, tmp_path / name, resume=True, log=quiet))
    torch.rand(3)
    for trainer in resumed:
        trainer.train(progress=False)
        torch.rand(3)
    assert same(weights(resumed[0]), weights(resumed[1]))
    assert not same(weights(resumed[0]), wanted)  # it trained


def test_a_recipe_built_in_code_is_the_one_from_dict_builds(tmp_path, sample_prepared):
    """Recipe(model=...) replaced the default model (share_embeddings, max_len 256 lost)
    and recorded no model field as set, so a fine-tuning run ignored them; a model that
    is no mapping passed check() and failed in the Trainer with a TypeError."""
    model = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64}
    coded = Recipe(model=dict(model), max_steps=2)
    read = Recipe.from_dict({"model": dict(model), "max_steps": 2})
    assert coded.to_dict() == read.to_dict() and coded.model == {**MODEL_DEFAULTS, **model}
    assert coded.given_model_fields == read.given_model_fields == set(model)
    # The defaults, and copies of a recipe's whole model, set no field they do not change.
    assert Recipe().to_dict() == Recipe.from_dict({}).to_dict()
    assert Recipe().given_model_fields == set()
    assert dataclasses.replace(Recipe(), seed=2).given_model_fields == set()
    assert dataclasses.replace(read, seed=2).given_model_fields == set(model)
    assert Recipe.from_dict(read.to_dict()).to_dict() == read.to_dict()  # recipe.yaml
    read.save(tmp_path / "recipe.yaml")
    assert Recipe.from_yaml(tmp_path / "recipe.yaml").to_dict() == read.to_dict()
    # Set in code after it was made: check() merges it as the constructor does.
    later = Recipe()
    later.model = {"n_layers": 2}
    assert later.check().model == {**MODEL_DEFAULTS, "n_layers": 2}
    assert later.given_model_fields == {"n_layers"}
    for bad, message in [
        ("x", "^recipe: 'model' must be a mapping of model fields, got 'x'$"),
        ({"bogus": 1}, r"^recipe: model: unknown field\(s\): bogus$"),
    ]:
        with pytest.raises(RecipeError, match=message):
            Recipe(model=bad)  # type: ignore[arg-type]
    with pytest.raises(RecipeError, match=r"^recipe: a recipe is a mapping of field: value"):
        Recipe.from_dict(None)  # type: ignore[arg-type]
    # Fine-tuning refuses a model field of a recipe built in code, as one read from a file.
    base = Trainer(tiny(sample_prepared, "max_steps=1"), tmp_path / "base", log=quiet)
    base.train(progress=False)
    del base
    fine = Recipe(
        data=str(sample_prepared), init_from=str(tmp_path / "base"), model={"n_layers": 2}
    )
    with pytest.raises(RecipeError, match=r"model\.n_layers=2 contradicts the model being fine"):
        Trainer(fine.override(["threads=1", "device=cpu"]), tmp_path / "fine", log=quiet)


def test_an_empty_output_path_is_refused(tmp_path, sample_prepared, monkeypatch, capsys):
    """Path("") is the current directory: a script with an unset $RUN trained into it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AiaynError, match=r"^run directory: the path is empty$"):
        Trainer(tiny(sample_prepared, "max_steps=1"), "", log=quiet)
    argv = ["train", "--data", str(sample_prepared), "--out", "", "--no-progress"]
    err = one_line_error([*argv, "--set", *TINY_RUN, "max_steps=1"], capsys)
    assert "--out: the path is empty" in err
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_that_is_no_recipe_is_named(tmp_path, sample_prepared):
    """Trainer({...}) (a dict, as the YAML reads) was an AttributeError from inside."""
    with pytest.raises(RecipeError, match=r"^recipe: a dict, not a Recipe \(Recipe\.from_dict"):
        Trainer({"data": str(sample_prepared), "max_steps": 1}, tmp_path / "r", log=quiet)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("src_vocab_size", "(its vocabulary's size, from the recipe's vocab_size)"),
        ("tgt_vocab_size", "(its vocabulary's size, from the recipe's vocab_size)"),
        ("pad_id", "(its padding token's id)"),
        ("bos_id", "(its start-of-sentence token's id)"),
        ("eos_id", "(its end-of-sentence token's id)"),
    ],
)
def test_a_model_field_the_tokenizer_sets_is_refused_in_its_own_words(key, words):
    """Every one was refused with "(vocab_size the size)", which fits only the sizes."""
    with pytest.raises(RecipeError) as refused:
        check_new_model(Recipe.from_dict({"model": {key: 3}}))
    wanted = f"recipe field model.{key}: the tokenizer sets it {words}; leave it out"
    assert str(refused.value) == wanted


def test_a_checkpoint_from_more_gpus_restores_the_gpus_here(monkeypatch):
    """set_rng_state_all set one state per device saved: a checkpoint from 8 GPUs failed
    to resume on 1. Each device here takes its own (faked CUDA: none on this machine)."""
    import torch

    from aiayn.train.rng import rng_state, set_rng_state

    set_calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: set_calls.append((d, s)))
    states = [torch.full((4,), i, dtype=torch.uint8) for i in range(8)]
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    assert "cuda" in rng_state(cuda=True)
    rng = rng_state(cuda=True)
    set_rng_state(rng)
    assert [(d, s.tolist()) for d, s in set_calls] == [(0, [0, 0, 0, 0])]


def test_a_run_on_the_cpu_reads_no_cuda_state(monkeypatch):
    """Every rank read every GPU's random state at its start (and at each train()): on a
    machine with GPUs that starts CUDA, a context on GPU 0 per rank, for a CPU run."""
    import torch

    from aiayn.train.rng import rng_state

    def started() -> list:
        raise AssertionError("CUDA was asked for its random states")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", started)
    assert "cuda" not in rng_state(cuda=False)


def test_the_seeds_of_ranks_above_0_tell_apart_what_hash_did_not():
    from aiayn.decode.sampling import stream_seed

    assert hash(-1) == hash(-2)  # why not hash(): seeds -1 and -2 drew the same masks
    assert stream_seed(-1, 1, 0, 0) != stream_seed(-2, 1, 0, 0)
    assert stream_seed(1, 1, 0, 4) == stream_seed(1, 1, 0, 4) != stream_seed(1, 2, 0, 4)
