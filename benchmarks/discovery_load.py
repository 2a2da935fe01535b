"""Load for the discovery-pressure phase: a registry of many capabilities, heavy
DISCOVER_SERVICES in a closed loop, and (from `load.latency`) one REQUEST/RESPONSE pair beside
them. The lobby is one event loop: what a DISCOVER costs, every other agent waits.

Heavy discovery is what a careless or hostile agent sends, back to back from several
connections: `lookups`, everything (`{}`) and a keyword every capability has, at the largest
`limit`, paging on with each answer's `next` (the DISCOVERs that used to return the whole
registry); `searches`, lexical and simple ranked searches for words every capability has, at
the largest page, paging on to the deepest rank.

The DISCOVER clients stand for agents on other machines, but here they share the lobby's two
cores: their process runs at nice `CLIENTS_NICE`, so that when the cores are contended the
lobby and the pair measured beside them come first, as they would if the clients were remote.
Their CPU is still counted in the pair's `other CPU`, and their rate is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import uuid
from typing import Any

import orjson

from benchmarks.harness import waited_seconds
from benchmarks.load import close_all, latency, percentiles, register
from protocol.payloads import MAX_DISCOVER_LIMIT

CLIENTS_NICE = 10
"""Nice value of the process of the heavy DISCOVER clients (`pressure`)."""

MIXES: dict[str, tuple[dict[str, Any], ...]] = {
    "lookups": (
        {"limit": MAX_DISCOVER_LIMIT},
        {"keywords": ["everywhere"], "limit": MAX_DISCOVER_LIMIT},
    ),
    "searches": (
        {"query": "task number", "algorithm": "lexical", "limit": MAX_DISCOVER_LIMIT},
        {"query": "task", "algorithm": "simple", "limit": MAX_DISCOVER_LIMIT},
    ),
}
"""The heavy DISCOVERs, each client sending its mix's in rotation, each paging on."""


async def populate(url: str, capabilities: int, per_agent: int) -> dict[str, Any]:
    """Register `capabilities` capabilities, `per_agent` per agent, then disconnect (the agents
    stay registered, offline). Every one has the keyword "everywhere" and the words "task"
    and "number" in its description."""
    tag = uuid.uuid4().hex[:6]
    started = time.perf_counter()
    # One DISCOVER first, as a lobby in service has had: it starts the discovery worker, which
    # then loads the registry as it grows instead of all at once when the pressure starts.
    probe, token = await register(url, f"{tag}probe", [])
    query = {
        "sender_id": f"{tag}probe",
        "receiver_id": "global_lobby",
        "message_type": "DISCOVER_SERVICES",
        "payload": {},
        "auth_token": token,
    }
    await probe.send(orjson.dumps(query), text=True)
    await probe.recv()
    agents = [probe]
    for a in range(0, capabilities, per_agent):
        caps = [
            {
                "name": f"skill_{(a + i) % 1000}",
                "description": f"does task number {a + i} well",
                "keywords": [f"kw{(a + i) % 500}", "everywhere"],
                "attributes": {"price": (a + i) % 997},
            }
            for i in range(min(per_agent, capabilities - a))
        ]
        ws, _ = await register(url, f"{tag}p{a}", caps)
        agents.append(ws)
    seconds = time.perf_counter() - started
    await close_all(agents)
    return {"capabilities": capabilities, "agents": len(agents) - 1, "seconds": round(seconds, 2)}


async def pressure(url: str, mix: str, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` connections, each sending the next DISCOVER of `MIXES[mix]` as soon as the
    last is answered, for `seconds`; round trips in ms, answers and bytes received. Lowers
    this process to nice `CLIENTS_NICE` (run it in its own process)."""
    with contextlib.suppress(OSError):
        os.nice(CLIENTS_NICE - os.nice(0))
    kinds = MIXES[mix]
    tag = uuid.uuid4().hex[:6]
    times: list[float] = []
    received = dict.fromkeys(
        ("answers", "bytes", "largest", "capabilities", "errors", "rate_limited"), 0
    )

    async def one(n: int) -> None:
        agent_id = f"{tag}d{n}"
        ws, token = await register(url, agent_id, [])
        cursors: dict[int, str | None] = {}
        deadline = time.perf_counter() + seconds
        try:
            for kind in itertools.cycle(range(n, n + len(kinds))):
                kind %= len(kinds)
                if time.perf_counter() >= deadline:
                    return
                payload = dict(kinds[kind])
                if cursors.get(kind):
                    payload["cursor"] = cursors[kind]
                frame = {
                    "sender_id": agent_id,
                    "receiver_id": "global_lobby",
                    "message_type": "DISCOVER_SERVICES",
                    "payload": payload,
                    "auth_token": token,
                }
                sent = time.perf_counter()
                await ws.send(orjson.dumps(frame), text=True)
                raw = await ws.recv()
                times.append((time.perf_counter() - sent) * 1000)
                answer = orjson.loads(raw)["payload"]
                received["answers"] += 1
                received["bytes"] += len(raw)
                received["largest"] = max(received["largest"], len(raw))
                if "services_found" not in answer:
                    # The lobby's discovery rate limit answers most of a flood: counted apart
                    # from real errors (a malformed query would be a bug of this load).
                    refused = answer.get("code") == "rate_limited"
                    received["rate_limited" if refused else "errors"] += 1
                    continue
                received["capabilities"] += sum(
                    len(s["relevant_capabilities"]) for s in answer["services_found"]
                )
                cursors[kind] = answer.get("next")
        finally:
            await close_all([ws])

    started, waited = time.perf_counter(), waited_seconds()
    await asyncio.gather(*(one(n) for n in range(clients)))
    elapsed = time.perf_counter() - started
    waited = waited_seconds() - waited
    times.sort()
    return {
        "mix": mix,
        "clients": clients,
        "clients_nice": os.nice(0),
        "answers_per_s": received["answers"] / elapsed,
        "mb_per_s": received["bytes"] / elapsed / 1e6,
        "capabilities_per_answer": received["capabilities"] / max(received["answers"], 1),
        "largest_answer_bytes": received["largest"],
        "errors": received["errors"],
        "rate_limited_per_s": received["rate_limited"] / elapsed,
        "waiting_for_a_core": round(waited / elapsed, 3),
        **percentiles(times),
    }


async def either(role: str, *args: Any) -> dict[str, Any]:
    """`latency(*args)` or `pressure(*args)`: one target, so both run at once as processes."""
    if role == "latency":
        return await latency(*args)
    return await pressure(*args)
