"""aiayn.train.update behaviour the other tests leave loose: a rank's zero-weight copies
count for nothing, the compile note counts only this updater's graphs, and building a
compiled updater raises dynamo's recompile limit to the bucket count."""

from __future__ import annotations

import copy

import pytest
import torch

from aiayn.data.batching import BUCKETS, collate
from aiayn.distributed import World
from aiayn.model.transformer import Transformer
from aiayn.train.schedule import NoamSchedule
from aiayn.train.update import Updater
from conftest import tiny_config


def make_updater(model: Transformer, **options) -> Updater:
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    return Updater(
        model, optimizer, NoamSchedule(optimizer, model.cfg.d_model, 10), World(), **options
    )


class LonePeer(World):
    """Rank 1 of 2 whose peer adds nothing to a sum (no process group: the step is not
    wrapped in DDP, so the gradient is this rank's alone, before DDP's averaging)."""

    def sum(self, values):
        return [float(v) for v in values]


def test_a_ranks_zero_weight_copy_adds_no_token_loss_or_gradient():
    """Rank 1 of 2 runs group[1] (of 3) and a zero-weight copy of group[0]: the tokens and loss are
    group[1]'s alone, and the gradient is W times its per-token mean (DDP then averages)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    alone = copy.deepcopy(model)
    group = [collate([[5, 6, 7]], [[8, 9, 10, 11]]), collate([[5, 6]], [[12, 13]])] * 2
    group = group[:3]
    updater = make_updater(model)
    updater.world = LonePeer(1, 2)
    got = updater.update(group)
    want = make_updater(alone).update([group[1]])
    assert got.n_tokens == want.n_tokens == 3
    assert got.loss == pytest.approx(want.loss, abs=1e-6)
    for (name, a), b in zip(model.named_parameters(), alone.parameters()):
        assert torch.allclose(a.grad, 2 * b.grad, atol=1e-6), name


def test_the_compile_note_counts_this_updaters_graphs_only(monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setitem(counters["stats"], "unique_graphs", 5)  # graphs of earlier steps
    updater = make_updater(Transformer(tiny_config()), compile=True)
    assert updater.compile_note() == "; torch.compile: 0 graphs"
    counters["stats"]["unique_graphs"] = 7
    assert updater.compile_note() == "; torch.compile: 2 graphs"
    assert make_updater(Transformer(tiny_config())).compile_note() == ""


def test_a_compiled_updater_allows_a_graph_per_bucket(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    make_updater(Transformer(tiny_config()), compile=True)
    assert torch._dynamo.config.recompile_limit == len(BUCKETS) + 2
    torch._dynamo.config.recompile_limit = 64  # a larger one is kept
    make_updater(Transformer(tiny_config()), compile=True)
    assert torch._dynamo.config.recompile_limit == 64


def test_bf16_runs_the_step_in_bf16():
    """test_train_update bounds a bf16 update's distance from fp32; this pins that it
    differs at all (autocast on), so a step silently left in fp32 is caught."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    reference = copy.deepcopy(model)
    batch = collate([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14, 15, 16, 17]])
    got = make_updater(model, precision="bf16").update([batch])
    want = make_updater(reference).update([batch])
    assert got.loss != want.loss and got.loss == pytest.approx(want.loss, rel=4e-3)


def test_only_rank_0_prunes_the_checkpoints_it_wrote(tmp_path):
    """Every rank removed the epoch checkpoints past keep_last from its own --out: on a
    machine without the shared folder, another run's files of the same names."""
    from types import SimpleNamespace

    from aiayn.train.duties import Duties

    class Stub(SimpleNamespace):  # Duties holds its trainer by a weak reference
        pass

    names = [f"checkpoint_epoch{i:03d}.pt" for i in range(1, 4)]
    for rank in (1, 0):
        folder = tmp_path / f"rank{rank}"
        folder.mkdir()
        for name in names:
            (folder / name).write_text("another run's")
        trainer = Stub(
            out_dir=folder, world=World(rank, 2), step=0, elapsed=0.0, epoch_checkpoints=[]
        )
        trainer.recipe = SimpleNamespace(keep_last=1, save_every_minutes=0)
        trainer.save = lambda name, pending=False: None  # rank 0 writes (Trainer.save)
        duties = Duties(trainer)
        for name in names:
            duties.keep(name)
        assert trainer.epoch_checkpoints == names[-1:]
        left = sorted(p.name for p in folder.iterdir())
        assert left == (names if rank else names[-1:]), rank
