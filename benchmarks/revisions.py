"""Two revisions of the lobby in one run: `python -m benchmarks.revisions --before DIR`.

DIR is a checkout of an earlier commit (`git worktree add /tmp/before <commit>`). Starts the
lobby of DIR, the lobby of this tree (both sqlite, every check on) and the relay at once, runs
the throughput load against each in turn, `--repeats` times round, and prints the best run of
each with its ratio to the earlier lobby: how a change (a refactor, say) moved the routed
messages per second and the server CPU per message, measured side by side on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from benchmarks import harness
from benchmarks.report import best_rows
from benchmarks.suite import throughput_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.revisions", description=__doc__)
    parser.add_argument("--before", required=True, help="a checkout of the earlier revision")
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=32)
    args = parser.parse_args(argv)
    harness.QUIET.budget = 600.0
    print("| pairs | server | msgs/s | vs before | server CPU us/msg | vs before | other CPU |")
    print("|---|---|---|---|---|---|---|")
    for pairs in args.pairs:
        with contextlib.ExitStack() as stack:
            servers = [
                stack.enter_context(harness.lobby_from(args.before)),
                stack.enter_context(harness.lobby("sqlite")),
                stack.enter_context(harness.relay()),
            ]
            runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
            for repeat in range(args.repeats):
                # Every other round in reverse: a server run first in each round gains a little.
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    runs[server.name].append(
                        throughput_run(server, pairs, args.seconds, args.window)
                    )
        for row in best_rows(pairs, runs):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
