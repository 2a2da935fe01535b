"""Changes measured before they are made: `python -m benchmarks.experiments`.

Starts the plain lobby (sqlite store) and the same lobby with each experimental patch of
`benchmarks.patched`, plus the relay and the relay with coalesced writes, all at once; runs
the throughput load against each in turn, `--repeats` times round, and prints the best run of
each with its ratio to the plain lobby (throughput and server CPU per message) and, optionally
(`--latency`), the round-trip p50/p99 at 5,000 msgs/s.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

from benchmarks import harness, load
from benchmarks.report import best_rows
from benchmarks.suite import LOAD_SLACK, throughput_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments", description=__doc__)
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--patches", nargs="+", default=["gc"])
    parser.add_argument("--latency", action="store_true", help="also p50/p99 at 5k msgs/s")
    args = parser.parse_args(argv)
    harness.QUIET.budget = 600.0
    print("| pairs | server | msgs/s | vs lobby | server CPU us/msg | vs lobby | other CPU |")
    print("|---|---|---|---|---|---|---|")
    for pairs in args.pairs:
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(harness.lobby("sqlite"))]
            servers += [
                stack.enter_context(harness.lobby("sqlite", patches=p)) for p in args.patches
            ]
            servers += [stack.enter_context(harness.relay(c)) for c in (False, True)]
            runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
            for _ in range(args.repeats):
                for server in servers:
                    runs[server.name].append(
                        throughput_run(server, pairs, args.seconds, args.window)
                    )
        for row in best_rows(pairs, runs):
            print(row, flush=True)
    if args.latency:
        print("\n| server | p50 / p99 / p99.9 ms at 5,000 msgs/s |\n|---|---|")
        starts: list[tuple[str, Callable[[], ContextManager[harness.Server]]]] = [
            ("lobby", functools.partial(harness.lobby, "sqlite"))
        ]
        starts += [
            (f"lobby+{p}", functools.partial(harness.lobby, "sqlite", patches=p))
            for p in args.patches
        ]
        starts += [
            ("relay", harness.relay),
            ("relay+coalesce", functools.partial(harness.relay, True)),
        ]
        for name, start in starts:
            with start() as server:
                harness.QUIET.wait()
                lat = harness.one(
                    load.latency, server.url, server.pid, 5000.0, 4.0, timeout=4.0 + LOAD_SLACK
                )
            print(f"| {name} | {lat['p50']:.2f} / {lat['p99']:.2f} / {lat['p99.9']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
