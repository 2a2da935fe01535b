"""The phases of a benchmark run. Each returns a plain dict (it goes into the JSON as is); every
lobby figure is measured next to the relay's in the same phase, on the same load generator.

`Plan` holds the sizes; `Plan.full()` is `make bench`, `Plan.quick()` the few-second smoke run.
`quick_throughput` is the smallest run that still measures both servers (the test suite's).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from benchmarks import discovery_load, harness, load, sdk_load
from lobby.config import Settings

LOAD_SLACK = 60.0
"""Seconds a load process may take beyond its measured window (connect, register, close)."""


@dataclass(frozen=True)
class Plan:
    seconds: float = 1.5
    repeats: int = 3
    pair_counts: tuple[int, ...] = (1, 10, 100)
    transport_pairs: int = 10
    schema_pairs: int = 10
    window: int = 32
    latency_rates: tuple[float, ...] = (200, 1000, 5000)
    latency_seconds: dict[float, float] = field(
        default_factory=lambda: {200: 2.0, 1000: 2.0, 5000: 2.0}
    )
    agents: int = 10_000
    agent_processes: int = 2
    hold: float = 1.5
    """Seconds the idle agents stay connected after the last registered (RSS is sampled)."""
    discovery_sizes: tuple[int, ...] = (1000, 10_000, 100_000)
    per_agent: int = 1000
    queries: int = 200
    pressure_capabilities: int = 100_000
    pressure_clients: int = 3
    """Connections sending heavy DISCOVERs back to back (`discovery_load.MIXES`): three, as in
    the attack that stalled the lobby (three keyword DISCOVERs of 3.8 MB each)."""
    pressure_rate: float = 1000
    """REQUEST+RESPONSE messages a second of the pair measured beside them."""
    cluster_pairs: int = 10
    """Request/response pairs of the cluster phase (`cluster_store.cluster`)."""
    pressure_seconds: float = 3.0
    """Seconds of each pair run: 1,500 round trips, so its p99 is the 15th slowest (at 2 s
    the baseline's p99 moved from 0.95 to 1.80 ms between quiet runs)."""

    @classmethod
    def full(cls) -> Plan:
        return cls()

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            seconds=0.5,
            repeats=1,
            pair_counts=(1,),
            latency_rates=(200,),
            latency_seconds={200: 0.5},
            agents=200,
            agent_processes=1,
            hold=0.3,
            discovery_sizes=(1000,),
            queries=20,
            pressure_capabilities=2000,
            pressure_clients=2,
            pressure_seconds=0.5,
            cluster_pairs=2,
        )


def throughput_run(
    server: harness.Server, pairs: int, seconds: float, window: int, quiet: bool = True
) -> Any:
    if quiet:
        harness.QUIET.wait()
    return harness.one(
        load.throughput, server.url, server.pid, pairs, seconds, window,
        timeout=seconds + LOAD_SLACK,
    )  # fmt: skip


def quick_throughput(seconds: float = 1.0, window: int = 8) -> dict[str, Any]:
    """One pair through the relay, then through the lobby with the sqlite store."""
    with harness.relay() as relay:
        baseline = throughput_run(relay, 1, seconds, window, quiet=False)
    with harness.lobby("sqlite") as lobby:
        routed = throughput_run(lobby, 1, seconds, window, quiet=False)
    return {"relay": baseline, "lobby_sqlite": routed}


def throughput(plan: Plan) -> dict[str, Any]:
    """Per pair count: relay, lobby/sqlite and lobby/memory, all three started at once and run
    in turn, `repeats` times round; the best run of each is kept (noise on a shared machine
    only ever slows a run down), every run is in `runs`."""
    rows: dict[str, Any] = {}
    for pairs in plan.pair_counts:
        runs: dict[str, list[dict[str, Any]]] = {
            "relay": [],
            "lobby_sqlite": [],
            "lobby_memory": [],
        }
        with (
            harness.relay() as relay,
            harness.lobby("sqlite") as sqlite,
            harness.lobby("memory") as memory,
        ):
            servers = {"relay": relay, "lobby_sqlite": sqlite, "lobby_memory": memory}
            for _ in range(plan.repeats):
                for name, server in servers.items():
                    runs[name].append(throughput_run(server, pairs, plan.seconds, plan.window))
            store = harness.health(sqlite)["store"]
        row: dict[str, Any] = {
            name: max(results, key=lambda r: float(r["messages_per_s"]))
            for name, results in runs.items()
        }
        row["store"] = store
        row["runs"] = runs
        rows[str(pairs)] = row
    return rows


def transport(plan: Plan) -> dict[str, Any]:
    """The two transports side by side, `transport_pairs` pairs: the websockets relay and the
    picows relay (each transport's own limit), the lobby (sqlite store) on each; all started at
    once and run in turn, `repeats` times round, the best run of each kept."""
    starts: dict[str, Callable[[], AbstractContextManager[harness.Server]]] = {
        "relay": harness.relay,
        "relay_picows": harness.relay_picows,
        "lobby": functools.partial(harness.lobby, "sqlite"),
        "lobby_picows": functools.partial(harness.lobby, "sqlite", "--transport", "picows"),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in starts}
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(start()) for name, start in starts.items()}
        for _ in range(plan.repeats):
            for name, server in servers.items():
                runs[name].append(
                    throughput_run(server, plan.transport_pairs, plan.seconds, plan.window)
                )
    best = {k: max(v, key=lambda r: float(r["messages_per_s"])) for k, v in runs.items()}
    return {**best, "pairs": plan.transport_pairs, "runs": runs}


