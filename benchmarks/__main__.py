"""`python -m benchmarks [--quick]`: every figure of BENCHMARKS.md, each lobby figure next to a
dumb websockets relay measured in the same run, printed as a table and written as JSON."""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks import harness, load, sdk_load

RESULTS = Path(__file__).parent / "results" / "latest.json"


def machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "websockets": importlib.metadata.version("websockets"),
    }


def throughput_rows(seconds: float, pair_counts: list[int], window: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for pairs in pair_counts:
        args = (pairs, seconds, window)
        with harness.relay() as server:
            relay = harness.measured(server, load.throughput, server.url, *args)
        with harness.lobby("sqlite") as server:
            sqlite = harness.measured(server, load.throughput, server.url, *args)
            sqlite["store"] = harness.health(server)["store"]
        with harness.lobby("memory") as server:
            memory = harness.measured(server, load.throughput, server.url, *args)
        rows[f"{pairs} pairs"] = {"relay": relay, "lobby_sqlite": sqlite, "lobby_memory": memory}
    return rows


def latency_rows(seconds: float, rates: list[float]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for rate in rates:
        with harness.relay() as server:
            (relay,) = harness.in_processes(load.latency, [(server.url, rate, seconds)])
        with harness.lobby("sqlite") as server:
            (lobby,) = harness.in_processes(load.latency, [(server.url, rate, seconds)])
        rows[f"{rate:g}/s"] = {"relay": relay, "lobby": lobby}
    return rows


def connection_rows(agents: int, processes: int) -> dict[str, Any]:
    """N idle registered agents: the server's memory per agent, and registrations per second."""
    per = agents // processes
    rows: dict[str, Any] = {}
    for name, start in (("relay", harness.relay), ("lobby", harness.lobby)):
        with start() as server:
            args = [(server.url, per, f"idle{p}x", 1.0) for p in range(processes)]
            before, peak, results = harness.peak_rss_during(
                server, functools.partial(harness.in_processes, load.idle_agents, args)
            )
            registered = sum(r["registered"] for r in results)
            rows[name] = {
                "agents": registered,
                "kib_per_agent": (peak - before) / max(registered, 1),
                "registrations_per_s": registered / max(r["seconds"] for r in results),
            }
    return rows


def discovery_rows(sizes: list[int], queries: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for size in sizes:
        with harness.lobby("memory") as server:
            (result,) = harness.in_processes(load.discovery, [(server.url, size, 1000, queries)])
        rows[f"{size} capabilities"] = result
    return rows


def sdk_row(seconds: float, window: int) -> dict[str, Any]:
    with harness.lobby("sqlite") as server:
        sdk = harness.measured(server, sdk_load.throughput, server.url, seconds, window)
        raw = harness.measured(server, load.throughput, server.url, 1, seconds, window)
    return {"sdk": sdk, "raw_client": raw}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def report(results: dict[str, Any]) -> str:
    lines = [f"machine: {results['machine']}", "", "throughput (REQUEST+RESPONSE messages/s)"]
    lines.append(f"{'':10} {'relay':>9} {'sqlite':>9} {'ratio':>6} {'memory':>9} {'ratio':>6}"
                 f" {'cpu us/msg relay/sqlite/memory':>32}")  # fmt: skip
    for name, row in results["throughput"].items():
        r, s, m = row["relay"], row["lobby_sqlite"], row["lobby_memory"]
        lines.append(
            f"{name:10} {r['messages_per_s']:9.0f} {s['messages_per_s']:9.0f}"
            f" {ratio(s['messages_per_s'], r['messages_per_s']):>6} {m['messages_per_s']:9.0f}"
            f" {ratio(m['messages_per_s'], r['messages_per_s']):>6}"
            f" {r['server_cpu_us_per_message']:10.1f} {s['server_cpu_us_per_message']:10.1f}"
            f" {m['server_cpu_us_per_message']:10.1f}"
        )
    lines += ["", f"{'latency (ms, round trip)':30} relay p50/p99/p99.9   lobby p50/p99/p99.9"]
    for name, row in results["latency"].items():
        r, lo = row["relay"], row["lobby"]
        lines.append(
            f"{name:30} {r['p50']:6.2f} {r['p99']:6.2f} {r['p99.9']:6.2f}"
            f"   {lo['p50']:6.2f} {lo['p99']:6.2f} {lo['p99.9']:6.2f}  {ratio(lo['p99'], r['p99'])}"
        )
    c = results["connections"]
    lines += [
        "",
        f"idle agents: lobby {c['lobby']['agents']} agents, {c['lobby']['kib_per_agent']:.1f} KiB"
        f" each (relay {c['relay']['kib_per_agent']:.1f}), "
        f"{c['lobby']['registrations_per_s']:.0f} registrations/s",
        "",
        "discovery latency (ms)          exact p50/p99     keyword p50/p99    lexical p50/p99",
    ]
    for name, row in results["discovery"].items():
        lines.append(
            f"{name:30} "
            + "   ".join(
                f"{row[k]['p50']:7.2f} {row[k]['p99']:7.2f}"
                for k in ("exact_name", "keyword", "lexical")
            )
        )
    window = list(results["throughput"].values())[-1]["lobby_sqlite"]["store"]
    lines += [
        "",
        f"store: {window['batches']} commits, {window['records']} records, longest commit"
        f" {window['max_commit_ms']} ms, crash window {window['crash_window_ms']} ms",
    ]
    sdk = results["sdk"]
    lines += [
        "",
        f"SDK agents: {sdk['sdk']['messages_per_s']:.0f} msgs/s vs raw clients "
        f"{sdk['raw_client']['messages_per_s']:.0f} on the same lobby"
        f" ({ratio(sdk['sdk']['messages_per_s'], sdk['raw_client']['messages_per_s'])})",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    quick = args.quick
    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    seconds = 1.0 if quick else 2.0
    phases: dict[str, Callable[[], dict[str, Any]]] = {
        "throughput": lambda: throughput_rows(seconds, [1] if quick else [1, 10, 100], 32),
        "latency": lambda: latency_rows(seconds, [200] if quick else [200, 1000, 5000]),
        "connections": lambda: connection_rows(200 if quick else 10_000, 1 if quick else 4),
        "discovery": lambda: discovery_rows(
            [1000] if quick else [1000, 10_000, 100_000], 20 if quick else 50
        ),
        "sdk": lambda: sdk_row(seconds, 32),
    }
    results["phase_seconds"] = {}
    for name, phase in phases.items():
        started = time.monotonic()
        results[name] = phase()
        results["phase_seconds"][name] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(report(results))
    print(f"\nphases (s): {results['phase_seconds']}")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
