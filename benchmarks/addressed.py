"""The `addressed` phase: a capability-addressed REQUEST (to `global_lobby`, the lobby chooses
the provider) against a direct one (to the provider by id), issue 33's target: within 10%.

Each pair is a requester and its responder, as in `load.throughput`; here the responder offers
a capability of its own (`echo-<pair>`), so the lobby's choice has one candidate per REQUEST and
what is measured is what addressing by capability costs the lobby (the parse, the candidate
walk, the bookkeeping that failover needs), not a different spread of the load.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks import harness, load
from benchmarks.suite import LOAD_SLACK, Plan, throughput_run


def addressed_request(sender: str, capability: str, token: str, n: int) -> bytes:
    return orjson.dumps(
        {
            "sender_id": sender,
            "receiver_id": "global_lobby",
            "message_type": "REQUEST",
            "payload": {
                "capability_name": capability,
                "arguments": {"n": n, "item": "Bose QuietComfort 45"},
            },
            "conversation_id": f"{sender}-{n}",
            "auth_token": token,
        }
    )


async def addressed_throughput(
    url: str, server_pid: int, pairs: int, seconds: float, window: int, warmup: float = 0.3
) -> dict[str, Any]:
    """`load.throughput` with every REQUEST addressed to the lobby by capability name."""
    tag = uuid.uuid4().hex[:6]
    routed = delivered = 0
    clients: list[load.LeanClient] = []

    def responder(lean: load.LeanClient, me: str, token: str) -> Callable[[bytes], None]:
        def on_message(raw: bytes) -> None:
            nonlocal routed, delivered
            routed += 1
            delivered += 1
            lean.send(load.response(me, token, orjson.loads(raw)))

        return on_message

    def requester(lean: load.LeanClient, me: str, token: str, name: str) -> Callable[[bytes], None]:
        counter = itertools.count()

        def on_message(raw: bytes) -> None:
            nonlocal routed
            routed += 1
            lean.send(addressed_request(me, name, token, next(counter)))

        for _ in range(window):
            lean.send(addressed_request(me, name, token, next(counter)))
        return on_message

    for i in range(pairs):
        name = f"echo-{tag}-{i}"
        capability = {**load.CAPABILITY, "name": name}
        echo, etoken = await load.lean_connect(url, f"{tag}resp{i}", [capability])
        asker, atoken = await load.lean_connect(url, f"{tag}req{i}", [])
        clients += [asker, echo]
        echo.on_message = responder(echo, f"{tag}resp{i}", etoken)
        asker.on_message = requester(asker, f"{tag}req{i}", atoken, name)
    for lean in clients:
        lean.flush()
    await asyncio.sleep(warmup)
    start, delivered_before = load.Snapshot(server_pid, routed), delivered
    await asyncio.sleep(seconds)
    end, delivered_after = load.Snapshot(server_pid, routed), delivered
    for lean in clients:
        lean.on_message = lambda raw: None
        if lean.transport is not None:
            lean.transport.abort()
    return {**end.since(start), "requests_delivered": delivered_after - delivered_before}


def addressed(plan: Plan) -> dict[str, Any]:
    """Direct REQUESTs and capability-addressed ones, `schema_pairs` pairs, each on its own
    sqlite lobby, next to the relay; all started at once and run in turn, `repeats` times
    round, the best run of each kept."""
    pairs, seconds, window = plan.schema_pairs, plan.seconds, plan.window
    runs: dict[str, list[dict[str, Any]]] = {"relay": [], "direct": [], "addressed": []}
    with (
        harness.relay() as relay,
        harness.lobby("sqlite") as direct,
        harness.lobby("sqlite") as by_capability,
    ):
        for _ in range(plan.repeats):
            runs["relay"].append(throughput_run(relay, pairs, seconds, window))
            runs["direct"].append(throughput_run(direct, pairs, seconds, window))
            harness.QUIET.wait()
            runs["addressed"].append(
                harness.one(
                    addressed_throughput, by_capability.url, by_capability.pid, pairs, seconds,
                    window, timeout=seconds + LOAD_SLACK,
                )
            )  # fmt: skip
    best = {k: max(v, key=lambda r: float(r["messages_per_s"])) for k, v in runs.items()}
    return {**best, "pairs": pairs, "runs": runs}


def table(t: dict[str, Any]) -> list[str]:
    """Direct and capability-addressed REQUESTs next to the relay; CPU per message is the
    median of all runs. Half the messages are REQUESTs: addressing costs a REQUEST twice the
    difference in CPU per message."""
    lines = [
        "| REQUESTs | msgs/s (best) | vs relay | vs direct | server CPU us/msg (median) "
        "| addressing us/REQUEST |",
        "|---|---|---|---|---|---|",
    ]

    def cpu(name: str) -> float:
        runs = t.get("runs", {}).get(name) or [t[name]]
        return float(statistics.median(r["server_cpu_us_per_message"] for r in runs))

    relay, direct = t["relay"]["messages_per_s"], t["direct"]["messages_per_s"]
    for name, label in (
        ("relay", "relay (websockets), no parsing"),
        ("direct", "lobby (sqlite), to the provider by id"),
        ("addressed", "lobby (sqlite), to global_lobby by capability"),
    ):
        rate = t[name]["messages_per_s"]
        cost = f"{2 * (cpu('addressed') - cpu('direct')):.1f}" if name == "addressed" else ""
        versus = f"{rate / direct:.2f}x" if name != "relay" else ""
        lines.append(
            f"| {label} | {rate:,.0f} | {rate / relay:.2f}x | {versus} | {cpu(name):.1f} | {cost} |"
        )
    return lines
