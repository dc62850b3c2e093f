"""Two source trees decoding side by side: the same outputs, and how fast (issue 41).

    python benchmarks/decode_parity.py outputs --base ../old --new . --model DIR --also CKPT
    python benchmarks/decode_parity.py speed --base ../old --new . --model DIR --rounds 3
    python benchmarks/decode_parity.py serve --base ../old --new . --model DIR --lines 300

Each tree runs in a worker process of its own (``PYTHONPATH=TREE/src``, one torch thread;
``--device cuda``: on the GPU) on the first ``--lines`` sentences of Multi30k test2016
(German; the built-in sample when the data is missing). A mode an older tree lacks is
reported as not compared.

``outputs`` decodes every mode with ``Translator.translations``: greedy, beam 4, n-best 4,
seeded sampling (over the whole input, and per 8-line request), forced prefixes (beam 4
and greedy), an ensemble with ``--also`` (beam 4 n-best 2, and greedy), and the running
batch of the server (``RunningBatch``, a request of 8 sentences joining every 3 steps:
beam 4 with alternating alphas, greedy and seeded sampling). It prints, per mode, how many
lines' texts differ and the largest log-prob difference. (A base from before issue 41's
second round served greedy and sampled requests offline: compare the new tree's
``server_greedy`` and ``server_sample`` with its ``greedy`` and ``sample8``.)

``speed`` times greedy and beam 4 in length-sorted batches of 64, the two workers taking
turns batch by batch (A B, then B A); a round's ratio is the base's total time over the
new one's (above 1: the new tree is faster), and the median of the rounds is printed.

``serve`` times each tree's ``aiayn serve`` under the load of ``benchmarks/serve_load.py``
(the first ``--lines`` sentences, one per request, from ``--clients`` clients at
``--beam``), in pairs A B B A; a pair's ratio is the new tree's sentences/s over the
base's, and the median of the pairs is printed.
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

ROOT = Path(__file__).resolve().parent
MODES = ["greedy", "beam4", "nbest4", "sample", "sample8", "prefix", "greedy_prefix"]
MODES += ["ensemble", "ensemble_greedy", "server", "server_greedy", "server_sample"]


def worker(model: str, also: str | None, n: int, device: str = "cpu") -> None:
    """Serve requests on stdin, one JSON line each: {"outputs": mode} or {"time": [task,
    batch]}; answers one JSON line each."""
    import inspect

    import torch

    from aiayn.data.batching import sorted_batches
    from aiayn.decode import DecodeOptions
    from aiayn.serve.jobs import CacheBudget, Job
    from aiayn.serve.running import RunningBatch
    from aiayn.translator import Translator

    sys.path.insert(0, str(ROOT))
    from serve_load import sentences

    torch.set_num_threads(1)
    lines = sentences(n)[0]
    one = Translator.from_dir(model, device=device)
    both = Translator.from_dir(model, checkpoint=["auto", also], device=device) if also else None
    sample = DecodeOptions(beam=1, sampling=True, seed=7, n_best=2, top_k=20)
    prefixes = ["A" if i % 2 else "Two men" for i in range(len(lines))]

    def texts(found):
        return [[(t.text, t.log_prob) for t in row] for row in found]

    def served(options, alphas=(None,)):
        ids = [one.encode(line) for line in lines]
        # Trees before RunningBatch lost its unused budget still take one.
        takes_budget = "budget" in inspect.signature(RunningBatch).parameters
        budget = [CacheBudget.for_translator(10**9, one)] if takes_budget else []
        batch, pending, done, steps = RunningBatch(one, *budget), [], {}, 0
        for k, a in enumerate(range(0, len(ids), 8)):
            alpha = alphas[k % len(alphas)]
            settings = options if alpha is None else options.replace(alpha=alpha)
            pending.append(Job(ids[a : a + 8], settings, False, lambda outcome: None))
        jobs = list(pending)
        while pending or len(batch):
            if pending and steps % 3 == 0:
                done.update((gone.job.id, gone) for gone in batch.admit([pending.pop(0)]))
            done.update((gone.job.id, gone) for gone in batch.step())
            steps += 1
        decode = one.tokenizer.decode
        return [
            [(decode(h.tokens), h.log_prob) for h in row]
            for job in jobs
            for row in done[job.id].outputs
        ]

    runs = {
        "greedy": lambda: texts(one.translations(lines, DecodeOptions(beam=1))),
        "beam4": lambda: texts(one.translations(lines, DecodeOptions(beam=4))),
        "nbest4": lambda: texts(one.translations(lines, DecodeOptions(beam=4, n_best=4))),
        "sample": lambda: texts(one.translations(lines, sample)),
        "sample8": lambda: [
            row
            for a in range(0, len(lines), 8)
            for row in texts(one.translations(lines[a : a + 8], sample))
        ],
        "prefix": lambda: texts(one.translations(lines, DecodeOptions(beam=4, n_best=2), prefixes)),
        "greedy_prefix": lambda: texts(
            one.translations(
                lines, DecodeOptions(beam=1), [p if i % 2 else "" for i, p in enumerate(prefixes)]
            )
        ),
        "ensemble": lambda: (
            texts(both.translations(lines, DecodeOptions(beam=4, n_best=2))) if both else []
        ),
        "ensemble_greedy": lambda: (
            texts(both.translations(lines, DecodeOptions(beam=1))) if both else []
        ),
        "server": lambda: served(DecodeOptions(beam=4, n_best=2), alphas=(1.0, 0.6)),
        "server_greedy": lambda: served(DecodeOptions(beam=1)),
        "server_sample": lambda: served(sample),
    }
    ids = [one.encode(line) for line in lines]
    batches = [
        [ids[i] for i in index] for index, _ in sorted_batches(ids, 64, one.model.cfg.pad_id)
    ]
    for request in sys.stdin:
        ask = json.loads(request)
        if "outputs" in ask:
            try:
                answer = runs[ask["outputs"]]()
            except (TypeError, AssertionError) as e:  # an older tree lacks this mode
                answer = {"error": f"{type(e).__name__}: {e}"}
        else:
            task, b = ask["time"]
            options = DecodeOptions(beam=1 if task == "greedy" else 4)
            start = time.perf_counter()
            found = one.hypotheses(batches[b], options, batch_size=64, scores=False)
            answer = [
                time.perf_counter() - start,
                [c[0].tokens if c else [] for c in found],
                len(batches),
            ]
        print(json.dumps(answer), flush=True)


def serve_pairs(args: argparse.Namespace) -> None:
    """The two trees' servers under one load, A B B A per round (see the module)."""
    sys.path.insert(0, str(ROOT))
    import serve_load

    lines = serve_load.sentences(args.lines)[0]
    trees, ratios, p50 = {"base": Path(args.base), "new": Path(args.new)}, [], []
    for r in range(args.rounds):
        runs: dict[str, list[dict]] = {"base": [], "new": []}
        for name in ("base", "new", "new", "base"):
            run = serve_load.run_mode(args, lines, [], root=trees[name])
            if run["errors"]:
                raise SystemExit(
                    f"{name}: {run['errors']} requests failed ({run['error_statuses']})"
                )
            runs[name].append(run)
            print(f"round {r + 1} {name}: {run['sentences_per_s']:.1f} sentences/s, "
                  f"p50 {run['p50_s']:.3f} s", flush=True)  # fmt: skip
        for b, n in zip(runs["base"], runs["new"]):
            ratios.append(n["sentences_per_s"] / b["sentences_per_s"])
            p50.append(b["p50_s"] / n["p50_s"])
    print(
        f"serve (beam {args.beam}, {args.clients} clients): sentences/s new/base per pair "
        f"{', '.join(f'{x:.2f}' for x in ratios)}, median {statistics.median(ratios):.2f}x; "
        f"p50 base/new median {statistics.median(p50):.2f}x"
    )


