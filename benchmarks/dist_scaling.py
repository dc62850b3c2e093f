"""Data-parallel scaling on the CPU: `aiayn train` as 1 process against `torchrun
--nproc-per-node 2` (gloo), on the same data, model and batches.

    python benchmarks/dist_scaling.py --work /tmp/bench12-dist [--updates 24] [--repeats 2]

The Multi30k recipe's model (7.6M parameters) on Multi30k de-en train (or the built-in
sample), max_tokens 3300 per batch. One process with 2 threads makes ``--updates`` updates
of one batch each; two processes with 1 thread each make half as many updates of two
batches each (one per rank): the same batches, in the same order. Throughput = target tokens
of the updates after the first two / the time they took (from metrics.jsonl), so start-up,
data loading and the final validation do not count. The runs alternate (1, 2, 1, 2, ...) so
the machine's noise falls on both. Writes WORK/results.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
from aiayn.data.corpus import read_lines  # noqa: E402
from sample_data import multi30k_dir, write_sample  # noqa: E402


def corpus(work: Path) -> dict[str, Path]:
    """Multi30k train, and the first 32 validation pairs (validation is not measured)."""
    data = multi30k_dir()
    if data is None:
        paths = write_sample(work / "sample")
        return {k: paths[k] for k in ("train.de", "train.en", "val.de", "val.en")}
    out = {"train.de": data / "train.de.gz", "train.en": data / "train.en.gz"}
    for lang in ("de", "en"):
        path = work / f"val32.{lang}.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in read_lines(data / f"val.{lang}.gz")[:32]))
        out[f"val.{lang}"] = path
    return out


def throughput(run: Path) -> tuple[float, int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["kind"] == "train"]
    timed = train[2:]
    seconds = timed[-1]["seconds"] - train[1]["seconds"]
    return sum(r["tokens"] for r in timed) / seconds, len(train)


def run(work: Path, data: Path, nproc: int, updates: int, index: int) -> float:
    out = work / f"run{index}-{nproc}proc"
    shutil.rmtree(out, ignore_errors=True)
    threads = 2 // nproc
    args = ["train", "--config", str(ROOT / "recipes/multi30k.yaml"), "--data", str(data)]
    args += ["--out", str(out), "--no-progress", "--set", f"threads={threads}"]
    args += [f"max_steps={updates // nproc}", "save_every_steps=0", "time_limit_minutes=0"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    if nproc == 1:
        command = [sys.executable, "-m", "aiayn", *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node", str(nproc), "-m", "aiayn", *args]
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    rate, n = throughput(out)
    print(f"{nproc} process(es): {rate:.0f} target tokens/s over {n} updates", flush=True)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--updates", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    paths = corpus(args.work)
    data = args.work / "data"
    if not (data / "manifest.json").is_file():
        command = [sys.executable, "-m", "aiayn", "prepare", "--out", str(data), "--no-progress"]
        command += ["--train-src", str(paths["train.de"]), "--train-tgt", str(paths["train.en"])]
        command += ["--valid-src", str(paths["val.de"]), "--valid-tgt", str(paths["val.en"])]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        subprocess.run(command, env=env, check=True)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for i in range(args.repeats):
        for nproc in (1, 2):
            rates[nproc].append(run(args.work, data, nproc, args.updates, i))
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    results = {
        "updates_one_process": args.updates,
        "tokens_per_s": {"1 process x 2 threads": rates[1], "2 processes x 1 thread": rates[2]},
        "median": {"1": round(one, 1), "2": round(two, 1)},
        "two_over_one": round(two / one, 3),
    }
    (args.work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