def schema(plan: Plan) -> dict[str, Any]:
    """REQUESTs to a capability with a typed input schema (`load.EchoInput`) against the same
    REQUESTs to one without, `schema_pairs` pairs, each on its own sqlite lobby (a lobby that
    served earlier runs is a little slower: one lobby for both would favour whichever ran
    first), next to the relay; all started at once and run in turn, `repeats` times round, the
    best run of each kept."""
    pairs, seconds, window = plan.schema_pairs, plan.seconds, plan.window
    runs: dict[str, list[dict[str, Any]]] = {"relay": [], "no_schema": [], "schema": []}
    with (
        harness.relay() as relay,
        harness.lobby("sqlite") as plain,
        harness.lobby("sqlite") as checked,
    ):
        for _ in range(plan.repeats):
            runs["relay"].append(throughput_run(relay, pairs, seconds, window))
            runs["no_schema"].append(throughput_run(plain, pairs, seconds, window))
            harness.QUIET.wait()
            runs["schema"].append(
                harness.one(
                    load.schema_throughput, checked.url, checked.pid, pairs, seconds, window,
                    timeout=seconds + LOAD_SLACK,
                )
            )  # fmt: skip
    best = {k: max(v, key=lambda r: float(r["messages_per_s"])) for k, v in runs.items()}
    return {**best, "pairs": pairs, "runs": runs}


def metrics(plan: Plan) -> dict[str, Any]:
    """What /metrics costs routing: `transport_pairs` pairs through a lobby (sqlite store)
    nobody scrapes and through one scraped once a second for the whole run (a Prometheus
    default is every 15 s), each its own lobby, next to the relay; all started at once and run
    in turn, `repeats` times round, the best run of each kept."""
    pairs, seconds, window = plan.transport_pairs, plan.seconds, plan.window
    runs: dict[str, list[dict[str, Any]]] = {"relay": [], "unscraped": [], "scraped": []}
    with (
        harness.relay() as relay,
        harness.lobby("sqlite") as plain,
        harness.lobby("sqlite") as scraped,
    ):
        for _ in range(plan.repeats):
            runs["relay"].append(throughput_run(relay, pairs, seconds, window))
            runs["unscraped"].append(throughput_run(plain, pairs, seconds, window))
            harness.QUIET.wait()
            with harness.scraping(scraped, every=1.0) as scrapes:
                run = throughput_run(scraped, pairs, seconds, window, quiet=False)
            runs["scraped"].append({**run, **scrapes})
    best = {k: max(v, key=lambda r: float(r["messages_per_s"])) for k, v in runs.items()}
    return {**best, "pairs": pairs, "runs": runs}


def latency(plan: Plan) -> dict[str, Any]:
    """One pair at each offered load (REQUEST+RESPONSE messages a second) through the relay and
    the lobby with the sqlite store, both started at once and run in turn, `repeats` times
    round; the run with the lowest p99 of each is kept (noise only ever adds to a tail), every
    run is in `runs`."""
    rows: dict[str, Any] = {}
    for rate in plan.latency_rates:
        seconds = plan.latency_seconds[rate]
        runs: dict[str, list[dict[str, Any]]] = {"relay": [], "lobby": []}
        with harness.relay() as relay, harness.lobby("sqlite") as lobby:
            for _ in range(plan.repeats):
                for name, server in (("relay", relay), ("lobby", lobby)):
                    harness.QUIET.wait()
                    runs[name].append(
                        harness.one(
                            load.latency,
                            server.url,
                            server.pid,
                            rate,
                            seconds,
                            timeout=seconds + LOAD_SLACK,
                        )
                    )
        row: dict[str, Any] = {
            name: min(r, key=lambda x: float(x["p99"])) for name, r in runs.items()
        }
        row["runs"] = runs
        rows[f"{rate:g}"] = row
    return rows


