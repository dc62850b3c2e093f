"""Shared fixtures: small models that run in milliseconds on a CPU."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest
import torch
from torch.nn import functional as F

import sample_data  # noqa: F401 - notes the user's data cache before it is moved below
from aiayn import Transformer, TransformerConfig

# No test writes into the user's data cache or reaches the network: the cache is a folder
# of this session's own (subprocesses inherit it), and a download goes to a closed port
# unless the test brings its own mirror (tests/mirror_util.py). Made when a pytest session
# starts, not when this file is imported: a process a test starts that imports it (a
# torchrun rank) would make a folder that no session finish removes.
SESSION_CACHE = ""
# The temp folder of the processes tests start (torchrun leaves a torchelastic_* folder in
# it per run, ~200 a suite), removed when the session finishes; this process keeps its own.
SESSION_TMP = ""


def pytest_configure(config):
    global SESSION_CACHE, SESSION_TMP
    SESSION_CACHE = tempfile.mkdtemp(prefix="aiayn-test-data-")
    os.environ["AIAYN_DATA"] = SESSION_CACHE
    SESSION_TMP = tempfile.mkdtemp(prefix="aiayn-test-tmp-")  # gettempdir() is fixed now
    os.environ["TMPDIR"] = SESSION_TMP
    os.environ["AIAYN_MIRROR"] = "http://127.0.0.1:9/"
    # A suite a script starts in the background (`make test &`, no job control) inherits
    # SIGINT ignored, which Python then leaves ignored, in this process and every process
    # it starts: the tests of Ctrl-C would send theirs to nobody. They test what Ctrl-C
    # does at a terminal, so this session gives it the terminal's handler (a process it
    # starts gets the default action, and Python's handler with it).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Under pytest-xdist (`make test` runs TEST_WORKERS of them) each worker takes its share of
# the cores, and so do the processes its tests start (torchrun ranks, server workers): two
# workers each running as many threads as there are cores slow every test and would make
# the ones that wait on a clock miss it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    if not os.environ.get("OMP_NUM_THREADS", "").isdigit():
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))

# Test files that read Multi30k without being marked, as xdist's workers report them.
_UNMARKED_IN_WORKERS: set[str] = set()

# The files that take longest (`--durations` on 2 cores, about 45% of the suite's time),
# longest first: xdist's loadfile hands files to the workers in collection order, and a long
# file handed out near the end keeps one worker busy while the other has nothing left.
LONGEST_FIRST = (
    "test_demo.py",
    "test_distributed_train.py",
    "test_serve_lifecycle.py",
    "test_serve_process.py",
    "test_distributed.py",
    "test_compile.py",
    "test_distributed_failures.py",
    "test_serve_live.py",
    "test_train_update.py",
    "test_gpu_check.py",
)


def pytest_collection_modifyitems(config, items):
    """Under xdist, the files of LONGEST_FIRST first, each file's tests in their own order;
    the order of a run in one process is pytest's own."""
    if _WORKERS > 1:
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def tiny_config(**overrides) -> TransformerConfig:
    kwargs = dict(
        src_vocab_size=23,
        tgt_vocab_size=29,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=64,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


@pytest.fixture
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


def random_batch(cfg: TransformerConfig, lengths_src, lengths_tgt, seed: int = 0):
    """Right-padded src/tgt_in with the given real lengths; tgt_in starts with BOS."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths_src)
    src = torch.full((B, max(lengths_src)), cfg.pad_id, dtype=torch.long)
    tgt = torch.full((B, max(lengths_tgt)), cfg.pad_id, dtype=torch.long)
    for i, (s, t) in enumerate(zip(lengths_src, lengths_tgt)):
        src[i, :s] = torch.randint(3, cfg.src_vocab_size, (s,), generator=g)
        tgt[i, :t] = torch.randint(3, cfg.tgt_vocab_size, (t,), generator=g)
        tgt[i, 0] = cfg.bos_id
    return src, tgt


def small_corpus(directory, n_train: int = 300, n_valid: int = 40) -> dict:
    """Real Multi30k lines (the first ``n_train`` train and ``n_valid`` val pairs, written
    gzipped like the originals) when ../shared/data/multi30k exists, else the built-in
    sample. Returns paths keyed "train.de", "train.en", "val.de", "val.en"."""
    import gzip

    from aiayn.data.corpus import read_lines
    from sample_data import multi30k_dir, write_sample

    data = multi30k_dir()
    if data is None:
        return write_sample(directory)
    paths = {}
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", n_valid)):
        for lang in ("de", "en"):
            lines = read_lines(data / f"{split}.{lang}.gz")[:n]
            path = directory / f"{split}.{lang}.gz"
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
            paths[f"{split}.{lang}"] = path
    return paths


def train_sample_model(out_dir, norm_first: bool = False, steps: int = 100, seed: int = 0):
    """A real model directory: a SentencePiece tokenizer and a small model trained briefly
    on the first 60 built-in German-English pairs, saved as ``checkpoint_best.pt`` in the
    trainer's format. Its translations of the pairs are varied and partly right."""
    from aiayn.checkpoint import save_checkpoint
    from aiayn.data.batching import collate
    from aiayn.data.tokenizer import Tokenizer
    from sample_data import PAIRS

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.train(
        [s for pair in PAIRS for s in pair], out_dir / "spm", vocab_size=160, num_threads=1
    )
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=128,
        dropout=0.0,
        max_len=64,
        share_embeddings=True,
        norm_first=norm_first,
    )
    model = Transformer(cfg)
    batch = collate(
        [tokenizer.encode(s) for s, _ in PAIRS[:60]], [tokenizer.encode(t) for _, t in PAIRS[:60]]
    )
    # Trained in float64 on one thread, then stored in float32: the same weights on every
    # CPU and whatever thread count the tests before left. In float32 the sum order (the
    # threads) and the CPU's kernels (an AMD EPYC against an Intel Xeon) move the last
    # digits, and 100 Adam steps carry them into the outputs docs/figures/decoding.txt
    # records; in float64 they stay far below the float32 weights' last bit.
    model.double()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            logits = model(batch.src, batch.tgt_in)  # float64: no cast to float32 on the way
            loss = F.cross_entropy(
                logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=cfg.pad_id
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.float()
    state = {
        "model": model.state_dict(),
        "config": cfg.to_dict(),
        "tokenizer": tokenizer.to_bytes(),
        "step": steps,
        "epoch": 0,
    }
    save_checkpoint(state, out_dir / "checkpoint_best.pt")
    return out_dir


@pytest.fixture(scope="session")
def sample_model_dir(tmp_path_factory):
    """``sample_model_dir(norm_first)`` -> a trained model directory, built once a session."""
    built = {}

    def get(norm_first: bool = False):
        if norm_first not in built:
            name = "pre_ln" if norm_first else "post_ln"
            built[norm_first] = train_sample_model(
                tmp_path_factory.mktemp(name), norm_first=norm_first
            )
        return built[norm_first]

    return get


@pytest.fixture(scope="module")
def sample_prepared(tmp_path_factory):
    """The built-in sample pairs, prepared (a 120-token tokenizer): a directory of
    ``aiayn prepare`` that a TINY_RUN (test_train_refusals) trains on in seconds."""
    from aiayn.data.prepared import prepare
    from sample_data import write_sample

    root = tmp_path_factory.mktemp("sample")
    text = write_sample(root / "text")
    train, valid = (text["train.de"], text["train.en"]), (text["val.de"], text["val.en"])
    prepare(train, valid, root / "prepared", vocab_size=120, show_progress=False)
    return root / "prepared"


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a test file read Multi30k but is not marked ``multi30k``: CI runs
    the marked files a second time with the data hidden (``AIAYN_MULTI30K=none``), as a
    new user's clone has none, and an unmarked reader would escape that run."""
    from sample_data import READERS

    for folder in (SESSION_CACHE, SESSION_TMP):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)

    marked = {str(item.path) for item in session.items if item.get_closest_marker("multi30k")}
    root = session.config.rootpath
    unmarked = {r for r in READERS if str(root / r) not in marked}
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker: the controller reports it
        worker_output["unmarked_readers"] = sorted(unmarked)
        return
    unmarked = sorted(unmarked | _UNMARKED_IN_WORKERS)
    if unmarked:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"read Multi30k but not marked multi30k: {', '.join(unmarked)}"
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: collect what each worker found for the check above (each worker
    collects every test, so its marks are complete; only the files it ran can be readers)."""
    _UNMARKED_IN_WORKERS.update(getattr(node, "workeroutput", {}).get("unmarked_readers", ()))


def _no_skips() -> bool:
    """``AIAYN_NO_SKIPS=1`` (set by .ci/run for ``make test``): every dev dependency is
    installed there, so a skip is a test that did not run, and fails the run."""
    import os

    return os.environ.get("AIAYN_NO_SKIPS") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _no_skips() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under AIAYN_NO_SKIPS=1: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A whole file skipped at import (``pytest.importorskip``) fails too."""
    outcome = yield
    report = outcome.get_result()
    if _no_skips() and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under AIAYN_NO_SKIPS=1: {reason}"
