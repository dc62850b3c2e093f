"""`aiayn data get NAME` and `aiayn data list`: named data sets in the cache."""

from __future__ import annotations

import argparse

from aiayn.data.download import TIMEOUT_S


def cmd_data_get(args: argparse.Namespace) -> int:
    from aiayn.data.datasets import get, language_pair
    from aiayn.data.download import check_timeout, check_url

    # Checked here first only to name the flags; the library checks them again.
    check_timeout(args.timeout, "--timeout")
    if args.mirror:
        check_url(args.mirror, "--mirror")
    langs = language_pair(args.name, args.pair) if args.pair is not None else None
    get(
        args.name,
        langs=langs,
        splits=args.split,
        mirror=args.mirror,
        timeout=args.timeout,
        show_progress=not args.no_progress,
    )
    return 0


def cmd_data_list(args: argparse.Namespace) -> int:
    from aiayn.data.datasets import DATASETS, cache_dir, cached

    print(f"cache: {cache_dir()}  (set AIAYN_DATA to move it)")
    for name, folder, have, total in cached():
        state = f"{have} of {total} files" if have < total else "complete"
        print(f"{name:<12} {state:<16} {folder}")
        print(f"{'':<12} licence: {DATASETS[name].licence}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("data", help="download named data sets (multi30k, wmt14-en-de) to a cache")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    g = data_sub.add_parser("get", help="download and check a data set (nothing already there)")
    g.add_argument("name", help="multi30k | wmt14-en-de")
    g.add_argument("--pair", help="only these two languages, e.g. de-en (multi30k)")
    g.add_argument(
        "--split", action="append", help="only this split (multi30k: train, val, test2016, "
        "test2017, test2018, test2017mscoco); repeat it for several",
    )  # fmt: skip
    g.add_argument(
        "--mirror", help="base URL that holds the upstream paths (default: upstream; "
        "env AIAYN_MIRROR)",
    )  # fmt: skip
    g.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds without a byte")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.set_defaults(func=cmd_data_get)
    ls = data_sub.add_parser("list", help="what is cached, and where")
    ls.set_defaults(func=cmd_data_list)
