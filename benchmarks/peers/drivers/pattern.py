"""What every driver shares, standard library only (it is imported by the peers' venvs too):
the payloads, the plan, CPU from /proc, percentiles, and the one JSON line a driver prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

REQUEST = {"capability_name": "echo", "item": "Bose QuietComfort 45"}
"""The benchmark's REQUEST payload (`benchmarks.load.request`); each carries its own `n`."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def request_payload(n: int) -> dict[str, Any]:
    return {**REQUEST, "n": n}


def response_payload(n: object) -> dict[str, Any]:
    return {"status": "success", "echo": n}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all of its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def arguments() -> argparse.Namespace:
    """`--pairs N --round-trips R --one-way M`: N pairs each make R closed-loop round trips (one
    outstanding), then one sender sends M messages to one receiver, which counts them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--one-way", type=int, default=5000)
    parser.add_argument("--url", default="")
    parser.add_argument("--broker-pid", type=int, default=0)
    return parser.parse_args()


class Window:
    """CPU of the broker and of the agents' processes (this one and `agent_pids`) around one
    measured pattern."""

    def __init__(self, broker_pid: int, agent_pids: tuple[int, ...] = ()) -> None:
        self.broker_pid = broker_pid
        self.agent_pids = (os.getpid(), *agent_pids)
        self.started = time.perf_counter()
        self.broker = cpu_seconds(broker_pid)
        self.agents = self.agent_cpu()

    def agent_cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.agent_pids)

    def close(self, messages: int, rtts: list[float] | None = None) -> dict[str, Any]:
        seconds = time.perf_counter() - self.started
        out: dict[str, Any] = {
            "messages": messages,
            "seconds": round(seconds, 4),
            "broker_cpu_s": round(cpu_seconds(self.broker_pid) - self.broker, 4),
            "agent_cpu_s": round(self.agent_cpu() - self.agents, 4),
        }
        if rtts is not None:
            rtts.sort()
            out["rtt_p50_ms"] = round(percentile(rtts, 0.50) * 1000, 3)
            out["rtt_p99_ms"] = round(percentile(rtts, 0.99) * 1000, 3)
        return out


def emit(result: dict[str, Any]) -> None:
    """The driver's one line of results on stdout (its other output goes to stderr)."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
