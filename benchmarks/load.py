"""Load generators. Each runs in its own process (`multiprocessing`), on its own event loop, so
the server under test has a core of its own; they speak raw JSON, identically to the lobby and
to the relay, and return plain dicts of what they measured."""

from __future__ import annotations

import asyncio
import itertools
import resource
import time
import uuid
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

CAPABILITY = {"name": "echo", "description": "echo", "input_schema": {}, "output_schema": {}}


def run(coro: Any) -> Any:
    """Run a load coroutine on uvloop (as the lobby does), in this process."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def register(
    url: str, agent_id: str, capabilities: list[Any]
) -> tuple[ClientConnection, str]:
    ws = await connect(url, compression=None, max_size=None, open_timeout=60, close_timeout=1)
    frame = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {"capabilities": capabilities},
    }
    await ws.send(orjson.dumps(frame), text=True)
    reply = orjson.loads(await ws.recv())
    return ws, reply["payload"]["auth_token"]


async def _responder(ws: ClientConnection, agent_id: str, token: str) -> None:
    async for raw in ws:
        request = orjson.loads(raw)
        response = {
            "sender_id": agent_id,
            "receiver_id": request["sender_id"],
            "message_type": "RESPONSE",
            "payload": {"status": "success", "echo": request["payload"].get("n")},
            "conversation_id": request["conversation_id"],
            "auth_token": token,
        }
        await ws.send(orjson.dumps(response), text=True)


def _request(sender: str, receiver: str, token: str, n: int) -> bytes:
    return orjson.dumps(
        {
            "sender_id": sender,
            "receiver_id": receiver,
            "message_type": "REQUEST",
            "payload": {"capability_name": "echo", "n": n, "item": "Bose QuietComfort 45"},
            "conversation_id": f"{sender}-{n}",
            "auth_token": token,
        }
    )


async def _pairs(url: str, pairs: int, tag: str) -> list[tuple[Any, ...]]:
    made = []
    for i in range(pairs):
        requester, rtoken = await register(url, f"{tag}req{i}", [])
        responder, stoken = await register(url, f"{tag}resp{i}", [CAPABILITY])
        made.append((requester, rtoken, f"{tag}req{i}", responder, stoken, f"{tag}resp{i}"))
    return made


async def throughput(url: str, pairs: int, seconds: float, window: int) -> dict[str, Any]:
    """Each requester keeps `window` REQUESTs outstanding; counts REQUEST+RESPONSE routed."""
    tag = uuid.uuid4().hex[:6]
    made = await _pairs(url, pairs, tag)
    tasks = [asyncio.create_task(_responder(r, rid, tok)) for _, _, _, r, tok, rid in made]
    done = 0
    stop = time.monotonic() + seconds

    async def drive(ws: ClientConnection, token: str, me: str, peer: str) -> None:
        nonlocal done
        counter = itertools.count()
        for _ in range(window):
            await ws.send(_request(me, peer, token, next(counter)), text=True)
        async for _ in ws:
            done += 1
            if time.monotonic() >= stop:
                return
            await ws.send(_request(me, peer, token, next(counter)), text=True)

    started = time.monotonic()
    await asyncio.gather(*(drive(q, qt, qid, rid) for q, qt, qid, _, _, rid in made))
    elapsed = time.monotonic() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*(ws.close() for pair in made for ws in (pair[0], pair[3])))
    return {"round_trips": done, "seconds": elapsed, "messages_per_s": 2 * done / elapsed}


async def latency(url: str, rate: float, seconds: float) -> dict[str, Any]:
    """One pair, REQUESTs sent at `rate` a second (open loop); round-trip times in ms."""
    tag = uuid.uuid4().hex[:6]
    ((requester, token, me, responder, stoken, peer),) = await _pairs(url, 1, tag)
    responding = asyncio.create_task(_responder(responder, peer, stoken))
    sent: dict[int, float] = {}
    rtts: list[float] = []

    async def receive() -> None:
        async for raw in requester:
            n = orjson.loads(raw)["payload"]["echo"]
            rtts.append((time.perf_counter() - sent.pop(n)) * 1000)

    receiving = asyncio.create_task(receive())
    interval, start = 1.0 / rate, time.perf_counter()
    for n in itertools.count():
        due = start + n * interval
        if due - start >= seconds:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[n] = time.perf_counter()
        await requester.send(_request(me, peer, token, n), text=True)
    await asyncio.sleep(0.5)
    receiving.cancel()
    responding.cancel()
    await requester.close()
    await responder.close()
    rtts.sort()
    return {"samples": len(rtts), "lost": len(sent), **percentiles(rtts)}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0, "p99.9": 0.0}

    def pick(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {"p50": pick(0.5), "p99": pick(0.99), "p99.9": pick(0.999)}


async def idle_agents(url: str, count: int, tag: str, hold: float) -> dict[str, Any]:
    """Register `count` agents, keep them connected `hold` seconds (for the RSS reading)."""
    started = time.monotonic()
    sockets = []
    for start in range(0, count, 100):
        batch = await asyncio.gather(
            *(register(url, f"{tag}{i}", []) for i in range(start, min(count, start + 100)))
        )
        sockets += [ws for ws, _ in batch]
    elapsed = time.monotonic() - started
    await asyncio.sleep(hold)
    await asyncio.gather(*(ws.close() for ws in sockets))
    return {"registered": len(sockets), "seconds": elapsed}


async def discovery(url: str, capabilities: int, per_agent: int, queries: int) -> dict[str, Any]:
    """Register `capabilities` capabilities on agents of `per_agent` each, then time
    DISCOVER_SERVICES by exact name, by keyword and lexical search."""
    tag = uuid.uuid4().hex[:6]
    agents = []
    for a in range(0, capabilities, per_agent):
        caps = [
            {
                "name": f"skill_{(a + i) % 1000}",
                "description": f"does task number {a + i} well",
                "input_schema": {},
                "output_schema": {},
                "keywords": [f"kw{(a + i) % 500}"],
            }
            for i in range(min(per_agent, capabilities - a))
        ]
        ws, _ = await register(url, f"{tag}p{a}", caps)
        agents.append(ws)
    me, token = await register(url, f"{tag}asker", [])
    results: dict[str, Any] = {}
    for name, payload in (
        ("exact_name", {"capability_name": "skill_42"}),
        ("keyword", {"keywords": ["kw7"]}),
        ("lexical", {"query": "task number 4242", "algorithm": "lexical", "limit": 10}),
    ):
        times = []
        for _ in range(queries):
            frame = {
                "sender_id": f"{tag}asker",
                "receiver_id": "global_lobby",
                "message_type": "DISCOVER_SERVICES",
                "payload": payload,
                "auth_token": token,
            }
            t = time.perf_counter()
            await me.send(orjson.dumps(frame), text=True)
            await me.recv()
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        results[name] = percentiles(times)
    for ws in [*agents, me]:
        await ws.close()
    return results
