"""`python -m benchmarks [--quick] [--only PHASE ...]`: every figure of BENCHMARKS.md, each
lobby figure next to a dumb websockets relay measured in the same run; prints Markdown tables
and the targets of issue 8, and writes benchmarks/results/latest.json."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks import (
    addressed,
    cluster_store,
    faults,
    harness,
    report,
    scale,
    storm,
    storm_cluster,
    suite,
)

RESULTS = Path(__file__).parent / "results" / "latest.json"
QUIET_BUDGET = {
    "throughput": 10.0,
    "transport": 5.0,
    "schema": 5.0,
    "addressed": 5.0,
    "metrics": 5.0,
    "latency": 5.0,
    "connections": 5.0,
    "discovery_pressure": 5.0,
    "sdk": 5.0,
    "cluster": 5.0,
    "scale": 10.0,
}
"""Seconds each phase may wait for other processes to leave the cores idle (`harness.Quiet`)."""
PHASES: dict[str, Callable[[suite.Plan], dict[str, Any]]] = {
    "throughput": suite.throughput,
    "transport": suite.transport,
    "schema": suite.schema,
    "addressed": addressed.addressed,
    "metrics": suite.metrics,
    "latency": suite.latency,
    "connections": suite.connections,
    "discovery": suite.discovery,
    "discovery_pressure": suite.discovery_pressure,
    "sdk": suite.sdk,
    "cluster": cluster_store.cluster,
    "faults": faults.faults,
    "storm": storm.storm,
    "storm_cluster": storm_cluster.storm_cluster,
    "scale": scale.scale,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--only", nargs="+", choices=list(PHASES), help="run only these phases")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    plan = suite.Plan.quick() if args.quick else suite.Plan.full()
    machine = report.machine()
    print(f"Machine: {report.describe(machine)}", flush=True)
    results: dict[str, Any] = {
        "machine": machine,
        "quick": args.quick,
        "plan": {k: v for k, v in dataclasses.asdict(plan).items() if k != "latency_seconds"},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "phase_seconds": {},
    }
    started = time.monotonic()
    for name in args.only or PHASES:
        print(f"... {name}", end="", flush=True)
        phase_started = time.monotonic()
        # A smoke run does not wait for a quiet machine.
        harness.QUIET.budget = 0.0 if args.quick else QUIET_BUDGET.get(name, 0.0)
        results[name] = PHASES[name](plan)
        results["phase_seconds"][name] = round(time.monotonic() - phase_started, 1)
        print(f" {results['phase_seconds'][name]} s", flush=True)
    results["total_seconds"] = round(time.monotonic() - started, 1)
    results["waited_for_quiet_seconds"] = round(harness.QUIET.waited, 1)
    results["targets"] = report.targets(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print()
    print(report.render(results))
    if "addressed" in results:  # its own table: REQUESTs by capability vs by agent id
        print(
            f"### Capability-addressed REQUESTs vs direct ones, {results['addressed']['pairs']} "
            "pairs\n"
        )
        print("\n".join(addressed.table(results["addressed"])) + "\n")
    if "faults" in results:  # its own table: what was lost or repeated under each fault
        print("### Faults: the cluster's promise under faults\n")
        print(faults.render(results["faults"]))
    if "storm" in results:  # its own table: the reconnect storm after a restart
        print("### Reconnect storm: a durable lobby restarted under its agents\n")
        print(storm.render(results["storm"]))
    if "storm_cluster" in results:  # its own table: the storm on a cluster, one node killed
        print("### Reconnect storm: a 2-node cluster, one node killed\n")
        print(storm_cluster.render(results["storm_cluster"]))
    print(
        f"\nTotal {results['total_seconds']} s (of which {results['waited_for_quiet_seconds']} s"
        f" waiting for other processes to leave the cores idle); phases (s): "
        f"{results['phase_seconds']}"
    )
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
