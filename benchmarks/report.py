"""The results as Markdown tables (readable in a terminal, pasted as is into BENCHMARKS.md):
each lobby figure with its ratio to the relay of the same run, and the targets of issue 8
with met / not met."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
from typing import Any

from benchmarks import scale, storm, storm_cluster

TARGET_THROUGHPUT = 0.8
"""routed REQUEST/RESPONSE throughput, sqlite store on: at least 0.8x the relay"""
TARGET_P99_AT_5K = 1.2
"""latency p99 at 5k msgs/s: at most 1.2x the relay's"""
TARGET_KIB_PER_AGENT = 24.0
TARGET_AGENTS = 10_000
TARGET_REGISTRATIONS_PER_S = 1000.0
TARGET_DISCOVERY_P50_MS = 1.0
TARGET_PRESSURE_P99 = 2.0
"""a pair's p99 while heavy discovery runs at 100,000 capabilities: at most 2x without it"""
PRESSURE_MIXES = ("lookups", "searches")
"""The heavy discovery loads of `benchmarks.discovery_load.MIXES`, in report order."""
TARGET_STORE_COST = 0.15
"""the durable store costs at most 15% of throughput against the in-memory store"""
TARGET_PICOWS = 1.3
"""the durable lobby on picows: at least 1.3x the websockets relay's throughput"""
TARGET_SDK_CPU = 1.3
"""an SDK agent pair: at most 1.3x the CPU per call of a bare websockets + orjson pair"""
TARGET_CLUSTER_SAME = 0.9
"""two lobby nodes, each pair on one node: at least 0.9x one node's messages/s"""
TARGET_CLUSTER_CROSS = 0.8
"""two lobby nodes, each pair across them: at least 0.8x one node's messages/s"""
TARGET_CLUSTER_P50_EXTRA = 0.3
"""a pair across two lobby nodes: its p50 round trip at most this many ms above one node's"""


def machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("websockets", "uvloop", "orjson", "pydantic"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover
            versions[package] = "absent"
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        **versions,
    }


