"""`aiayn serve`: the model behind HTTP."""

from __future__ import annotations

import argparse
import os

from aiayn.cli.flags import add_ensemble_flags, add_inference_flags, translator_for
from aiayn.errors import AiaynError

MAX_THREADS = 1024


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from aiayn.serve import ServeConfig, serve
        from aiayn.serve.protocol import origin_problem
    except ImportError as e:
        raise AiaynError(
            f"serving needs the serve extra: pip install 'aiayn[serve]' ({e})"
        ) from None
    api_key = None
    if args.api_key_env is not None:  # given, even empty ("$KEYVAR" unset): never open
        if not args.api_key_env:
            raise AiaynError("--api-key-env names no environment variable")
        # HTTP strips a header's surrounding whitespace: a key read from a file with its
        # newline could never match.
        api_key = os.environ.get(args.api_key_env, "").strip()
        if not api_key:
            raise AiaynError(f"the environment variable {args.api_key_env} holds no API key")
    if not args.request_timeout > 0:
        raise AiaynError(f"--request-timeout must be > 0 seconds, got {args.request_timeout}")
    if not 0 <= args.batch_wait_ms <= 60_000:  # NaN fails too: no batch would ever start
        raise AiaynError(f"--batch-wait-ms must be in [0, 60000], got {args.batch_wait_ms}")
    if args.max_sentences < 1:
        raise AiaynError(f"--max-sentences must be >= 1, got {args.max_sentences}")
    if args.max_cache_tokens is not None and args.max_cache_tokens < 1:
        raise AiaynError(f"--max-cache-tokens must be >= 1, got {args.max_cache_tokens}")
    cfg = ServeConfig(
        worker=args.worker,
        max_batch_tokens=args.max_batch_tokens,
        request_timeout_s=args.request_timeout,
        batch_wait_ms=args.batch_wait_ms,
        continuous=not args.no_continuous,
        max_queue=args.max_queue,
        max_sentences=args.max_sentences,
        api_key=api_key,
        public_metrics=args.public_metrics,
        max_attention_sentences=args.max_attention_sentences,
        cors_origins=tuple(args.cors_origin or ()),
    )
    for origin in cfg.cors_origins:
        if problem := origin_problem(origin):
            raise AiaynError(f"--cors-origin {origin}: {problem}")
    if args.max_cache_tokens is not None:  # else the server's default
        cfg.max_cache_tokens = args.max_cache_tokens
    if args.max_attention_sentences < 0:
        raise AiaynError(
            f"--max-attention-sentences must be >= 0, got {args.max_attention_sentences}"
        )
    # Oversubscribing the cores is allowed (only slow); OpenMP fails to start 20,000 threads
    # and crashes at 100,000.
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise AiaynError(f"--threads must be in 1..{MAX_THREADS}, got {args.threads}")
    if args.worker == "process" and args.device != "cpu":
        # Loaded on the CPU here and moved to the GPU by the worker process: the server
        # process never holds the weights on the GPU (nor a CUDA context).
        from aiayn.checkpoint import resolve_device

        device = str(resolve_device(args.device))  # a device this machine has, or an error
        if args.quantize and device != "cpu":
            raise AiaynError(f"int8 quantization runs on the CPU only, not on {device}")
        cfg.worker_device = device if device != "cpu" else None
        load_on = "cpu"
    else:
        load_on = None
    # Loaded once, before the port opens, by serve() itself: this frame keeps no reference,
    # so with a worker process the server process frees its copy of the weights.
    serve(lambda: translator_for(args, device=load_on), cfg, args.host, args.port, args.threads)
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="an HTTP translation server with batching and a web page")
    add_ensemble_flags(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    add_inference_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=4096,
        help="padded source tokens of a batch (a request over it runs alone)",
    )
    p.add_argument(
        "--max-cache-tokens",
        type=int,
        help="decoder-cache positions of a batch: sentences x beam x (longest source + longest "
        "output); a request over it alone gets 413 (default 131072: 3 GiB for a base model)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="seconds a request may take; then 504, and its sentences are dropped (default 60)",
    )
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="wait for more requests")
    p.add_argument(
        "--no-continuous",
        action="store_true",
        help="batch whole requests only: new sentences wait for the running batch to finish",
    )
    p.add_argument(
        "--worker",
        choices=("process", "thread"),
        default="process",
        help="run the model in a process of its own (default: no GIL shared with the HTTP "
        "side) or in a thread of the server's process",
    )
    p.add_argument("--max-queue", type=int, default=1024, help="sentences waiting; more: 429")
    p.add_argument("--max-sentences", type=int, default=64, help="per request")
    p.add_argument(
        "--max-attention-sentences",
        type=int,
        default=4,
        help='sentences a request with "attention": true may hold; more: 413 (default 4)',
    )
    p.add_argument(
        "--api-key-env",
        help="require the API key held in this variable (on /translate, /metrics and /info)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="a web page's origin (e.g. http://localhost:3000) whose scripts may call the "
        "API from a browser (CORS); repeat it for several, * for any",
    )
    p.add_argument(
        "--public-metrics",
        action="store_true",
        help="with an API key, leave /metrics and /info open (e.g. to a Prometheus scraper)",
    )
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.set_defaults(func=cmd_serve)
