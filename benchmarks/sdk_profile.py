"""`python -m benchmarks.sdk_profile [--seconds S]`: where an SDK agent pair's CPU goes under
the `sdk` phase's load (`sdk_load.sdk_throughput` against a sqlite lobby), by cProfile in this
process with a CPU-time clock (a wall clock would count the time the process waits for the
machine's other tenants). Prints CPU per call by layer and the functions that cost most; the
profiler's own overhead inflates every figure, so read them as shares, not as timings."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import Counter

from benchmarks import harness, load, sdk_load

LAYERS = (
    ("agent_sdk", "agent_sdk (own code)"),
    ("websockets", "websockets (framing, parsing, receive queue)"),
    ("asyncio", "asyncio (tasks, futures, timers, locks)"),
    ("/protocol/", "protocol.codec (decode, encode)"),
    ("pydantic", "pydantic"),
)


def layer(filename: str) -> str:
    for part, name in LAYERS:
        if part in filename:
            return name
    return "C calls and system calls (write, orjson, ...)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sdk_profile", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    profile = cProfile.Profile(time.process_time)
    with harness.lobby("sqlite") as server:
        profile.enable()
        result = load.run(sdk_load.sdk_throughput(server.url, server.pid, args.seconds, 32))
        profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    served = max(v[0] for (_, _, name), v in stats.items() if name == "_serve_request")
    layers: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for (filename, _, name), (_, _, own, _, _) in stats.items():
        layers[layer(filename)] += own
        functions[f"{filename.rsplit('/', 1)[-1]}:{name}"] += own
    print(f"{result['calls']} calls measured, {result['load_cpu_us_per_call']:.1f} us CPU each")
    print(f"profiled: {served} calls, CPU us per call (profiler overhead included):")
    for name, own in layers.most_common():
        print(f"  {name:48s} {own * 1e6 / served:7.1f}")
    for name, own in functions.most_common(args.top):
        print(f"    {name:56s} {own * 1e6 / served:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
