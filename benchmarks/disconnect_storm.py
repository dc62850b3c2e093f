"""Clients that go away: what a storm of abandoned requests costs the requests after it.

    python benchmarks/disconnect_storm.py --model runs/de-en --before main --out bench_out/storm

For each version of the code (``--before``: a git ref, extracted to a temporary folder,
then this checkout), on the same model and machine:

1. starts ``aiayn serve --model M --threads 1`` (its defaults otherwise: continuous
   batching, the model in a worker process) and waits until it is ready;
2. sends ``--clients`` (32) concurrent one-sentence requests (Multi30k test2016, German;
   beam 4) and takes their median latency;
3. sends ``--storm`` (300) one-sentence requests, other sentences, each of whose
   connections closes ``--close-after-ms`` (50) ms after it was sent: clients that go
   away (the client's time for all of them is reported);
4. sends the same ``--clients`` requests again, right away, and takes their median;
5. reads the gauges of ``/metrics`` right after, then waits until the queue and the
   running batch are empty and reports how long that took and how many sentences the
   server decoded for clients that were gone.

Writes OUT/disconnect_storm.json and OUT/disconnect_storm.md. The server runs one torch
thread; this client runs no model code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from aiayn.data.corpus import read_lines

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the data locator is test support, shared here
from sample_data import PAIRS, multi30k_dir  # noqa: E402

GAUGES = (
    "aiayn_requests_in_flight",
    "aiayn_queue_sentences",
    "aiayn_running_sentences",
    "aiayn_jobs_open",
    "aiayn_jobs_pending",
)


def sentences(n: int) -> tuple[list[str], str]:
    data = multi30k_dir()
    if data is None:
        lines = [de for de, _ in PAIRS]
        return (lines * (n // len(lines) + 1))[:n], "the built-in sample (repeated)"
    return read_lines(data / "test2016.de.gz")[:n], "Multi30k test2016.de"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(base: str) -> dict[str, float]:
    """The unlabelled samples of /metrics, by name."""
    found = {}
    for line in httpx.get(f"{base}/metrics", timeout=120).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            found[name] = float(value)
    return found


def status_counts(base: str) -> dict[str, int]:
    text = httpx.get(f"{base}/metrics", timeout=120).text
    found = re.findall(r'aiayn_requests_total\{path="/translate",status="(\d+)"\} (\d+)', text)
    return {status: int(n) for status, n in found}


async def concurrent(base: str, lines: list[str], beam: int) -> list[float]:
    """One request per line, all at once; their latencies in seconds."""
    limits = httpx.Limits(max_connections=len(lines), max_keepalive_connections=len(lines))
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:

        async def one(line: str) -> float:
            start = time.perf_counter()
            r = await client.post("/translate", json={"src": [line], "beam": beam})
            r.raise_for_status()
            return time.perf_counter() - start

        return list(await asyncio.gather(*(one(line) for line in lines)))


async def storm(base: str, lines: list[str], beam: int, after_s: float) -> None:
    """One request per line on a raw connection each, closed ``after_s`` after it was sent
    (the answer never read)."""
    host, port = base.removeprefix("http://").split(":")

    async def one(line: str) -> None:
        data = json.dumps({"src": [line], "beam": beam}).encode()
        head = (
            f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(head.encode() + data)
        await writer.drain()
        await asyncio.sleep(after_s)
        writer.close()

    await asyncio.gather(*(one(line) for line in lines))


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server never became ready")


def run_version(name: str, src: Path, args: argparse.Namespace, lines: list[str]) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", args.model, "--port", str(port)]
    cmd += ["--threads", "1", *args.serve_args]
    log = open(Path(args.out) / f"serve_{name}.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    real, abandoned = lines[: args.clients], lines[args.clients :]
    try:
        wait_ready(base, proc)
        asyncio.run(concurrent(base, real[:4], args.beam))  # warm the caches and the pool
        before_storm = metrics(base)
        first = asyncio.run(concurrent(base, real, args.beam))
        start = time.perf_counter()
        asyncio.run(storm(base, abandoned, args.beam, args.close_after_ms / 1000))
        storm_s = time.perf_counter() - start
        second = asyncio.run(concurrent(base, real, args.beam))
        right_after = metrics(base)
        start = time.perf_counter()
        while True:  # until nothing is queued or running (and no request is in flight)
            now = metrics(base)
            if all(now.get(g, 0) == 0 for g in GAUGES[:3]):
                break
            if time.perf_counter() - start > 600:
                raise TimeoutError("the server never went idle")
            time.sleep(0.1)
        drained_s = time.perf_counter() - start
        idle = metrics(base)
        decoded = idle["aiayn_sentences_translated_total"]
        decoded -= before_storm["aiayn_sentences_translated_total"] + 2 * len(real)
        statuses = status_counts(base)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return {
        "version": name,
        "median_s_before": statistics.median(first),
        "median_s_after": statistics.median(second),
        "ratio": statistics.median(second) / statistics.median(first),
        "storm_client_s": storm_s,
        "gauges_right_after": {g: right_after.get(g) for g in GAUGES},
        "gauges_idle": {g: idle.get(g) for g in GAUGES},
        "seconds_until_idle": drained_s,
        "abandoned_sentences_decoded": int(decoded),
        "translate_statuses": statuses,
    }


def extract(ref: str, into: Path) -> Path:
    """The ``src`` folder of git ref ``ref`` of this repository, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def gauge_text(gauges: dict) -> str:
    short = {g.removeprefix("aiayn_"): v for g, v in gauges.items()}
    return ", ".join(f"{k} {'n/a' if v is None else int(v)}" for k, v in short.items())


