"""Translation split across processes with torchrun (gloo on the CPU): each rank decodes
its share of the lines and rank 0 writes one output, identical to a single process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.distributed import World
from sample_data import PAIRS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("n", "size"), [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_shards_cover_every_item_once_in_order(n, size):
    shards = [World(rank, size).shard(n) for rank in range(size)]
    assert [i for s in shards for i in s] == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def torchrun(*args: str, nproc: int = 2, script: Path | None = None) -> subprocess.CompletedProcess:
    """``aiayn ARGS`` (or ``script ARGS``) in ``nproc`` torchrun processes, 1 thread each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    program = [str(script)] if script is not None else ["-m", "aiayn"]
    command += ["--nproc-per-node", str(nproc), *program, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_torchrun_translate_and_evaluate_equal_one_process(sample_model_dir, tmp_path, capsys):
    model = str(sample_model_dir(False))
    lines = [s for s, _ in PAIRS[:23]]
    lines[5] = ""  # an empty line stays an empty line, in its place
    src = tmp_path / "in.de"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    one, two = tmp_path / "one.en", tmp_path / "two.en"
    common = ["--model", model, "--quiet", "--beam", "2"]
    assert main(["translate", *common, str(src), "-o", str(one)]) == 0
    done = torchrun("translate", *common, str(src), "-o", str(two))
    assert done.returncode == 0, done.stderr[-3000:]
    expected = one.read_text(encoding="utf-8")
    assert two.read_text(encoding="utf-8") == expected
    assert len(expected.splitlines()) == 23 and expected.splitlines()[5] == ""
    # In chunks of 5 lines (each shared by the two processes, rank 0 writing as they come).
    script = tmp_path / "chunked.py"
    script.write_text(
        "import sys\nfrom aiayn.cli import common, main\ncommon.CHUNK_LINES = 5\n"
        "sys.exit(main(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    three = tmp_path / "three.en"
    done = torchrun("translate", *common, str(src), "-o", str(three), script=script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert three.read_text(encoding="utf-8") == expected
    # A reader that leaves (`| head`): rank 0 stopped writing and exited 0, while rank 1
    # decoded on alone and failed the job at the next chunk's gather. A note is said once.
    lines[7] = "Ein Hund.\rZwei Katzen."  # CR line ends: the note of translate
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), "translate", *common, str(src)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    pipe = subprocess.PIPE
    with subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # gone before the first line
        err = proc.stderr.read()
        assert proc.wait(timeout=300) == 0, err[-3000:]
    assert err.count("note: ") == 1 and "1 line(s) hold a carriage return" in err, err
    assert "error" not in err.lower(), err[-3000:]

    ref = tmp_path / "ref.en"
    ref.write_text("".join(t + "\n" for _, t in PAIRS[:23]), encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", *common, "--src", str(src), "--ref", str(ref)]) == 0
    single = capsys.readouterr().out
    done = torchrun("evaluate", *common, "--src", str(src), "--ref", str(ref))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("BLEU") == 1  # rank 0 alone prints
    assert single.splitlines()[0] in done.stdout.splitlines()


def test_rank_0_says_after_each_chunk_whether_it_goes_on(sample_model_dir, monkeypatch):
    """translate_chunks' protocol: after each chunk every rank broadcasts, rank 0 saying
    True to go on, or False when its consumer stopped (a reader gone); past an empty
    input's one chunk nobody broadcasts (rank 0 alone would wait for ever)."""
    import dataclasses

    from aiayn import distributed
    from aiayn.cli import build_parser, common

    said: list[bool] = []

    @dataclasses.dataclass(frozen=True)
    class Rank0(World):
        def gather(self, items):  # the two ranks' shares
            return list(items) * 2

        def broadcast(self, obj):
            said.append(obj)
            return obj

    monkeypatch.setattr(distributed, "init_from_env", lambda *_a, **_k: Rank0(0, 2))
    args = build_parser().parse_args(["translate", "--model", str(sample_model_dir(False))])
    args.quiet = True
    lines = [de for de, _ in PAIRS[:3]]
    assert [a for a, _ in common.translate_chunks(args, lines, chunk_lines=2)] == [0, 2]
    assert said == [True, True]
    said.clear()
    chunks = common.translate_chunks(args, lines, chunk_lines=2)
    next(chunks)
    chunks.close()  # rank 0's consumer stopped at the first chunk
    assert said == [False]
    said.clear()
    empty = common.translate_chunks(args, [], chunk_lines=2)
    assert next(empty)[0] == 0
    empty.close()
    assert said == []


@pytest.mark.parametrize(
    ("device", "gpu", "joined", "own"),
    [
        ("auto", True, "cuda", "cuda:1"),  # each process its own GPU, and NCCL
        ("auto", False, "cpu", "cpu"),
        ("cuda:0", True, "cuda:0", "cuda:0"),  # a GPU named by the user stays that one
    ],
)
def test_translation_under_torchrun_resolves_auto_before_joining(
    monkeypatch, device, gpu, joined, own
):
    """``--device auto`` (the default) is resolved before the process group is joined: as
    ``auto`` it joined over gloo, and every process took the first GPU."""
    import torch

    from aiayn import distributed
    from aiayn.cli.flags import process_world

    asked: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        distributed, "init_from_env", lambda name, *_a: asked.append(name) or World(1, 2, 1)
    )
    world, got = process_world(device)
    assert (asked, got, world.rank) == ([joined], own, 1)


@pytest.mark.slow
def test_torchrun_refuses_stdin_and_pipes(sample_model_dir, tmp_path):
    """Each process would read its own stdin, or a share of a pipe's lines: refused before
    the pipe is opened (it has no writer here)."""
    model = ["--model", str(sample_model_dir(False)), "--quiet"]
    done = torchrun("translate", *model)
    assert done.returncode != 0
    assert "the input: several processes read each input, which must be a file" in done.stderr
    os.mkfifo(tmp_path / "ref.pipe")
    (tmp_path / "src.de").write_text("Ein Hund.\n", encoding="utf-8")
    done = torchrun("evaluate", *model, "--src", str(tmp_path / "src.de"), "--ref",
                    str(tmp_path / "ref.pipe"))  # fmt: skip
    assert done.returncode != 0
    assert (
        "--ref: several processes read each input, which must be a file, not stdin or a pipe"
        in done.stderr
    )


@pytest.mark.slow
def test_torchrun_samples_equal_one_process(sample_model_dir, tmp_path):
    """Each line's samples come from (seed, line index): two processes, each decoding its
    share of the lines in its own batches, write what one process writes."""
    model = str(sample_model_dir(False))
    src = tmp_path / "in.de"
    src.write_text("".join(s + "\n" for s, _ in PAIRS[:21]), encoding="utf-8")
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    common = ["--model", model, "--quiet", "--sampling", "--seed", "7", "--n-best", "2"]
    common += ["--format", "jsonl"]
    assert main(["translate", *common, str(src), "-o", str(one)]) == 0
    done = torchrun("translate", *common, str(src), "-o", str(two))
    assert done.returncode == 0, done.stderr[-3000:]
    expected = [json.loads(line) for line in one.read_text(encoding="utf-8").splitlines()]
    got = [json.loads(line) for line in two.read_text(encoding="utf-8").splitlines()]
    assert len(expected) == len(got) == 21
    for a, b in zip(got, expected):  # the same samples; scores to float noise (batches differ)
        assert [s["tokens"] for s in a["n_best"]] == [s["tokens"] for s in b["n_best"]]
        assert [s["logprob"] for s in a["n_best"]] == pytest.approx(
            [s["logprob"] for s in b["n_best"]], abs=1e-4
        )


def test_the_collective_timeout_is_passed_to_the_process_group(monkeypatch):
    import torch.distributed as dist

    from aiayn import distributed
    from aiayn.errors import AiaynError

    joined: dict = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: joined.update(kwargs))
    torchrun_env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    for name, value in {**torchrun_env, "MASTER_ADDR": "h", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    world = distributed.init_from_env("cpu", timeout_minutes=2.5)
    assert world == World(1, 2, 1)
    assert joined == {"backend": "gloo", "timeout": timedelta(minutes=2.5)}
    with pytest.raises(AiaynError, match="collective timeout must be > 0 minutes"):
        distributed.init_from_env("cpu", timeout_minutes=0)


class _UnpicklableError(Exception):
    def __reduce__(self):
        raise TypeError("not picklable")


def _forwarding(rank: int, store: str, out_dir: str) -> None:
    """Rank ``rank`` of 2 (spawned): what on_main and on_every_rank raise where."""
    import torch.distributed as dist

    from aiayn.train.rundir import RunDirectory

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    run = RunDirectory(Path(out_dir), World(rank, 2), lambda _: None)
    assert run.on_main(lambda: rank * 10 + 7) == 7  # rank 0's result, everywhere

    def fails_on_main() -> None:
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/data")

    with pytest.raises(FileNotFoundError) as raised:
        run.on_main(fails_on_main)
    assert raised.value.filename == "/nowhere/data" and raised.value.errno == 2

    def unpicklable() -> None:
        raise _UnpicklableError("a bug on rank 0")

    with pytest.raises(_UnpicklableError if rank == 0 else RuntimeError, match="a bug on rank 0"):
        run.on_main(unpicklable)

    def fails_on_rank_1() -> int:
        if rank == 1:
            raise ValueError("rank 1 cannot read it")
        return 1

    with pytest.raises(ValueError, match="rank 1 cannot read it"):
        run.on_every_rank(fails_on_rank_1)
    assert run.on_every_rank(lambda: rank) == rank  # no error: each its own result
    (Path(out_dir) / f"ok{rank}").write_text("ok")
    dist.destroy_process_group()


def test_any_error_of_rank_0_or_any_rank_is_raised_on_every_rank(tmp_path, monkeypatch):
    import torch.multiprocessing as tmp

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    out.mkdir()  # a RunDirectory makes it only to write into it
    tmp.start_processes(
        _forwarding, args=(str(tmp_path / "store"), str(out)), nprocs=2, start_method="spawn"
    )
    assert (out / "ok0").is_file() and (out / "ok1").is_file()


def _peer_leaves(rank: int, store: str, out_dir: str, where: str) -> None:
    """Rank ``rank`` of 2 (spawned): rank 1 dies (``os._exit``) before a collective of
    World (``where="world"``) or in the forward pass of an update (``"update"``, so that
    rank 0 fails in DDP's gradient all-reduce); rank 0 writes what it raised."""
    import torch
    import torch.distributed as dist

    from aiayn.data.batching import collate
    from aiayn.errors import AiaynError
    from aiayn.model.transformer import Transformer
    from aiayn.train.schedule import NoamSchedule
    from aiayn.train.update import Updater
    from conftest import tiny_config

    timeout = timedelta(seconds=60)
    dist.init_process_group("gloo", f"file://{store}", rank=rank, world_size=2, timeout=timeout)
    dist.barrier()  # both are past set-up: rank 1 must not leave while rank 0 connects
    world = World(rank, 2)
    if where == "world":
        run = lambda: world.sum([1.0])  # noqa: E731
    else:
        torch.manual_seed(0)
        model = Transformer(tiny_config())
        optimizer = torch.optim.Adam(model.parameters())
        updater = Updater(model, optimizer, NoamSchedule(optimizer, 32, 10), world)
        batch = collate([[5, 6, 7]] * 2, [[8, 9]] * 2, 0, 1, 2)
        run = lambda: updater.update([batch, batch])  # noqa: E731
    if rank == 1:
        if where == "world":
            os._exit(0)
        model.forward = lambda *args, **kwargs: os._exit(0)  # type: ignore[method-assign]
    try:
        run()
        raised = "nothing"
    except AiaynError as e:
        raised = f"AiaynError: {e}"
    except Exception as e:
        raised = f"{type(e).__name__}: {e}"
    Path(out_dir, "rank0").write_text(raised)
    os._exit(0)  # the group is broken: nothing to leave


@pytest.mark.parametrize("where", ["world", "update"])
def test_a_rank_that_dies_is_one_line_on_the_others(tmp_path, monkeypatch, where):
    """A rank that dies mid-run (killed, out of memory) leaves the others in a collective:
    they fail at once (the connection closes) with one line (an AiaynError, which the CLI
    prints as such), not a traceback from inside gloo or DDP."""
    import torch.multiprocessing as tmp

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = (str(tmp_path / "store"), str(tmp_path), where)
    tmp.start_processes(_peer_leaves, args=args, nprocs=2, start_method="spawn")
    raised = (tmp_path / "rank0").read_text()
    assert raised.startswith("AiaynError: "), raised
    assert "another process of the job failed or stopped" in raised
    assert "\n" not in raised and "GLHF" not in raised


def _reads_data(rank: int, store: str, directories: list[str]) -> None:
    """Rank ``rank`` of 2 (spawned) opens ``directories[rank]`` as the run's prepared
    data (each machine's own copy at one path, as --data names it) and writes what that
    raised."""
    import torch.distributed as dist

    from aiayn.train.recipe import Recipe
    from aiayn.train.rundir import RunDirectory

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    out = Path(store).parent / "run"
    run = RunDirectory(out, World(rank, 2), lambda _: None)
    try:
        run.prepared_data(Recipe(data=directories[rank]), None)
        raised = "nothing"
    except Exception as e:
        raised = f"{type(e).__name__}: {e}"
    (out.parent / f"rank{rank}").write_text(raised)
    dist.destroy_process_group()


def test_ranks_whose_prepared_data_differ_are_refused(tmp_path, monkeypatch):
    """Each rank plans the epoch from its own copy of the data: copies that differ (one
    machine's is stale) would train on batches no plan agrees on, skipping some pairs and
    repeating others, or leave ranks in collectives that never match. Every rank refuses."""
    import torch.multiprocessing as tmp

    from aiayn.data.prepared import prepare

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    directories = []
    for name, pairs in (("a", PAIRS[:30]), ("b", PAIRS[:29])):
        (tmp_path / f"{name}.de").write_text("".join(de + "\n" for de, _ in pairs), "utf-8")
        (tmp_path / f"{name}.en").write_text("".join(en + "\n" for _, en in pairs), "utf-8")
        corpus = (tmp_path / f"{name}.de", tmp_path / f"{name}.en")
        prepare(corpus, corpus, tmp_path / name, vocab_size=120, show_progress=False)
        directories.append(str(tmp_path / name))
    for same in (True, False):
        given = [directories[0]] * 2 if same else directories
        args = (str(tmp_path / f"store{same}"), given)
        tmp.start_processes(_reads_data, args=args, nprocs=2, start_method="spawn")
        raised = [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)]
        if same:
            assert raised == ["nothing", "nothing"]
        else:
            for rank, text in enumerate(raised):  # each names its own copy
                assert text.startswith(f"CorpusError: {directories[rank]}: "), text
                assert "rank 1" in text and "other prepared data" in text, text


LEAVES_AT_EXIT = """\
import atexit, sys
from pathlib import Path
import torch.distributed as dist
from aiayn.distributed import init_from_env

dest = Path(sys.argv[1])
# Registered before joining, so it runs after aiayn's own exit handler (atexit is LIFO).
atexit.register(lambda: (dest / f"rank{dist.get_rank() if dist.is_initialized() else 'x'}")
                .write_text(str(dist.is_initialized())))
world = init_from_env()
dest.joinpath(f"sum{world.rank}").write_text(str(world.sum([world.rank + 1.0])))
# the script ends without leaving the process group
"""


@pytest.mark.slow
def test_a_script_that_never_leaves_the_group_still_exits_cleanly(tmp_path):
    """A library user's script (or a test's) that joins a torchrun group and simply ends:
    aiayn leaves the group at exit, while the interpreter is whole, instead of letting gloo
    tear its threads down during finalization (a rare SIGABRT, "terminate called without
    an active exception")."""
    script = tmp_path / "script.py"
    script.write_text(LEAVES_AT_EXIT)
    done = torchrun(str(tmp_path), script=script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(tmp_path / f"sum{r}").read_text() for r in (0, 1)] == ["[3.0]", "[3.0]"]
    # after aiayn's handler, no rank is in a group any more
    assert (tmp_path / "rankx").read_text() == "False"
    assert not (tmp_path / "rank0").exists() and not (tmp_path / "rank1").exists()


def test_a_command_that_runs_in_one_process_refuses_torchrun(monkeypatch, tmp_path, capsys):
    """`torchrun -m aiayn prepare` ran prepare in every process, into one output: one of
    them failed as if another prepare were writing it. Every command but train, translate
    and evaluate now refuses in one line, before any work."""
    from aiayn.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    text = tmp_path / "a.txt"
    text.write_text("ein Haus\n")
    files = [x for flag in ("train", "valid") for x in (f"--{flag}-src", str(text))]
    files += [x for flag in ("train", "valid") for x in (f"--{flag}-tgt", str(text))]
    for argv in (
        ["prepare", *files, "--out", str(tmp_path / "out")],
        ["average", "--model", str(tmp_path)],
        ["summary", "--preset", "base", "--vocab", "100"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"aiayn {argv[0]}: error: runs in one process, and torchrun started 2" in err
    assert not (tmp_path / "out").exists()


_TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "3"}, "RANK='3' is set but WORLD_SIZE is not"),
        ({"RANK": "-1"}, "RANK='-1' is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be at least 1"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1' must be at least 1"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE='2' is set but RANK is not"),
        ({"WORLD_SIZE": "1", "RANK": "1"}, r"RANK='1' must be in \[0, WORLD_SIZE=1\)"),
        ({"WORLD_SIZE": "2", "RANK": "-1"}, "RANK='-1' must be in"),
        (
            {"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
            r"RANK='5' must be in \[0, WORLD_SIZE=2\)",
        ),
        ({"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR is not set"),
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        (
            {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "99999"},
            "MASTER_PORT='99999' must be a port",
        ),
        ({"WORLD_SIZE": "1", "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' must be in"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "2"}, "LOCAL_RANK='2' must be in"),
        (
            {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            r"LOCAL_RANK='2' must be in \[0, 2\)",
        ),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0'"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a number"),
    ],
)
def test_a_torchrun_environment_that_describes_no_world_is_refused(monkeypatch, env, message):
    from aiayn import distributed
    from aiayn.errors import AiaynError

    for name in _TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(AiaynError, match=message):
        distributed.init_from_env("cpu")


def test_a_world_of_one_and_torchruns_own_environment_are_accepted(monkeypatch):
    from aiayn.distributed import world_from_env

    for name in _TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    assert world_from_env() == World(0, 1, 0)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert world_from_env() == World(0, 1, 0)
    torchrun_env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    for name, value in {**torchrun_env, "MASTER_ADDR": "h", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert world_from_env() == World(3, 4, 1)


def test_a_stray_rank_leaves_the_output_file_alone(tmp_path, monkeypatch, capsys):
    """RANK=3 alone used to make a world of one in which rank 3 had no lines: translate
    exited 0 and emptied the output file."""
    from cli_util import one_line_error

    for name in _TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "3")
    source, output = tmp_path / "in.de", tmp_path / "prev.txt"
    source.write_text("ein Hund\n")
    output.write_text("keep me\n")
    model = str(tmp_path / "model")  # refused before the model is read
    err = one_line_error(["translate", "--model", model, str(source), "-o", str(output)], capsys)
    assert "RANK='3'" in err
    assert output.read_text() == "keep me\n"


def test_a_rank_whose_peers_never_join_is_one_line(tmp_path):
    """RANK/WORLD_SIZE/MASTER_* set by hand and no other process started: after the
    collective timeout, torch's DistStoreError ("1/2 clients joined") was a traceback."""
    import socket

    from sample_data import write_sample

    files = write_sample(tmp_path / "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    argv = [sys.executable, "-m", "aiayn", "train", "--out", str(tmp_path / "run")]
    for flag, name in (("--train-src", "train.de"), ("--train-tgt", "train.en"),
                       ("--valid-src", "val.de"), ("--valid-tgt", "val.en")):  # fmt: skip
        argv += [flag, str(files[name])]
    argv += ["--no-progress", "--set", "collective_timeout_minutes=0.05"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "waited past the collective timeout" in done.stderr
