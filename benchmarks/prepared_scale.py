"""`aiayn prepare` and `aiayn train --data` at WMT scale, on a synthetic corpus.

    python -m benchmarks.prepared_scale --work /tmp/bench9 --pairs 5000000 --workers 2

1. A deterministic corpus of ``--pairs`` pairs from Multi30k's training text: each pair
   joins 1, 2 or 3 random caption pairs (probabilities 0.4, 0.4, 0.2; seed 0), so the
   vocabulary is Multi30k's and sentences average ~22 words, like WMT's.
2. ``aiayn prepare`` on it: wall time, pairs/s, peak RSS (the process alone, and the sum
   over it and its workers, sampled every 0.2 s).
3. Planning one epoch's batches from the prepared index.
4. ``aiayn train --data`` with the Multi30k recipe's model: seconds from the command's
   start to the first update, and steady-state RSS (median after the first update), beside
   the same run on prepared Multi30k.
Writes WORK/results.json. Data: $AIAYN_MULTI30K, ../shared/data/multi30k or the cache of
`aiayn data get multi30k`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
from sample_data import multi30k_dir  # noqa: E402


def make_corpus(out: Path, pairs: int, seed: int = 0) -> tuple[Path, Path]:
    """WORK/synthetic.{de,en}.gz: ``pairs`` pairs recombined from Multi30k train."""
    from aiayn.data.corpus import read_lines

    src, tgt = out / "synthetic.de.gz", out / "synthetic.en.gz"
    if src.exists() and tgt.exists():
        return src, tgt
    data = multi30k_dir()
    de, en = read_lines(data / "train.de.gz"), read_lines(data / "train.en.gz")
    rng = np.random.default_rng(seed)
    with (
        gzip.open(src, "wt", encoding="utf-8", compresslevel=1) as fs,
        gzip.open(tgt, "wt", encoding="utf-8", compresslevel=1) as ft,
    ):
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            k = rng.choice([1, 2, 3], size=n, p=[0.4, 0.4, 0.2])
            picks = rng.integers(0, len(de), size=(n, 3))
            fs.write("".join(" ".join(de[j] for j in p[:c]) + "\n" for p, c in zip(picks, k)))
            ft.write("".join(" ".join(en[j] for j in p[:c]) + "\n" for p, c in zip(picks, k)))
    return src, tgt


def run_measured(argv: list[str], until=None, stop=None, poll: float = 0.2) -> dict:
    """Run ``argv``; wall time, peak RSS of the process and of its tree, RSS samples, and
    the time ``until()`` first held (seconds from the start). Ended (SIGTERM) once
    ``stop()`` holds."""
    start = time.perf_counter()
    proc = psutil.Popen(argv, env={**os.environ, "OMP_NUM_THREADS": "1"})
    peak_main = peak_tree = 0
    samples: list[tuple[float, int]] = []
    reached = None
    while proc.poll() is None:
        try:
            main = proc.memory_info().rss
            # PSS: pages a forked worker shares with its parent are counted once in the sum.
            procs = [proc, *proc.children(recursive=True)]
            tree = sum(p.memory_full_info().pss for p in procs) if len(procs) > 1 else main
        except psutil.Error:
            break
        now = time.perf_counter() - start
        peak_main, peak_tree = max(peak_main, main), max(peak_tree, tree)
        samples.append((now, main))
        if reached is None and until is not None and until():
            reached = now
        if stop is not None and stop():
            proc.terminate()
            proc.wait()
            break
        time.sleep(poll)
    proc.wait()
    if proc.returncode != 0 and stop is None:
        raise SystemExit(f"{argv} failed with {proc.returncode}")
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mib": round(peak_main / 2**20),
        "peak_rss_tree_mib": round(peak_tree / 2**20),
        "reached_s": None if reached is None else round(reached, 1),
        "samples": samples,
    }


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


def prepare(src: Path, tgt: Path, out: Path, workers: int) -> dict:
    data = multi30k_dir()
    argv = aiayn(
        "prepare", "--train-src", str(src), "--train-tgt", str(tgt),
        "--valid-src", str(data / "val.de.gz"), "--valid-tgt", str(data / "val.en.gz"),
        "--out", str(out), "--workers", str(workers), "--no-progress",
    )  # fmt: skip
    if out.exists():
        import shutil

        shutil.rmtree(out)
    result = run_measured(argv)
    manifest = json.loads((out / "manifest.json").read_text())
    result.pop("samples")
    result["pairs"] = manifest["splits"]["train"]["pairs"]
    result["pairs_per_s"] = round(result["pairs"] / result["seconds"])
    result["bytes_on_disk"] = sum(p.stat().st_size for p in out.iterdir())
    return result


def plan(data_dir: Path) -> dict:
    code = (
        "import sys, time, resource; from aiayn.data.shards import PreparedData; "
        "t = time.perf_counter(); d = PreparedData(sys.argv[1]); load = time.perf_counter() - t; "
        "t = time.perf_counter(); b = d.train.plan(3300, 1, 0, 256); "
        "print(load, time.perf_counter() - t, len(b), "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        "load_s": round(float(out[0]), 2),
        "plan_s": round(float(out[1]), 2),
        "batches": int(out[2]),
        "peak_rss_mib": round(int(out[3]) / 1024),
    }


def train(data_dir: Path, run: Path, steps: int) -> dict:
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    metrics = run / "metrics.jsonl"
    argv = aiayn(
        "train", "--config", str(ROOT / "recipes/multi30k.yaml"), "--data", str(data_dir),
        "--out", str(run), "--no-progress", "--set", f"max_steps={steps}", "threads=1",
        "save_every_steps=0", "log_every=1",
    )  # fmt: skip

    def updates() -> int:
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    # Ended after ``steps`` updates: the validation at the end is not what is measured.
    result = run_measured(argv, until=lambda: updates() > 0, stop=lambda: updates() >= steps)
    first = result["reached_s"]
    steady = [rss for t, rss in result.pop("samples") if first is not None and t > first + 5]
    result["first_update_s"] = first
    result["steady_rss_mib"] = round(statistics.median(steady) / 2**20) if steady else None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", required=True, help="folder for the corpus and the runs")
    parser.add_argument("--pairs", type=int, default=5_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="updates per training run")
    parser.add_argument("--prepare-only", action="store_true", help="prepare and plan only")
    parser.add_argument("--train-only", action="store_true", help="train on WORK's data only")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"pairs": args.pairs, "workers": args.workers}
    if args.train_only:
        results["uptime_before"] = os.popen("uptime").read().strip()
        train_both(work, args.steps, results)
        (work / "results-train.json").write_text(json.dumps(results, indent=2) + "\n")
        return
    t = time.perf_counter()
    src, tgt = make_corpus(work, args.pairs)
    results["corpus_s"] = round(time.perf_counter() - t, 1)
    results["uptime_before"] = os.popen("uptime").read().strip()
    results["prepare"] = prepare(src, tgt, work / "data", args.workers)
    print(json.dumps(results["prepare"]), flush=True)
    results["plan"] = plan(work / "data")
    print(json.dumps(results["plan"]), flush=True)
    if args.prepare_only:
        results["uptime_after"] = os.popen("uptime").read().strip()
        (work / "results-prepare.json").write_text(json.dumps(results, indent=2) + "\n")
        return
    m30k = multi30k_dir()
    results["prepare_multi30k"] = prepare(
        m30k / "train.de.gz", m30k / "train.en.gz", work / "multi30k", args.workers
    )
    train_both(work, args.steps, results)
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def train_both(work: Path, steps: int, results: dict) -> None:
    results["train"] = train(work / "data", work / "run-synthetic", steps)
    print(json.dumps(results["train"]), flush=True)
    results["train_multi30k"] = train(work / "multi30k", work / "run-multi30k", steps)
    print(json.dumps(results["train_multi30k"]), flush=True)
    results["uptime_after"] = os.popen("uptime").read().strip()


if __name__ == "__main__":
    main()