class Worker:
    def __init__(self, tree: str, args: argparse.Namespace):
        path = os.pathsep.join(
            filter(None, [str(Path(tree) / "src"), os.environ.get("PYTHONPATH")])
        )
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        command = [
            sys.executable,
            __file__,
            "worker",
            "--model",
            args.model,
            "--lines",
            str(args.lines),
            "--device",
            args.device,
        ]
        command += ["--also", args.also] if args.also else []
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def ask(self, request: dict):
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["outputs", "speed", "serve", "worker"])
    parser.add_argument("--base", help="the tree before the change")
    parser.add_argument("--new", help="the tree after it")
    parser.add_argument("--model", required=True, help="a model directory")
    parser.add_argument("--also", help="another checkpoint of --model, for the ensembles")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (timings end on the host)")
    parser.add_argument("--clients", type=int, default=32, help="serve: concurrent clients")
    parser.add_argument("--beam", type=int, default=4, help="serve: the requests' beam")
    args = parser.parse_args()
    if args.what == "worker":
        worker(args.model, args.also, args.lines, args.device)
        return
    if args.what == "serve":
        serve_pairs(args)
        return
    base, new = Worker(args.base, args), Worker(args.new, args)
    if args.what == "outputs":
        for mode in MODES:
            a, b = base.ask({"outputs": mode}), new.ask({"outputs": mode})
            if isinstance(a, dict) or isinstance(b, dict):
                print(f"{mode}: not compared ({(a if isinstance(a, dict) else b)['error']})")
                continue
            differ = sum([t for t, _ in x] != [t for t, _ in y] for x, y in zip(a, b))
            gap = max(
                (abs(p - q) for x, y in zip(a, b) for (_, p), (_, q) in zip(x, y)), default=0.0
            )
            print(f"{mode}: {len(a)} lines, texts differ in {differ}, max |d log-prob| {gap:.2e}")
        return
    for task in ("greedy", "beam4"):
        n, ratios, same = base.ask({"time": [task, 0]})[2], [], True
        for r in range(args.rounds):
            total = {"base": 0.0, "new": 0.0}
            for b in range(n):
                order = (
                    (("base", base), ("new", new))
                    if (b + r) % 2 == 0
                    else (("new", new), ("base", base))
                )
                got = {name: w.ask({"time": [task, b]}) for name, w in order}
                same &= got["base"][1] == got["new"][1]
                for name in total:
                    total[name] += got[name][0]
            ratios.append(total["base"] / total["new"])
        rounds = ", ".join(f"{x:.2f}" for x in ratios)
        median = statistics.median(ratios)
        print(f"{task}: rounds {rounds}, median {median:.2f}x, outputs equal: {same}")


if __name__ == "__main__":
    main()
