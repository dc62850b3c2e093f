"""Sequence-level knowledge distillation (Kim & Rush 2016) on Multi30k de-en.

    python benchmarks/distill.py --teacher runs/bench-de-en --out runs/distill [--parallel]

1. The teacher (the model of `make bleu`, its checkpoint and alpha as chosen on val in its
   results.json) translates Multi30k's training source with beam 4: the distilled corpus
   (with ``--seq-inter``, of each line's 4 best the one closest to the reference).
2. Two students of one recipe (recipes/multi30k-student.yaml: a deep encoder and a one-layer
   decoder, Kasai et al. 2021) get the same 55-minute budget each, one on the distilled
   targets and one on the original ones; checkpoint and alpha chosen on val, then
   test2016 decoded once (benchmarks/multi30k_bleu.py does both). ``--parallel`` trains
   both at once on one thread each (half the compute of a quiet 2-thread run, each).
3. Speed: teacher and students translate test2016 on the same sorted batches of 64,
   interleaved batch by batch, greedy and beam 4, on ``--threads`` CPU threads; sentences/s
   over the whole pass, median of ``--rounds`` passes. ``--max-len-a``/``--max-len-b`` set
   the length rule of every model's decode alike; ``--choices NAME`` takes each model's
   checkpoint and alpha from that file of its run (benchmarks/multi30k_bleu.py ``--results``,
   chosen on val under the same rule) instead of results.json.

Each step is skipped when its output exists, so the script can be resumed. Writes
OUT/results.json (or ``--results``) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from aiayn.checkpoint import load_model
from aiayn.data.batching import pad, sorted_batches
from aiayn.data.corpus import read_lines
from aiayn.decode import DecodeOptions, search
from aiayn.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from multi30k_bleu import host  # noqa: E402
from sample_data import multi30k_dir  # noqa: E402


def results_of(run: Path, name: str = "results.json") -> dict:
    """A run's results.json (or ``name``), as benchmarks/multi30k_bleu.py wrote it."""
    return json.loads((run / name).read_text())


def chosen(run: Path, name: str = "results.json") -> tuple[Path, float]:
    """The checkpoint file and alpha that run's val choice picked (results.json or
    ``name``)."""
    pick = results_of(run, name)["chosen_on_val"]
    return run / f"checkpoint_{pick['checkpoint']}.pt", pick["alpha"]