def report(results: list[dict], args: argparse.Namespace, source: str) -> str:
    lines = [
        "# Disconnect storm",
        "",
        f"Model `{args.model}`, `aiayn serve --threads 1 {' '.join(args.serve_args)}`, "
        f"{args.clients} concurrent one-sentence requests (beam {args.beam}) from {source}, "
        f"then {args.storm} requests whose connections close after {args.close_after_ms:g} "
        f"ms, then the {args.clients} again. {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch threads 1 (server).",
        "",
        "| code | median before (s) | median after (s) | after/before | storm, client (s) "
        "| idle after (s) | abandoned sentences decoded | /translate statuses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['version']} | {r['median_s_before']:.3f} | {r['median_s_after']:.3f} | "
            f"{r['ratio']:.2f}x | {r['storm_client_s']:.2f} | {r['seconds_until_idle']:.2f} | "
            f"{r['abandoned_sentences_decoded']} | "
            + ", ".join(f"{k}: {v}" for k, v in sorted(r["translate_statuses"].items()))
            + " |"
        )
    lines += ["", "Gauges of /metrics right after the second round, and once idle:", ""]
    for r in results:
        lines.append(f"- {r['version']}: right after: {gauge_text(r['gauges_right_after'])}")
        lines.append(f"  idle: {gauge_text(r['gauges_idle'])}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model directory from `aiayn train`")
    p.add_argument("--before", help="a git ref to compare with (e.g. main), run first")
    p.add_argument("--out", default="bench_out/storm")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--storm", type=int, default=300)
    p.add_argument("--close-after-ms", type=float, default=50.0)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument(
        "--serve-args", nargs=argparse.REMAINDER, default=[], help="more `aiayn serve` flags"
    )
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    lines, source = sentences(args.clients + args.storm)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            src = extract(args.before, Path(tmp))
            results.append(run_version(args.before, src, args, lines))
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--abbrev-ref", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        results.append(run_version(head or "this checkout", ROOT / "src", args, lines))
    (Path(args.out) / "disconnect_storm.json").write_text(json.dumps(results, indent=2))
    text = report(results, args, source)
    (Path(args.out) / "disconnect_storm.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
