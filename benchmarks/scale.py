"""The `scale` phase of `python -m benchmarks`: one lobby node holding many idle agents (issue 34,
item 1). For each transport (websockets, picows), a fresh lobby (sqlite store) is filled with
1,000 idle registered agents, then another with N: the agents come from several client
processes at once (`benchmarks.scale_clients`, lean clients: no task per connection), each
process below its own open-file limit and bound to a source address 127.0.0.2, .3, ... (one
per `PER_SOURCE` agents: see there). Measured: the lobby's RSS per agent (highest RSS while
filling and holding, less the RSS before), registrations per second over all processes, the
lobby's and the clients' CPU per registration, and, while the agents are held, from another
process, DISCOVER_SERVICES round trips (by exact name and by keyword, over a registry of one
capability per `CAPABLE_EVERY` agents) and one routed pair's REQUEST->RESPONSE round trip, open
loop at `PAIR_RATE` messages a second (as the latency phase).

N is 100,000, at most the lobby's open-file limit less `FD_SPARE` (it holds one descriptor per
agent): the hard limit cannot be raised from inside the run, so the phase states the cap and
why; a machine whose limit is raised (docs/deploy.md) runs the full 100,000 unchanged. Every
process started here is killed at the end of its round, errors included; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import time
import uuid
from typing import Any

import orjson

from benchmarks import harness, load, scale_clients, suite
from benchmarks.harness import BenchError

FULL_AGENTS = 100_000
QUICK_AGENTS = 300
BASELINE_AGENTS = 1_000
QUICK_BASELINE_AGENTS = 100
FD_SPARE = 500
"""Descriptors the lobby keeps for its store, its listener, the discovery worker's pipes and
the measuring process: N is at most the open-file limit less this."""
CLIENT_SPARE = 200
"""Descriptors a client process keeps beyond its agents."""
PER_SOURCE = 10_000
"""Agents per source address. One source address reaches one listening port through the
ephemeral ports (28,232 by default), but Linux's connect() takes the even ones first: past
half of them each connect() walks the even half before finding an odd port, 0.8 ms of CPU
here against 25 us (measured: BENCHMARKS.md, "What stands in the way past N")."""
PER_PROCESS = 25_000
"""Agents per client process at most (fewer when its open-file limit is lower)."""
MIN_PROCESSES = 2
TRANSPORTS = ("websockets", "picows")
QUERIES = 300
"""DISCOVER_SERVICES timed of each kind (after `load.WARMUP_ROUND_TRIPS` untimed)."""
PAIR_RATE = 1000.0
PAIR_SECONDS = 3.0
"""1,500 round trips: the p99 is the 15th slowest."""
QUICK_PAIR_SECONDS = 0.5
SETUP_BOUND = 600.0
"""Seconds the agents may take to register (100,000 at 1,000/s is 100 s)."""
TARGET_KIB_PER_AGENT = 16.0
TARGET_REGISTRATIONS_PER_S = 3000.0
TARGET_PAIR_P99 = 1.5
"""The pair's p99 with N agents held, at most this times its p99 with 1,000."""


def layout(agents: int, limit: int) -> list[tuple[str, range]]:
    """(source address, agent numbers) of each client process: each process below its own
    open-file limit and within one source address, each address at most `PER_SOURCE` agents."""
    sources = max(1, math.ceil(agents / PER_SOURCE))
    cap = max(1, min(PER_PROCESS, limit - CLIENT_SPARE))
    processes = max(MIN_PROCESSES, math.ceil(agents / cap))
    processes = math.ceil(processes / sources) * sources
    each = math.ceil(agents / processes)
    return [
        (f"127.0.0.{2 + p * sources // processes}", range(p * each, min(agents, (p + 1) * each)))
        for p in range(processes)
    ]


async def probe(
    url: str, server_pid: int, agents: int, queries: int, seconds: float
) -> dict[str, Any]:
    """While the agents are held: DISCOVER_SERVICES round trips (ms) by exact name and by
    keyword (each a name or keyword some agent offers), then one pair's REQUEST->RESPONSE round
    trips (`load.latency`)."""
    offered = math.ceil(agents / scale_clients.CAPABLE_EVERY)
    names = min(scale_clients.SKILLS, offered)
    keywords = min(scale_clients.KEYWORDS, offered)
    me = f"asker{uuid.uuid4().hex[:6]}"
    ws, token = await load.register(url, me, [])
    results: dict[str, Any] = {}
    try:
        for kind, payload in (
            ("exact_name", lambda q: {"capability_name": f"skill_{q % names}"}),
            ("keyword", lambda q: {"keywords": [f"kw{q % keywords}"]}),
        ):
            times, matches = [], 0
            for q in range(load.WARMUP_ROUND_TRIPS + queries):
                frame = orjson.dumps(
                    {
                        "sender_id": me,
                        "receiver_id": "global_lobby",
                        "message_type": "DISCOVER_SERVICES",
                        "payload": payload(q),
                        "auth_token": token,
                    }
                )
                sent = time.perf_counter()
                await ws.send(frame, text=True)
                answer = orjson.loads(await ws.recv())
                if answer["message_type"] != "SERVICES_AVAILABLE":
                    raise BenchError(f"DISCOVER_SERVICES answered {answer}")
                if q >= load.WARMUP_ROUND_TRIPS:
                    times.append((time.perf_counter() - sent) * 1000)
                    matches += len(answer["payload"]["services_found"])
            times.sort()
            results[kind] = {**load.percentiles(times), "matches": matches / max(queries, 1)}
    finally:
        await load.close_all([ws])
    results["pair"] = await load.latency(url, server_pid, PAIR_RATE, seconds)
    return results