def distill_corpus(
    teacher: Path, src: Path, out: Path, threads: int, closest_to: Path | None = None
) -> None:
    """The teacher's beam-4 translations of every training source line (the CLI, so a
    torchrun launch could shard it the same way); with ``closest_to`` (the references), of
    each line's 4 best the one closest to its reference (Kim & Rush's Seq-Inter)."""
    ckpt, alpha = chosen(teacher)
    tmp = out.with_suffix(".tmp")
    command = [sys.executable, "-m", "aiayn", "translate", "--model", str(teacher)]
    command += ["--checkpoint", str(ckpt), "--beam", "4", "--alpha", str(alpha), "--quiet"]
    if closest_to is not None:
        command += ["--n-best", "4", "--closest-to", str(closest_to)]
    command += [str(src), "-o", str(tmp)]
    env = {"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}
    subprocess.run(command, check=True, env=env)
    tmp.rename(out)


def student_command(out: Path, recipe: Path, overrides: list[str]) -> list[str]:
    command = [sys.executable, str(ROOT / "benchmarks/multi30k_bleu.py"), "--direction"]
    return [*command, "de-en", "--out", str(out), "--recipe", str(recipe), "--set", *overrides]


def train_students(
    out: Path, recipe: Path, overrides: dict[str, list[str]], parallel: bool
) -> dict:
    """Each student's results.json, training those that have none: one after the other on
    the recipe's threads, or (``parallel``) both at once on one thread each, since two
    2-thread processes on 2 cores run far slower than one each."""
    runs = {name: out / f"student-{name}" for name in overrides}
    todo = [name for name, run in runs.items() if not (run / "results.json").exists()]
    if parallel:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = []
        for name in todo:
            command = student_command(runs[name], recipe, [*overrides[name], "threads=1"])
            log = open(out / f"student-{name}.log", "a")  # noqa: SIM115 (closed with the process)
            procs.append((subprocess.Popen(command, stdout=log, stderr=log, env=env), log))
        for proc, log in procs:
            proc.wait()
            log.close()
            if proc.returncode:
                raise SystemExit(f"a student run failed: see {log.name}")
    else:
        for name in todo:
            subprocess.run(student_command(runs[name], recipe, overrides[name]), check=True)
    return {name: results_of(run) for name, run in runs.items()}


def speed(models: dict[str, tuple[Path, float]], lines: list[str], rounds: int, rule: dict) -> dict:
    """sentences/s of each model, greedy and beam 4: every model translates the same
    groups of sentences (sorted by length, 64 each), interleaved group by group, under one
    length ``rule`` (DecodeOptions' max_len_a / max_len_b; None: the default); the time
    counts tokenization, decoding and detokenization, as `aiayn translate` does them for
    plain-text output (greedy without scores)."""
    loaded = {name: Translator(*load_model(ckpt)) for name, (ckpt, _) in models.items()}
    first = next(iter(loaded.values()))
    ids = [first.encode(line) for line in lines]
    groups = [index for index, _ in sorted_batches(ids, 64, first.model.cfg.pad_id)]
    out: dict = {}
    for beam in (1, 4):
        rates: dict[str, list[float]] = {name: [] for name in loaded}
        for _ in range(rounds):
            spent = dict.fromkeys(loaded, 0.0)
            for index in groups:
                for name, translator in loaded.items():
                    options = DecodeOptions(beam=beam, alpha=models[name][1]).replace(**rule)
                    t0 = time.perf_counter()
                    src = pad([translator.encode(lines[i]) for i in index])
                    # As `aiayn translate` writes text: greedy skips the log-probs.
                    hyps = search(translator.model, src, options, scores=False)
                    [translator.tokenizer.decode(h[0].tokens) for h in hyps]
                    spent[name] += time.perf_counter() - t0
            for name in loaded:
                rates[name].append(sum(map(len, groups)) / spent[name])
        out[f"beam{beam}"] = {name: round(statistics.median(r), 1) for name, r in rates.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--teacher", required=True, help="a run of benchmarks/multi30k_bleu.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--recipe", default=str(ROOT / "recipes/multi30k-student.yaml"))
    parser.add_argument("--set", nargs="*", default=[], help="student recipe overrides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--max-len-a", type=float, help="speed pass: outputs <= a * source + b")
    parser.add_argument("--max-len-b", type=int, help="(default: the library's, a=1 b=50)")
    parser.add_argument("--choices", default="results.json", help="each run's file of choices")
    parser.add_argument("--results", default="results.json", help="file name in --out")
    parser.add_argument(
        "--seq-inter",
        action="store_true",
        help="distilled targets: of the teacher's 4 best, the closest to the reference",
    )
    parser.add_argument(
        "--parallel", action="store_true", help="train both students at once, one thread each"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data, teacher, out = multi30k_dir(), Path(args.teacher), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    distilled = out / "train.distilled.en"
    if not distilled.exists():
        t0 = time.perf_counter()
        closest_to = data / "train.en.gz" if args.seq_inter else None
        distill_corpus(teacher, data / "train.de.gz", distilled, args.threads, closest_to)
        print(f"distilled corpus: {time.perf_counter() - t0:.0f} s", flush=True)
    students = {}
    if not args.speed_only:
        overrides = {"distilled": [f"train_tgt={distilled}", *args.set], "original": args.set}
        students = train_students(out, Path(args.recipe), overrides, args.parallel)
    models = {"teacher": chosen(teacher, args.choices)}
    for name in ("distilled", "original"):
        run = out / f"student-{name}"
        if (run / args.choices).exists():
            models[f"student_{name}"] = chosen(run, args.choices)
            # --speed-only keeps the trained students' figures in OUT/--results.
            students.setdefault(name, results_of(run, args.choices))
    test = read_lines(data / "test2016.de.gz")
    rule = {"max_len_a": args.max_len_a, "max_len_b": args.max_len_b}
    results = {
        "teacher": results_of(teacher, args.choices),
        "students": students,
        "length_rule": rule,
        "sentences_per_s": speed(models, test, args.rounds, rule),
        "threads": args.threads,
        "host": host(args.threads),  # the greedy ratio moved with the CPU (BENCHMARKS.md)
    }
    (out / args.results).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