def connections(plan: Plan) -> dict[str, Any]:
    """`plan.agents` idle registered agents from several processes at once: the server's RSS
    per agent (highest RSS while they are all connected, less the RSS before), registrations
    per second over all processes, and the server's CPU per registration."""
    limit = harness.raise_fd_limit()
    agents = min(plan.agents, limit - 200)
    per = agents // plan.agent_processes
    rows: dict[str, Any] = {"fd_limit": limit}
    for name, start in (("relay", harness.relay), ("lobby", harness.lobby)):
        with start() as server:
            harness.QUIET.wait()
            args = [
                (server.url, server.pid, per, f"idle{p}x", plan.hold)
                for p in range(plan.agent_processes)
            ]
            work = functools.partial(harness.in_processes, load.idle_agents, args, 240.0)
            before, peak, results = harness.peak_rss_during(server, work)
        registered = sum(r["registered"] for r in results)
        first = min(results, key=lambda r: float(r["started"]))
        last = max(results, key=lambda r: float(r["finished"]))
        seconds = last["finished"] - first["started"]
        cpu = last["server_cpu_end"] - first["server_cpu_start"]
        busy = last["machine_busy_end"] - first["machine_busy_start"]
        others = max(0.0, busy - cpu - sum(r["own_cpu"] for r in results)) / seconds
        rows[name] = {
            "agents": registered,
            "rss_before_kib": before,
            "rss_peak_kib": peak,
            "kib_per_agent": (peak - before) / max(registered, 1),
            "registrations_per_s": registered / seconds,
            "server_cpu_us_per_registration": cpu * 1e6 / max(registered, 1),
            "processes": plan.agent_processes,
            "other_cpu_share": round(others, 3),
        }
    return rows


def discovery(plan: Plan) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for size in plan.discovery_sizes:
        with harness.lobby("memory") as server:
            rows[str(size)] = harness.one(
                load.discovery, server.url, size, plan.per_agent, plan.queries, timeout=240.0
            )
    return rows


def discovery_pressure(plan: Plan) -> dict[str, Any]:
    """One pair's REQUEST/RESPONSE latency (open loop, `pressure_rate`) on a lobby (sqlite
    store) holding `pressure_capabilities` capabilities: alone, while each heavy discovery
    load (`discovery_load.MIXES`) runs from another process against the same lobby, and, as
    the control, while that load runs against a second lobby holding the same registry (the
    machine does the same discovery work; the pair's lobby does none of it). In turn,
    `repeats` times round, the run with the lowest p99 of each kept (noise only ever adds to
    a tail), every run in `runs`."""
    mixes = list(discovery_load.MIXES)
    runs: dict[str, list[dict[str, Any]]] = {"alone": [], **{mix: [] for mix in mixes}}
    elsewhere: dict[str, list[dict[str, Any]]] = {mix: [] for mix in mixes}
    seconds, rate = plan.pressure_seconds, plan.pressure_rate
    # The discovery rate limit stays on here (the other phases turn it off): it is part of
    # the lobby's defence against discovery floods, so it is part of what is measured.
    discover_rate = str(Settings().discover_rate)
    with (
        harness.lobby("sqlite", "--discover-rate", discover_rate) as server,
        harness.lobby("sqlite", "--discover-rate", discover_rate) as other,
    ):
        registry = {}
        for lobby in (other, server):
            registry = harness.one(
                discovery_load.populate, lobby.url, plan.pressure_capabilities, plan.per_agent,
                timeout=300.0,
            )  # fmt: skip

        def beside(target: harness.Server, mix: str) -> dict[str, Any]:
            # The discovery load starts first and outlasts the pair's run (its warm-up too).
            harness.QUIET.wait()
            pressure, pair = harness.in_processes(
                discovery_load.either,
                [
                    ("pressure", target.url, mix, plan.pressure_clients, seconds + 1.5),
                    ("latency", server.url, server.pid, rate, seconds),
                ],
                seconds + LOAD_SLACK,
            )
            return {**pair, "discovery": pressure}

        for _ in range(plan.repeats):
            harness.QUIET.wait()
            runs["alone"].append(
                harness.one(
                    load.latency, server.url, server.pid, rate, seconds,
                    timeout=seconds + LOAD_SLACK,
                )
            )  # fmt: skip
            for mix in mixes:
                runs[mix].append(beside(server, mix))
                elsewhere[mix].append(beside(other, mix))

    def lowest(r: list[dict[str, Any]]) -> dict[str, Any]:
        return min(r, key=lambda x: float(x["p99"]))

    best = {name: lowest(r) for name, r in runs.items()}
    return {
        **best,
        "elsewhere": {mix: lowest(r) for mix, r in elsewhere.items()},
        "registry": registry,
        "rate": rate,
        "runs": runs,
        "elsewhere_runs": elsewhere,
    }


def sdk(plan: Plan) -> dict[str, Any]:
    """Request/response calls, one pair, the same window, on one sqlite lobby: bare
    `websockets` + orjson clients ACKing every 32 deliveries (`sdk_load.bare_throughput`), two
    Agent subclasses (`sdk_load.sdk_throughput`) and the lean raw clients of the throughput
    phase; in turn, `repeats` times round, the best of each (by calls/s)."""
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "sdk": [], "raw_client": []}
    clients = {"bare": sdk_load.bare_throughput, "sdk": sdk_load.sdk_throughput}
    with harness.lobby("sqlite") as server:
        for _ in range(plan.repeats):
            runs["raw_client"].append(throughput_run(server, 1, plan.seconds, plan.window))
            for name, client in clients.items():
                harness.QUIET.wait()
                runs[name].append(
                    harness.one(
                        client, server.url, server.pid, plan.seconds, plan.window,
                        timeout=plan.seconds + LOAD_SLACK,
                    )
                )  # fmt: skip
    best = {k: max(v, key=lambda r: float(r["messages_per_s"])) for k, v in runs.items()}
    return {**best, "runs": runs}