def describe(m: dict[str, Any]) -> str:
    return (
        f"{m['nproc']} cores ({m['cpu']}), Linux {m['kernel']}, Python {m['python']}, "
        f"websockets {m['websockets']}, uvloop {m['uvloop']}, orjson {m['orjson']}"
    )


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def best_rows(pairs: int, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Table rows of each server's best throughput run, with its ratio to the first server's
    (`| pairs | server | msgs/s | vs first | server CPU us/msg | vs first | other CPU |`)."""
    best = {name: max(r, key=lambda x: float(x["messages_per_s"])) for name, r in runs.items()}
    base = next(iter(best.values()))
    return [
        f"| {pairs} | {name} | {run['messages_per_s']:,.0f} "
        f"| {ratio(run['messages_per_s'], base['messages_per_s'])} "
        f"| {run['server_cpu_us_per_message']:.1f} "
        f"| {ratio(run['server_cpu_us_per_message'], base['server_cpu_us_per_message'])} "
        f"| {max(float(x['other_cpu_share']) for x in runs[name]):.2f} |"
        for name, run in best.items()
    ]


def status(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _other(*runs: dict[str, Any]) -> str:
    """The most CPU (in cores) that other processes used during any of `runs`."""
    return f"{max(float(r.get('other_cpu_share', 0.0)) for r in runs):.2f}"


def throughput_table(rows: dict[str, Any]) -> list[str]:
    lines = [
        "| pairs | relay msgs/s | lobby sqlite msgs/s | vs relay | lobby memory msgs/s | vs relay "
        "| sqlite vs memory | server CPU us/msg relay / sqlite / memory | CPU vs relay sqlite "
        "/ memory | other CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pairs, row in rows.items():
        r, s, m = row["relay"], row["lobby_sqlite"], row["lobby_memory"]
        rc, sc, mc = (x["server_cpu_us_per_message"] for x in (r, s, m))
        lines.append(
            f"| {pairs} | {_n(r['messages_per_s'])} | {_n(s['messages_per_s'])} "
            f"| {ratio(s['messages_per_s'], r['messages_per_s'])} | {_n(m['messages_per_s'])} "
            f"| {ratio(m['messages_per_s'], r['messages_per_s'])} "
            f"| {ratio(s['messages_per_s'], m['messages_per_s'])} "
            f"| {rc:.1f} / {sc:.1f} / {mc:.1f} | {ratio(sc, rc)} / {ratio(mc, rc)} "
            f"| {_other(r, s, m)} |"
        )
    return lines


def latency_table(rows: dict[str, Any]) -> list[str]:
    lines = [
        "| offered load (msgs/s) | samples | relay p50 / p99 / p99.9 ms | lobby p50 / p99 / p99.9 "
        "ms | p50 vs relay | p99 vs relay | other CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for rate, row in rows.items():
        r, lo = row["relay"], row["lobby"]
        lines.append(
            f"| {float(rate):,.0f} | {lo['samples']} "
            f"| {r['p50']:.2f} / {r['p99']:.2f} / {r['p99.9']:.2f} "
            f"| {lo['p50']:.2f} / {lo['p99']:.2f} / {lo['p99.9']:.2f} "
            f"| {ratio(lo['p50'], r['p50'])} | {ratio(lo['p99'], r['p99'])} | {_other(r, lo)} |"
        )
    return lines


def connections_table(c: dict[str, Any]) -> list[str]:
    lo, r = c["lobby"], c["relay"]
    return [
        "| | lobby (sqlite) | relay | lobby vs relay |",
        "|---|---|---|---|",
        f"| idle connections held at once | {_n(lo['agents'])} | {_n(r['agents'])} | |",
        f"| RSS per connection (KiB) | {lo['kib_per_agent']:.1f} | {r['kib_per_agent']:.1f} "
        f"| {ratio(lo['kib_per_agent'], r['kib_per_agent'])} |",
        f"| registrations/s ({lo['processes']} load processes) | {_n(lo['registrations_per_s'])} "
        f"| {_n(r['registrations_per_s'])} "
        f"| {ratio(lo['registrations_per_s'], r['registrations_per_s'])} |",
        f"| server CPU per registration (us) | {lo['server_cpu_us_per_registration']:.0f} "
        f"| {r['server_cpu_us_per_registration']:.0f} "
        f"| {ratio(lo['server_cpu_us_per_registration'], r['server_cpu_us_per_registration'])} |",
        f"| other CPU while registering (cores) | {_other(lo)} | {_other(r)} | |",
    ]


def discovery_table(rows: dict[str, Any]) -> list[str]:
    lines = [
        "| capabilities (agents) | exact name p50 / p99 ms (matches) | keyword p50 / p99 ms "
        "(matches) | lexical BM25 top 10 p50 / p99 ms |",
        "|---|---|---|---|",
    ]
    for size, row in rows.items():
        cells = [
            f"{row[k]['p50']:.2f} / {row[k]['p99']:.2f} ({row[k]['matches']})"
            for k in ("exact_name", "keyword")
        ]
        lex = row["lexical"]
        lines.append(
            f"| {int(size):,} ({row['agents']}) | {cells[0]} | {cells[1]} "
            f"| {lex['p50']:.2f} / {lex['p99']:.2f} |"
        )
    return lines


def pressure_table(row: dict[str, Any]) -> list[str]:
    alone = row["alone"]
    lines = [
        "| heavy discovery | capabilities | pair p50 / p99 / p99.9 ms | p99 vs alone "
        "| DISCOVERs/s (clients) | DISCOVER p50 / p99 ms | capabilities per answer "
        "| largest answer KiB | other CPU | waiting for a core: pair / lobby / worker / clients |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| none (the pair alone, {row['rate']:,.0f} msgs/s) | {row['registry']['capabilities']:,} "
        f"| {_tail(alone)} | 1.00x | | | | | {_other(alone)} | {_waits(alone, None)} |",
    ]
    rows = [(mix, row[mix]) for mix in PRESSURE_MIXES if mix in row]
    rows += [
        (f"{mix}, on another lobby (control)", r) for mix, r in row.get("elsewhere", {}).items()
    ]
    for label, busy in rows:
        d = busy["discovery"]
        lines.append(
            f"| {label} | {row['registry']['capabilities']:,} | {_tail(busy)} "
            f"| {ratio(busy['p99'], alone['p99'])} "
            f"| {d['answers_per_s']:,.0f} ({d['clients']}) | {d['p50']:.2f} / {d['p99']:.2f} "
            f"| {d['capabilities_per_answer']:.0f} | {d['largest_answer_bytes'] / 1024:.0f} "
            f"| {_other(busy)} | {_waits(busy, d)} |"
        )
    return lines


def _waits(pair: dict[str, Any], clients: dict[str, Any] | None) -> str:
    """Seconds per second each process spent runnable but waiting for a core (schedstat)."""
    waited = pair.get("waiting_for_a_core")
    if waited is None:  # results from before this column
        return ""
    shown = [f"{waited[k]:.3f}" for k in ("pair", "lobby", "worker")]
    shown.append(f"{clients['waiting_for_a_core']:.3f}" if clients else "")
    return " / ".join(shown)


def cluster_table(row: dict[str, Any]) -> list[str]:
    """One lobby node on NATS, then two on the same NATS, pairs on one node or across."""
    one = row["one_node"]
    lines = [
        "| nodes, pairs placed | msgs/s | vs one node | server CPU us/msg per node "
        "| server CPU us/msg, nodes together | vs one node | NATS CPU us/msg | other CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base_cpu = one["server_cpu_us_per_message"]
    for name, label in (
        ("one_node", "1 node"),
        ("same_node", "2 nodes, each pair on one node"),
        ("cross_node", "2 nodes, each pair across them"),
    ):
        r = row[name]
        cpus: list[float] = [r["server_cpu_us_per_message"], *r["other_cpu_us_per_message"]]
        nodes, nats = cpus[:-1], cpus[-1]
        together = sum(nodes)
        lines.append(
            f"| {label} | {_n(r['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], one['messages_per_s'])} "
            f"| {' / '.join(f'{c:.1f}' for c in nodes)} | {together:.1f} "
            f"| {ratio(together, base_cpu)} | {nats:.1f} | {_other(r)} |"
        )
    return lines


def cluster_latency_table(latency: dict[str, Any]) -> list[str]:
    """One pair's round trips through one node and across two (the run with the lowest p50)."""
    alone = latency["one_node"]["p50"]
    lines = [
        "| one pair, REQUEST->RESPONSE | msgs/s offered | p50 / p99 / p99.9 ms | p50 vs one node |",
        "|---|---|---|---|",
    ]
    for name, label in (("one_node", "1 node"), ("cross_node", "2 nodes, pair across them")):
        r = latency[name]
        lines.append(
            f"| {label} | {_n(r['offered_messages_per_s'])} | {_tail(r)} "
            f"| {r['p50'] - alone:+.2f} ms |"
        )
    return lines


def _tail(r: dict[str, Any]) -> str:
    return f"{r['p50']:.2f} / {r['p99']:.2f} / {r['p99.9']:.2f}"


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    """Each target (issues 8, 12, 17): what was measured, and whether it is met."""
    out: list[dict[str, str]] = []

    quick = " (quick run: sizes too small to judge)" if results.get("quick") else ""

    def add(target: str, measured: str, ok: bool) -> None:
        out.append({"target": target, "measured": measured, "status": status(ok) + quick})

    for pairs, row in results.get("throughput", {}).items():
        r, s, m = (row[k]["messages_per_s"] for k in ("relay", "lobby_sqlite", "lobby_memory"))
        add(
            f"throughput, sqlite store, {pairs} pairs >= {TARGET_THROUGHPUT}x relay",
            f"{s / r:.2f}x ({_n(s)} vs {_n(r)} msgs/s)",
            s >= TARGET_THROUGHPUT * r,
        )
        add(
            f"durable store costs <= {TARGET_STORE_COST:.0%} vs memory, {pairs} pairs",
            f"costs {1 - s / m:.0%} ({_n(s)} vs {_n(m)} msgs/s)",
            s >= (1 - TARGET_STORE_COST) * m,
        )
    schema = results.get("schema")
    if schema:
        r, s = schema["relay"]["messages_per_s"], schema["schema"]["messages_per_s"]
        add(
            f"throughput, REQUESTs checked against an input schema, {schema['pairs']} pairs "
            f">= {TARGET_THROUGHPUT}x relay",
            f"{s / r:.2f}x ({_n(s)} vs {_n(r)} msgs/s)",
            s >= TARGET_THROUGHPUT * r,
        )
    by_capability = results.get("addressed")
    if by_capability:  # issue 33
        d, a = (
            by_capability["direct"]["messages_per_s"],
            by_capability["addressed"]["messages_per_s"],
        )
        add(
            f"capability-addressed REQUESTs, {by_capability['pairs']} pairs, within 10% of direct",
            f"{a / d:.2f}x ({_n(a)} vs {_n(d)} msgs/s)",
            a >= 0.9 * d,
        )
    transport = results.get("transport")
    if transport:
        r, p = transport["relay"]["messages_per_s"], transport["lobby_picows"]["messages_per_s"]
        add(
            f"throughput, sqlite store on picows, {transport['pairs']} pairs "
            f">= {TARGET_PICOWS}x websockets relay",
            f"{p / r:.2f}x ({_n(p)} vs {_n(r)} msgs/s)",
            p >= TARGET_PICOWS * r,
        )
    for rate, row in results.get("latency", {}).items():
        if float(rate) == 5000:
            lo, rl = row["lobby"]["p99"], row["relay"]["p99"]
            add(
                f"latency p99 at 5k msgs/s <= {TARGET_P99_AT_5K}x relay",
                f"{lo / rl:.2f}x ({lo:.2f} vs {rl:.2f} ms)",
                lo <= TARGET_P99_AT_5K * rl,
            )
    c = results.get("connections")
    if c:
        lo = c["lobby"]
        add(
            f"<= {TARGET_KIB_PER_AGENT:g} KiB per idle registered agent",
            f"{lo['kib_per_agent']:.1f} KiB",
            lo["kib_per_agent"] <= TARGET_KIB_PER_AGENT,
        )
        add(f"{TARGET_AGENTS:,} agents connected at once", _n(lo["agents"]), lo["agents"] >= 10_000)
        add(
            f">= {TARGET_REGISTRATIONS_PER_S:,.0f} registrations/s",
            f"{_n(lo['registrations_per_s'])}/s",
            lo["registrations_per_s"] >= TARGET_REGISTRATIONS_PER_S,
        )
    for size, row in results.get("discovery", {}).items():
        if int(size) == 100_000:
            for kind in ("exact_name", "keyword", "lexical"):
                p50 = row[kind]["p50"]
                add(
                    f"discovery p50 < {TARGET_DISCOVERY_P50_MS:g} ms at 100,000 capabilities, "
                    + kind,
                    f"{p50:.2f} ms",
                    p50 < TARGET_DISCOVERY_P50_MS,
                )
    sdk = results.get("sdk")
    if sdk and "bare" in sdk:
        b, a = sdk["bare"]["load_cpu_us_per_call"], sdk["sdk"]["load_cpu_us_per_call"]
        add(
            f"SDK agents' CPU per call <= {TARGET_SDK_CPU}x a bare websockets + orjson client's",
            f"{a / b:.2f}x ({a:.0f} vs {b:.0f} us)",
            a <= TARGET_SDK_CPU * b,
        )
    cluster = results.get("cluster")
    if cluster:
        one = cluster["one_node"]["messages_per_s"]
        for name, label, target in (
            ("same_node", "2 nodes, each pair on one node", TARGET_CLUSTER_SAME),
            ("cross_node", "2 nodes, each pair across the nodes", TARGET_CLUSTER_CROSS),
        ):
            got = cluster[name]["messages_per_s"]
            add(
                f"cluster: {label} >= {target}x one node's messages/s, {cluster['pairs']} pairs",
                f"{got / one:.2f}x ({_n(got)} vs {_n(one)} msgs/s)",
                got >= target * one,
            )
        latency = cluster.get("latency")
        if latency:
            alone, across = latency["one_node"]["p50"], latency["cross_node"]["p50"]
            add(
                f"cluster: a pair across two nodes, p50 round trip <= one node's "
                f"+ {TARGET_CLUSTER_P50_EXTRA} ms",
                f"{across - alone:+.2f} ms ({across:.2f} vs {alone:.2f} ms)",
                across <= alone + TARGET_CLUSTER_P50_EXTRA,
            )
    pressure = results.get("discovery_pressure")
    for mix in PRESSURE_MIXES:
        if pressure and mix in pressure:
            alone, busy = pressure["alone"]["p99"], pressure[mix]["p99"]
            add(
                f"pair p99 beside heavy discovery ({mix}) at "
                f"{pressure['registry']['capabilities']:,} capabilities "
                f"<= {TARGET_PRESSURE_P99:g}x without",
                f"{busy / alone:.2f}x ({busy:.2f} vs {alone:.2f} ms)",
                busy <= TARGET_PRESSURE_P99 * alone,
            )
            control = pressure.get("elsewhere", {}).get(mix)
            if control:
                # Not a target: what the same discovery work costs the pair's tail when the
                # pair's lobby does none of it (the machine's share of the ratio above).
                c = control["p99"]
                out.append(
                    {
                        "target": f"(control) the same load on another lobby ({mix})",
                        "measured": f"{c / alone:.2f}x ({c:.2f} vs {alone:.2f} ms)",
                        "status": "for reference",
                    }
                )
    for phase in ("storm", "storm_cluster"):  # issue 34: each round against its targets
        for row in (results.get(phase) or {}).values():
            if not isinstance(row, dict) or "title" not in row:
                continue
            if "error" in row:
                add(f"reconnect storm, {row['title']}", f"failed: {row['error']}", False)
                continue
            resumed = row.get("all_resumed_s")
            goal = (
                f"reconnect storm, {row['title']}: all resumed <= {storm.TARGET_SECONDS:g} s, "
                f"0 lost, <= {storm.TARGET_REFUSALS} refusals per agent"
            )
            figure = (
                f"{'never' if resumed is None else f'{resumed:g} s'}, {row['lost']} lost, "
                f"at most {row['refused_max']} refusals"
            )
            if row["title"] == storm.DEFAULTS_ROUND:  # the case for --registration-burst
                out.append(
                    {
                        "target": goal,
                        "measured": figure,
                        "status": "for reference: the defaults, which a fleet behind one "
                        "address must not keep (docs/deploy.md)",
                    }
                )
                continue
            add(goal, figure, storm.met(row) if phase == "storm" else storm_cluster.met(row))
    if "scale" in results:  # issue 34
        for goal, figure, ok in scale.scale_targets(results["scale"]):
            add(goal, figure, ok)
    return out


def scale_table(s: dict[str, Any]) -> list[str]:
    """The `scale` phase: per transport, 1,000 idle agents held and N."""
    lines = [
        "| transport | agents held (processes, sources) | RSS per agent | registrations/s "
        "| CPU per registration: lobby / clients | DISCOVER exact name p50 / p99 (matches) "
        "| DISCOVER keyword p50 / p99 (matches) | pair p50 / p99 / p99.9 at "
        f"{scale.PAIR_RATE:,.0f} msgs/s | pair p99 vs {s['baseline']:,} held "
        "| other CPU during the pair (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for transport in scale.TRANSPORTS:
        base = s[transport][str(s["baseline"])]["pair"]["p99"]
        for row in s[transport].values():
            e, k, p = row["exact_name"], row["keyword"], row["pair"]
            lines.append(
                f"| {transport} | {_n(row['agents'])} ({row['processes']}, {row['sources']}) "
                f"| {row['kib_per_agent']:.1f} KiB | {_n(row['registrations_per_s'])} "
                f"| {row['server_cpu_us_per_registration']:.0f} / "
                f"{row.get('client_cpu_us_per_registration', 0):.0f} us "
                f"| {e['p50']:.2f} / {e['p99']:.2f} ms ({e['matches']:.0f}) "
                f"| {k['p50']:.2f} / {k['p99']:.2f} ms ({k['matches']:.0f}) "
                f"| {p['p50']:.2f} / {p['p99']:.2f} / {p['p99.9']:.2f} ms "
                f"| {ratio(p['p99'], base)} | {p['other_cpu_share']:.2f} |"
            )
    if s["cap"]:
        lines += ["", s["cap"]]
    return lines


def sdk_table(sdk: dict[str, Any]) -> list[str]:
    """Bare clients, SDK agents and lean raw clients (the load generator's, no ACKs)."""
    b, a, r = sdk["bare"], sdk["sdk"], sdk["raw_client"]
    lines = [
        "| clients | calls/s | vs bare | client CPU us/call | vs bare | server CPU us/msg |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in (("bare websockets + orjson", b), ("Agent subclasses", a)):
        lines.append(
            f"| {name} | {_n(run['calls_per_s'])} "
            f"| {ratio(run['calls_per_s'], b['calls_per_s'])} "
            f"| {run['load_cpu_us_per_call']:.1f} "
            f"| {ratio(run['load_cpu_us_per_call'], b['load_cpu_us_per_call'])} "
            f"| {run['server_cpu_us_per_message']:.1f} |"
        )
    calls = r["messages_per_s"] / 2
    lines.append(
        f"| lean raw clients (no ACKs) | {_n(calls)} | {ratio(calls, b['calls_per_s'])} "
        f"| {r.get('load_cpu_share', 0) * 1e6 / calls if calls else 0:.1f} "
        f"| | {r['server_cpu_us_per_message']:.1f} |"
    )
    return lines


def transport_table(t: dict[str, Any]) -> list[str]:
    lines = [
        "| server | msgs/s | vs its transport's relay | vs websockets relay "
        "| server CPU us/msg | other CPU |",
        "|---|---|---|---|---|---|",
    ]
    baseline = t["relay"]["messages_per_s"]
    for name, relay, label in (
        ("relay", "relay", "relay, websockets"),
        ("relay_picows", "relay_picows", "relay, picows"),
        ("lobby", "relay", "lobby (sqlite), websockets"),
        ("lobby_picows", "relay_picows", "lobby (sqlite), picows"),
    ):
        r = t[name]
        lines.append(
            f"| {label} | {_n(r['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], t[relay]['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], baseline)} "
            f"| {r['server_cpu_us_per_message']:.1f} | {_other(r)} |"
        )
    return lines


def schema_table(t: dict[str, Any]) -> list[str]:
    """The lobby routing REQUESTs to a capability without an input schema and to one with,
    next to the relay. Half the messages are REQUESTs (the other half RESPONSEs, never
    checked): a check costs a REQUEST twice the difference in CPU per message, taken between
    the medians of all runs (steadier than the best runs')."""
    lines = [
        "| REQUESTs to | msgs/s (best) | vs relay | vs no schema | server CPU us/msg (median) "
        "| schema check us/REQUEST | other CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    relay, plain = t["relay"], t["no_schema"]

    def cpu(name: str) -> float:
        runs = t.get("runs", {}).get(name) or [t[name]]
        return float(statistics.median(r["server_cpu_us_per_message"] for r in runs))

    for name, label in (
        ("relay", "relay (websockets), no parsing"),
        ("no_schema", "lobby (sqlite), capability without input schema"),
        ("schema", "lobby (sqlite), capability with input schema"),
    ):
        r = t[name]
        check = f"{2 * (cpu('schema') - cpu('no_schema')):.1f}" if name == "schema" else ""
        lines.append(
            f"| {label} | {_n(r['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], relay['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], plain['messages_per_s']) if name != 'relay' else ''} "
            f"| {cpu(name):.1f} | {check} | {_other(r)} |"
        )
    return lines


def metrics_table(t: dict[str, Any]) -> list[str]:
    """The lobby not scraped and scraped once a second during its run, next to the relay;
    CPU per message is the median of all runs (steadier than the best runs')."""
    lines = [
        "| lobby (sqlite) | msgs/s (best) | vs relay | vs not scraped | server CPU us/msg "
        "(median) | scrapes in the best run | other CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    relay, plain = t["relay"], t["unscraped"]

    def cpu(name: str) -> float:
        runs = t.get("runs", {}).get(name) or [t[name]]
        return float(statistics.median(r["server_cpu_us_per_message"] for r in runs))

    for name, label in (
        ("relay", "relay (websockets), no parsing"),
        ("unscraped", "not scraped"),
        ("scraped", "GET /metrics once a second"),
    ):
        r = t[name]
        lines.append(
            f"| {label} | {_n(r['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], relay['messages_per_s'])} "
            f"| {ratio(r['messages_per_s'], plain['messages_per_s']) if name != 'relay' else ''} "
            f"| {cpu(name):.1f} | {r.get('scrapes', '')} | {_other(r)} |"
        )
    return lines


def render(results: dict[str, Any]) -> str:
    plan = results["plan"]
    lines = [f"Machine: {describe(results['machine'])}", ""]
    if "throughput" in results:
        lines += [
            f"### Throughput: REQUEST+RESPONSE messages routed per second (best of "
            f"{plan['repeats']} x {plan['seconds']:g} s; {plan['window']} requests outstanding "
            "per pair)",
            "",
            *throughput_table(results["throughput"]),
            "",
        ]
    if "transport" in results:
        lines += [
            f"### Transports: websockets vs picows, {results['transport']['pairs']} pairs "
            f"(best of {plan['repeats']} x {plan['seconds']:g} s)",
            "",
            *transport_table(results["transport"]),
            "",
        ]
    if "schema" in results:
        lines += [
            f"### Input schemas: REQUESTs checked by the lobby, {results['schema']['pairs']} "
            f"pairs (best of {plan['repeats']} x {plan['seconds']:g} s)",
            "",
            *schema_table(results["schema"]),
            "",
        ]
    if "metrics" in results:
        lines += [
            f"### Metrics: the lobby scraped (GET /metrics) during the run or not, "
            f"{results['metrics']['pairs']} pairs (best of {plan['repeats']} x "
            f"{plan['seconds']:g} s)",
            "",
            *metrics_table(results["metrics"]),
            "",
        ]
    if "latency" in results:
        repeats = results["plan"]["repeats"]
        lines += [
            "### Latency: REQUEST->RESPONSE round trip, one pair, open loop "
            f"(of {repeats} interleaved runs each, the one with the lowest p99)",
            "",
        ]
        lines += [*latency_table(results["latency"]), ""]
    if "connections" in results:
        lines += ["### Idle registered agents", "", *connections_table(results["connections"]), ""]
    if "scale" in results:
        lines += ["### Idle agents held on one node", "", *scale_table(results["scale"]), ""]
    if "discovery" in results:
        lines += ["### Discovery: DISCOVER_SERVICES round trip", ""]
        lines += [*discovery_table(results["discovery"]), ""]
    if "discovery_pressure" in results:
        lines += [
            "### Discovery pressure: one pair's REQUEST->RESPONSE round trip, alone and while "
            "heavy DISCOVERs run from other connections, closed loop (of "
            f"{plan['repeats']} interleaved runs each, the one with the lowest p99)",
            "",
            *pressure_table(results["discovery_pressure"]),
            "",
        ]
    if "cluster" in results:
        lines += [
            "### Cluster: request/response pairs through lobby nodes on one NATS JetStream "
            f"({results['cluster']['pairs']} pairs; best of {plan['repeats']} interleaved runs)",
            "",
            *cluster_table(results["cluster"]),
            "",
        ]
        if "latency" in results["cluster"]:
            lines += [*cluster_latency_table(results["cluster"]["latency"]), ""]
    if "sdk" in results:
        lines += [
            "### SDK: request/response calls, 1 pair, same lobby (client CPU per call: both "
            "sides of the call, in one process)",
            "",
            *sdk_table(results["sdk"]),
            "",
        ]
    lines += ["### Targets", "", "| target | measured | status |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in results["targets"]]
    return "\n".join(lines)