def children_rss_kib(pid: int) -> int:
    """RSS of the lobby's child processes (the discovery worker), KiB."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in f.read().split():
                with contextlib.suppress(OSError):
                    total += harness.rss_kib(int(child))
    return total


def receive(pipe: Any, bound: float, expected: str) -> Any:
    if not pipe.poll(bound):
        raise BenchError(f"a client process did not answer {expected!r} within {bound:g} s")
    what, value = pipe.recv()
    if what != expected:
        raise BenchError(f"a client process answered {what!r}, not {expected!r}")
    return value


def one_round(agents: int, transport: str, limit: int, hold: float, quick: bool) -> dict[str, Any]:
    """A fresh lobby on `transport` filled with `agents` idle agents; what it measured."""
    extra = ["--max-connections", str(agents + FD_SPARE), "--transport", transport]
    context = multiprocessing.get_context("spawn")
    tag = f"s{uuid.uuid4().hex[:4]}x"
    processes = layout(agents, limit)
    with harness.lobby("sqlite", *extra) as server:
        pipes, children = [], []
        try:
            for source, numbers in processes:
                parent, child = context.Pipe()
                args = (server.url, source, tag, numbers, child)
                children.append(context.Process(target=scale_clients.main, args=args, daemon=True))
                children[-1].start()
                pipes.append(parent)
            for pipe in pipes:
                receive(pipe, 60, "loaded")
            harness.QUIET.wait()
            cpu_before = server.cpu_seconds()
            reports: list[dict[str, Any]] = []

            def fill() -> None:
                for pipe in pipes:
                    pipe.send(("go",))
                reports.extend(receive(pipe, SETUP_BOUND, "ready") for pipe in pipes)
                time.sleep(hold)  # held, idle: the RSS sampler keeps reading

            before, peak, _ = harness.peak_rss_during(server, fill)
            registered = sum(r["registered"] for r in reports)
            seconds = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
            cpu = server.cpu_seconds() - cpu_before
            probed = harness.one(
                probe, server.url, server.pid, agents, QUERIES // 10 if quick else QUERIES,
                QUICK_PAIR_SECONDS if quick else PAIR_SECONDS, timeout=SETUP_BOUND,
            )  # fmt: skip
            worker = children_rss_kib(server.pid)
            for pipe in pipes:
                pipe.send(("stop",))
            for pipe in pipes:
                receive(pipe, 60, "stopped")
        finally:
            harness.stop_clients(pipes, children)
    return {
        "agents": registered,
        "failed": sum(r["failed"] for r in reports),
        "failures": [f for r in reports for f in r["failures"]][:3],
        "processes": len(processes),
        "sources": len({source for source, _ in processes}),
        "rss_before_kib": before,
        "rss_peak_kib": peak,
        "kib_per_agent": (peak - before) / max(registered, 1),
        "registrations_per_s": registered / seconds,
        "server_cpu_us_per_registration": cpu * 1e6 / max(registered, 1),
        "client_cpu_us_per_registration": sum(r["cpu"] for r in reports) * 1e6 / max(registered, 1),
        "worker_rss_kib": worker,
        **probed,
    }


def scale(plan: suite.Plan) -> dict[str, Any]:
    """For each transport: 1,000 idle agents, then N (a quick run: 100, then 300)."""
    limit = harness.raise_fd_limit()
    quick = plan.repeats == 1
    wanted = QUICK_AGENTS if quick else FULL_AGENTS
    agents = min(wanted, limit - FD_SPARE)
    baseline = min(QUICK_BASELINE_AGENTS if quick else BASELINE_AGENTS, agents)
    results: dict[str, Any] = {
        "fd_limit": limit,
        "wanted": wanted,
        "agents": agents,
        "baseline": baseline,
        "cap": None
        if agents == wanted
        else (
            f"N = {agents:,}, not {wanted:,}: the open-file limit is {limit:,} (hard; raise it "
            f"as docs/deploy.md says) and the lobby holds one descriptor per agent, "
            f"{FD_SPARE} kept spare"
        ),
    }
    for transport in TRANSPORTS:
        rows = {}
        for size in (baseline, agents):
            rows[str(size)] = one_round(size, transport, limit, plan.hold, quick)
            print(f" {transport}:{size}", end="", flush=True)  # a round takes a minute
        results[transport] = rows
    return results


def scale_targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) of the phase, the websockets transport's (the default)."""
    n, base = str(results["agents"]), str(results["baseline"])
    out = []
    for transport in TRANSPORTS:
        big, small = results[transport][n], results[transport][base]
        out.append(
            (
                f"scale, {transport}: <= {TARGET_KIB_PER_AGENT:g} KiB per idle agent, "
                f"{big['agents']:,} held",
                f"{big['kib_per_agent']:.1f} KiB",
                big["kib_per_agent"] <= TARGET_KIB_PER_AGENT,
            )
        )
        out.append(
            (
                f"scale, {transport}: >= {TARGET_REGISTRATIONS_PER_S:,.0f} registrations/s",
                f"{big['registrations_per_s']:,.0f}/s",
                big["registrations_per_s"] >= TARGET_REGISTRATIONS_PER_S,
            )
        )
        p, q = big["pair"]["p99"], small["pair"]["p99"]
        out.append(
            (
                f"scale, {transport}: a pair's p99 with {big['agents']:,} held <= "
                f"{TARGET_PAIR_P99:g}x with {small['agents']:,}",
                f"{p / q:.2f}x ({p:.2f} vs {q:.2f} ms)",
                p <= TARGET_PAIR_P99 * q,
            )
        )
    return out
