"""A bounded load test of `aiayn serve` on loopback, against the Translator offline.

    python benchmarks/serve_load.py --model runs/de-en --out bench_out/serve

Takes the first ``--requests`` sentences of Multi30k test2016 (German; the built-in
sample when the data is missing) and:

1. translates them offline with ``Translator.translate`` (length-sorted batches of 64):
   the server's physical limit on this machine;
2. starts ``aiayn serve`` (1 torch thread) with its defaults (continuous batching, the
   model in a worker process of its own), and sends one sentence per request from
   ``--clients`` concurrent clients (asyncio + httpx, one process);
3. the same with the model in a thread of the server's process (``--worker thread``),
   and with whole-request batching (``--no-continuous``: a batch runs to its end before
   queued requests start);
4. with batching off: ``--batch-wait-ms 0 --max-batch-tokens 1`` (each model batch holds
   one request).

Runs 2 and 3 ``--rounds`` times and 4 once, with an offline run before the first and after
each (the machine is shared: each served run is compared with the offline runs around
it). Reports errors, p50/p99 latency, sentences/s, the served/offline ratio (the median
of the runs' ratios) and batched/unbatched ratios (of median runs) and whether every served
translation equals the offline one. Writes
OUT/serve_load.json and OUT/serve_load.md. Run the server and this client with one torch
thread each (the client runs no model code while the server is up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from aiayn.data.corpus import read_lines
from aiayn.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
from sample_data import PAIRS, multi30k_dir  # noqa: E402

MODES = {
    "batched": [],  # the defaults: continuous batching, --max-batch-tokens 4096
    "batched, worker thread": ["--worker", "thread"],  # the model beside the event loop
    "whole batches": ["--no-continuous"],  # dynamic batching of whole requests only
    "one at a time": ["--batch-wait-ms", "0", "--max-batch-tokens", "1"],
}


def sentences(n: int) -> tuple[list[str], str]:
    data = multi30k_dir()
    if data is None:
        return [de for de, _ in PAIRS][:n], "the built-in sample"
    return read_lines(data / "test2016.de.gz")[:n], "Multi30k test2016.de"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def offline(translator: Translator, lines: list[str], beam: int, chunks: bool = False) -> dict:
    """Offline throughput (``translator`` already warmed up), plus arrival-order chunks."""
    start = time.perf_counter()
    out = translator.translate(lines, beam=beam)
    seconds = time.perf_counter() - start
    if not chunks:
        return {"seconds": seconds, "sentences_per_s": len(lines) / seconds}
    # The same sentences in arrival order, 32 and 16 at a time: what a server batch of
    # that size can reach at best (no sorting across the whole set).
    per_chunk = {}
    for size in (32, 16):
        start = time.perf_counter()
        for i in range(0, len(lines), size):
            translator.translate(lines[i : i + size], beam=beam, batch_size=size)
        per_chunk[size] = len(lines) / (time.perf_counter() - start)
    return {
        "seconds": seconds,
        "sentences_per_s": len(lines) / seconds,
        "chunks_sentences_per_s": per_chunk,
        "translations": [c[0] for c in out],
    }


async def load(base: str, lines: list[str], clients: int, beam: int) -> dict:
    """Each line is one request; ``clients`` tasks take the next one as each finishes."""
    results: list[tuple[int, float, int, str]] = []
    todo = iter(enumerate(lines))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http: httpx.AsyncClient) -> None:
        for i, line in todo:
            start = time.perf_counter()
            try:
                r = await http.post("/translate", json={"src": [line], "beam": beam})
                text = r.json()["translations"][0] if r.status_code == 200 else ""
                results.append((i, time.perf_counter() - start, r.status_code, text))
            except (httpx.HTTPError, ValueError, KeyError) as e:
                results.append((i, time.perf_counter() - start, 0, type(e).__name__))

    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - start
        metrics = (await http.get("/metrics")).text
    latencies = [r[1] for r in results]
    ok = [r for r in results if r[2] == 200]
    batch = {k: float(v) for k, v in (
        line.split() for line in metrics.splitlines()
        if line.startswith(("aiayn_batch_sentences_sum", "aiayn_batch_sentences_count"))
    )}  # fmt: skip
    return {
        "seconds": seconds,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_statuses": sorted({r[2] for r in results if r[2] != 200}),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "mean_s": statistics.fmean(latencies),
        "sentences_per_s": len(ok) / seconds,
        "mean_batch_sentences": batch["aiayn_batch_sentences_sum"]
        / max(batch["aiayn_batch_sentences_count"], 1),
        "translations": {r[0]: r[3] for r in ok},
    }


def run_mode(args, lines: list[str], flags: list[str], root: Path = ROOT) -> dict:
    """One served run: ``aiayn serve`` of the tree ``root`` (its src/) with ``flags``, the
    ``args.clients`` clients sending ``lines``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", args.model, "--port", str(port)]
    server = subprocess.Popen([*cmd, "--threads", "1", *flags], env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)
        return asyncio.run(load(base, lines, args.clients, args.beam))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def median_run(runs: list[dict]) -> dict:
    """The run with the median sentences/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["sentences_per_s"])[(len(runs) - 1) // 2]


def report(res: dict) -> str:
    rows = [
        "| mode | errors | p50 latency | p99 latency | sentences/s | mean batch "
        "| served / offline (each round) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in MODES:
        runs = res[name]
        m = median_run(runs)
        each = ", ".join(f"{r['ratio']:.0%}" for r in runs)
        rows.append(
            f"| {name} | {sum(r['errors'] for r in runs)} / {sum(r['requests'] for r in runs)} "
            f"| {m['p50_s'] * 1000:.0f} ms | {m['p99_s'] * 1000:.0f} ms "
            f"| {m['sentences_per_s']:.1f} | {m['mean_batch_sentences']:.1f} "
            f"| **{statistics.median(r['ratio'] for r in runs):.0%}** ({each}) |"
        )
    o = res["offline"]
    runs = ", ".join(f"{x:.1f}" for x in o["runs_sentences_per_s"])
    rows.append(
        f"| offline `Translator.translate` ({runs}) | | | | {o['sentences_per_s']:.1f} "
        "| 64 (sorted) | 100% |"
    )
    for size, rate in o["chunks_sentences_per_s"].items():
        rows.append(
            f"| offline, {size} at a time in arrival order | | | | {rate:.1f} | {size} "
            f"| {rate / o['sentences_per_s']:.0%} |"
        )
    speed = {name: median_run(res[name])["sentences_per_s"] for name in MODES}
    same = ", ".join(f"{name} {res['same'][name]}" for name in MODES)
    lines = [
        *rows,
        "",
        f"Continuous batching / one at a time: "
        f"{speed['batched'] / speed['one at a time']:.2f}x; whole batches / one at a time: "
        f"{speed['whole batches'] / speed['one at a time']:.2f}x. Served translations equal "
        f"to offline, of {res['n']} per run: {same} (the worst run of each mode).",
        f"{res['n']} requests of one sentence ({res['data']}), {res['clients']} concurrent "
        f"clients, beam {res['beam']}, 1 torch thread in the server; {res['rounds']} rounds "
        f"(one at a time: 1); each run's ratio is to the mean of the offline runs before and "
        f"after it, and a mode's ratio is the median of its runs' ratios (the machine's speed "
        f"drifts); its other figures are those of its median run by sentences/s. "
        f"{res['machine']}; load average before "
        f"{res['load_before']}, after {res['load_after']}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each batched mode")
    parser.add_argument("--out", default="bench_out/serve")
    parser.add_argument("--batch-wait-ms", type=float, help="batched mode (default: serve's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines, data = sentences(args.requests)
    res: dict = {"n": len(lines), "data": data, "clients": args.clients, "beam": args.beam}
    res["rounds"] = args.rounds
    res["machine"] = f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"
    res["load_before"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    # The machine is shared and its speed drifts: every served run sits between two
    # offline runs and is compared with their mean.
    translator = Translator.from_dir(args.model)  # the offline reference, loaded once
    translator.translate(lines[:16], beam=args.beam)  # warm-up
    first = offline(translator, lines, args.beam, chunks=True)
    offline_runs = [first["sentences_per_s"]]
    print(f"offline: {offline_runs[-1]:.1f} sentences/s", flush=True)
    schedule = [name for _ in range(args.rounds) for name in MODES if name != "one at a time"]
    schedule.append("one at a time")  # slow, and far from the goals: once
    for name in schedule:
        flags = MODES[name]
        if name == "batched" and args.batch_wait_ms is not None:
            flags = [*flags, "--batch-wait-ms", str(args.batch_wait_ms)]
        run = run_mode(args, lines, flags)
        offline_runs.append(offline(translator, lines, args.beam)["sentences_per_s"])
        run["offline_sentences_per_s"] = (offline_runs[-2] + offline_runs[-1]) / 2
        run["ratio"] = run["sentences_per_s"] / run["offline_sentences_per_s"]
        res.setdefault(name, []).append(run)
        print(
            f"{name}: {run['sentences_per_s']:.1f} sentences/s, {run['ratio']:.0%} of offline "
            f"({offline_runs[-1]:.1f} after)",
            flush=True,
        )
    res["offline"] = {
        "sentences_per_s": statistics.median(offline_runs),
        "runs_sentences_per_s": offline_runs,
        "chunks_sentences_per_s": first["chunks_sentences_per_s"],
    }
    res["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    want = first["translations"]
    res["same"] = {
        name: min(sum(r["translations"].get(i) == w for i, w in enumerate(want)) for r in res[name])
        for name in MODES
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_load.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    (out / "serve_load.md").write_text(report(res))
    print(report(res))


if __name__ == "__main__":
    main()
