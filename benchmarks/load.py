"""Load generators, speaking raw JSON over `websockets` (compression off), the same frames to the
lobby and to the relay. Each runs in its own process, on its own uvloop event loop, and returns
a plain dict of what it measured.

Measurement windows are timed inside the generator: after a warm-up it reads the server's CPU
time from `/proc/<server_pid>/stat` and its counters, runs for the stated seconds, and reads
them again, so connecting, registering and closing are not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from benchmarks.harness import (
    cpu_seconds,
    machine_busy_seconds,
    raise_fd_limit,
    waited_seconds,
)

CAPABILITY = {"name": "echo", "description": "echo", "input_schema": {}, "output_schema": {}}


class EchoInput(BaseModel):
    """The arguments of the REQUESTs below, typed as an SDK agent would declare them."""

    model_config = ConfigDict(extra="forbid")
    n: int = Field(ge=0)
    item: str = Field(min_length=1, max_length=200)
    max_price: float | None = None
    express: bool = False


SCHEMA_CAPABILITY = {**CAPABILITY, "input_schema": EchoInput.model_json_schema()}
"""The same capability with an input schema the lobby checks on every REQUEST."""
WARMUP_ROUND_TRIPS = 20
IN_FLIGHT = 100
"""Handshakes a load process keeps under way while registering idle agents."""
Pair = tuple[ClientConnection, str, str, ClientConnection, str, str]
"""(requester, its token, its id, responder, its token, its id)"""


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a load coroutine on uvloop (as the lobby does) in this process."""
    raise_fd_limit()
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


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


def request(sender: str, receiver: str, token: str, n: int) -> bytes:
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


def response(sender: str, token: str, request: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "sender_id": sender,
            "receiver_id": request["sender_id"],
            "message_type": "RESPONSE",
            "payload": {"status": "success", "echo": request["payload"].get("n")},
            "conversation_id": request["conversation_id"],
            "auth_token": token,
        }
    )


async def make_pairs(
    url: str, pairs: int, tag: str, responder_url: str | None = None
) -> list[Pair]:
    """`pairs` requesters on `url`, each with its responder (on `responder_url` if given)."""
    made = []
    for i in range(pairs):
        requester, rtoken = await register(url, f"{tag}req{i}", [])
        responder, stoken = await register(responder_url or url, f"{tag}resp{i}", [CAPABILITY])
        made.append((requester, rtoken, f"{tag}req{i}", responder, stoken, f"{tag}resp{i}"))
    return made


async def close_all(sockets: list[ClientConnection]) -> None:
    """Drop the connections at once (TCP abort, as a crashed agent's would go). A closing
    handshake would wait out its timeout on every connection whose reading is paused by
    unread frames, and how fast servers close is not what is measured here."""
    for ws in sockets:
        ws.transport.abort()
    await asyncio.gather(*(ws.wait_closed() for ws in sockets), return_exceptions=True)


class LeanClient(asyncio.Protocol):
    """A load-generating connection with as little client-side cost as a Python client can
    have: websockets' sans-I/O protocol (masking in C), no receive queue, no task per
    connection; each text frame goes to `on_message` as it is parsed, and what it sent in
    reply is written once per read. So the server, not the load generator, is what a run
    measures for as long as it can."""

    def __init__(self, url: str, register: bytes) -> None:
        self.client = ClientProtocol(parse_uri(url))
        self.register = register
        self.registered: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.on_message: Callable[[bytes], None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client.send_request(self.client.connect())
        frame = Frame(Opcode.TEXT, self.register).serialize(mask=True, extensions=[])
        transport.write(b"".join(self.client.data_to_send()) + frame)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        client = self.client
        client.receive_data(data)
        for event in client.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                if self.on_message is not None:
                    self.on_message(bytes(event.data))
                elif not self.registered.done():
                    self.registered.set_result(bytes(event.data))
        self.flush()

    def send(self, frame: bytes) -> None:
        self.client.send_text(frame)

    def flush(self) -> None:
        data = self.client.data_to_send()
        if data and self.transport is not None:
            self.transport.write(b"".join(data))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.registered.done():
            self.registered.set_exception(ConnectionError("closed before REGISTER_ACK"))


async def lean_connect(url: str, agent_id: str, capabilities: list[Any]) -> tuple[LeanClient, str]:
    """A registered `LeanClient` and its token."""
    register = orjson.dumps(
        {
            "sender_id": agent_id,
            "receiver_id": "global_lobby",
            "message_type": "REGISTER",
            "payload": {"capabilities": capabilities},
        }
    )
    uri = parse_uri(url)
    _, lean = await asyncio.get_running_loop().create_connection(
        lambda: LeanClient(url, register), uri.host, uri.port
    )
    ack = orjson.loads(await asyncio.wait_for(lean.registered, 60))
    return lean, ack["payload"]["auth_token"]


async def throughput(
    url: str,
    server_pid: int,
    pairs: int,
    seconds: float,
    window: int,
    warmup: float = 0.3,
    *,
    capability: dict[str, Any] = CAPABILITY,
    placement: Sequence[tuple[str, str]] = (),
    other_pids: Sequence[int] = (),
) -> dict[str, Any]:
    """Each requester keeps `window` REQUESTs outstanding (`LeanClient`s). Messages routed =
    REQUESTs received by responders + RESPONSEs received by requesters inside the measured
    window. `placement`: per pair, the (requester's, responder's) lobby URL (default `url`
    for both), for several lobby nodes; `other_pids`: more processes whose CPU per message is
    reported (`other_cpu_us_per_message`, in order: the other nodes, NATS)."""
    tag = uuid.uuid4().hex[:6]
    routed = delivered = 0
    clients: list[LeanClient] = []

    def responder(lean: LeanClient, me: str, token: str) -> Callable[[bytes], None]:
        def on_message(raw: bytes) -> None:
            nonlocal routed, delivered
            routed += 1
            delivered += 1
            lean.send(response(me, token, orjson.loads(raw)))

        return on_message

    def requester(lean: LeanClient, me: str, token: str, peer: str) -> Callable[[bytes], None]:
        counter = itertools.count()

        def on_message(raw: bytes) -> None:
            nonlocal routed
            routed += 1
            lean.send(request(me, peer, token, next(counter)))

        for _ in range(window):
            lean.send(request(me, peer, token, next(counter)))
        return on_message

    urls = list(placement) or [(url, url)] * pairs
    for i in range(pairs):
        asking_at, echoing_at = urls[i % len(urls)]
        echo, etoken = await lean_connect(echoing_at, f"{tag}resp{i}", [capability])
        asker, atoken = await lean_connect(asking_at, f"{tag}req{i}", [])
        clients += [asker, echo]
        echo.on_message = responder(echo, f"{tag}resp{i}", etoken)
        asker.on_message = requester(asker, f"{tag}req{i}", atoken, f"{tag}resp{i}")
    if any(a != e for a, e in urls):
        await asyncio.sleep(0.5)  # each node learns the other's agents (the shared registry)
    for lean in clients:
        lean.flush()
    await asyncio.sleep(warmup)
    start, delivered_before = Snapshot(server_pid, routed), delivered
    others = [cpu_seconds(pid) for pid in other_pids]
    await asyncio.sleep(seconds)
    end, delivered_after = Snapshot(server_pid, routed), delivered
    others = [cpu_seconds(pid) - before for pid, before in zip(other_pids, others, strict=True)]
    for lean in clients:
        lean.on_message = lambda raw: None
        if lean.transport is not None:
            lean.transport.abort()
    # REQUESTs that reached a responder: half the messages unless the lobby refused some.
    measured = end.since(start)
    messages = max(measured["messages"], 1)
    return {
        **measured,
        "requests_delivered": delivered_after - delivered_before,
        "other_cpu_us_per_message": [round(cpu * 1e6 / messages, 2) for cpu in others],
    }


async def placed_throughput(
    placement: list[tuple[str, str]],
    pids: list[int],
    pairs: int,
    seconds: float,
    window: int,
) -> dict[str, Any]:
    """`throughput` over lobby nodes: per pair the (requester's, responder's) URL, round
    robin; `pids[0]` is the first node's (its CPU is `server_cpu_us_per_message`), the rest
    are reported in `other_cpu_us_per_message`."""
    return await throughput(
        placement[0][0], pids[0], pairs, seconds, window, placement=placement, other_pids=pids[1:]
    )


async def schema_throughput(
    url: str, server_pid: int, pairs: int, seconds: float, window: int, warmup: float = 0.3
) -> dict[str, Any]:
    """`throughput` with REQUESTs to a capability whose input schema the lobby checks."""
    return await throughput(
        url, server_pid, pairs, seconds, window, warmup, capability=SCHEMA_CAPABILITY
    )


class Snapshot:
    """The edge of a measured window: a message count, the server's CPU time, this process's
    CPU time and the whole machine's, and the time."""

    def __init__(self, server_pid: int, messages: int) -> None:
        self.messages = messages
        self.wall = time.perf_counter()
        self.server = cpu_seconds(server_pid)
        self.own = time.process_time()
        self.machine = machine_busy_seconds()

    def since(self, start: Snapshot) -> dict[str, Any]:
        wall = self.wall - start.wall
        messages = self.messages - start.messages
        server = self.server - start.server
        own = self.own - start.own
        return {
            "messages": messages,
            "seconds": round(wall, 3),
            "messages_per_s": messages / wall,
            "server_cpu_us_per_message": server * 1e6 / messages if messages else 0.0,
            "server_cpu_share": round(server / wall, 3),
            "load_cpu_share": round(own / wall, 3),
            # Cores' worth of CPU used by anything else meanwhile (another test run, say).
            "other_cpu_share": round(
                max(0.0, self.machine - start.machine - server - own) / wall, 3
            ),
        }


async def latency(
    url: str, server_pid: int, rate: float, seconds: float, responder_url: str | None = None
) -> dict[str, Any]:
    """One pair; REQUESTs sent on a fixed schedule (open loop) so that REQUEST+RESPONSE make
    `rate` messages a second; round-trip times in ms, the first 20 (warm-up) not counted.
    With `responder_url` (another lobby node) the responder is connected there."""
    tag = uuid.uuid4().hex[:6]
    ((requester, token, me, responder, stoken, peer),) = await make_pairs(
        url, 1, tag, responder_url
    )
    if responder_url not in (None, url):
        await asyncio.sleep(0.5)  # each node learns the other's agents (the shared registry)

    async def respond() -> None:
        async for raw in responder:
            await responder.send(response(peer, stoken, orjson.loads(raw)), text=True)

    sent: dict[int, float] = {}
    rtts: list[float] = []
    finished = False
    all_back = asyncio.Event()

    async def receive() -> None:
        async for raw in requester:
            n = orjson.loads(raw)["payload"]["echo"]
            if n >= WARMUP_ROUND_TRIPS:
                rtts.append((time.perf_counter() - sent.pop(n)) * 1000)
            if finished and not sent:
                all_back.set()

    tasks = [asyncio.create_task(respond()), asyncio.create_task(receive())]
    interval = 2.0 / rate
    start = time.perf_counter()
    first = Snapshot(server_pid, 0)
    waited = waits(server_pid)
    total = WARMUP_ROUND_TRIPS + int(seconds / interval)
    for n in range(total):
        delay = start + n * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if n >= WARMUP_ROUND_TRIPS:
            sent[n] = time.perf_counter()
        await requester.send(request(me, peer, token, n), text=True)
    elapsed = time.perf_counter() - start
    window = Snapshot(server_pid, 2 * total).since(first)
    waited = {k: (v - waited.get(k, 0.0)) / elapsed for k, v in waits(server_pid).items()}
    finished = True
    if not sent:
        all_back.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2):
            await all_back.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close_all([requester, responder])
    rtts.sort()
    return {
        "samples": len(rtts),
        "lost": len(sent),
        "offered_messages_per_s": rate,
        "achieved_messages_per_s": 2 * total / elapsed,
        "server_cpu_share": window["server_cpu_share"],
        "other_cpu_share": window["other_cpu_share"],
        "waiting_for_a_core": {k: round(v, 3) for k, v in waited.items()},
        **percentiles(rtts),
    }


def waits(server_pid: int) -> dict[str, float]:
    """Seconds spent waiting for a core so far by this process (the pair), the server and the
    server's children (the discovery worker), each summed over its threads."""
    children: list[str] = []
    for tid in os.listdir(f"/proc/{server_pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{server_pid}/task/{tid}/children") as f:
            children += f.read().split()
    return {
        "pair": waited_seconds(),
        "lobby": waited_seconds(server_pid),
        "worker": sum(waited_seconds(c) for c in children if os.path.isdir(f"/proc/{c}")),
    }


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p99/p99.9 (nearest rank) of sorted `values`."""
    if not values:
        return {"p50": 0.0, "p99": 0.0, "p99.9": 0.0}

    def pick(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {"p50": pick(0.5), "p99": pick(0.99), "p99.9": pick(0.999)}


async def idle_agents(
    url: str, server_pid: int, count: int, tag: str, hold: float
) -> dict[str, Any]:
    """Register `count` agents (`IN_FLIGHT` handshakes at a time, `LeanClient`s), keep them all
    connected `hold` seconds (while the parent reads the server's RSS), then drop them."""
    started, cpu0, own0, busy0 = (
        time.time(), cpu_seconds(server_pid), time.process_time(), machine_busy_seconds()
    )  # fmt: skip
    sockets: list[LeanClient] = []
    in_flight = asyncio.Semaphore(IN_FLIGHT)

    async def one(agent_id: str) -> None:
        async with in_flight:
            lean, _ = await lean_connect(url, agent_id, [])
            sockets.append(lean)

    try:
        await asyncio.gather(*(one(f"{tag}{i}") for i in range(count)))
        finished, cpu1, own1, busy1 = (
            time.time(), cpu_seconds(server_pid), time.process_time(), machine_busy_seconds()
        )  # fmt: skip
        await asyncio.sleep(hold)
    finally:
        for lean in sockets:
            if lean.transport is not None:
                lean.transport.abort()
    return {
        "registered": len(sockets),
        "started": started,
        "finished": finished,
        "server_cpu_start": cpu0,
        "server_cpu_end": cpu1,
        "own_cpu": own1 - own0,
        "machine_busy_start": busy0,
        "machine_busy_end": busy1,
    }


async def discovery(url: str, capabilities: int, per_agent: int, queries: int) -> dict[str, Any]:
    """Register `capabilities` capabilities, `per_agent` on each agent (1,000 names and 500
    keywords in rotation, so an exact name matches capabilities/1,000 of them), then time
    DISCOVER_SERVICES round trips by exact name, by keyword and by lexical (BM25) search."""
    tag = uuid.uuid4().hex[:6]
    agents = []
    started = time.perf_counter()
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
    registering = time.perf_counter() - started
    me, token = await register(url, f"{tag}asker", [])
    results: dict[str, Any] = {"agents": len(agents), "register_seconds": round(registering, 2)}
    for name, payload in (
        ("exact_name", {"capability_name": "skill_42"}),
        ("keyword", {"keywords": ["kw7"]}),
        ("lexical", {"query": "task number 4242", "algorithm": "lexical", "limit": 10}),
    ):
        frame = orjson.dumps(
            {
                "sender_id": f"{tag}asker",
                "receiver_id": "global_lobby",
                "message_type": "DISCOVER_SERVICES",
                "payload": payload,
                "auth_token": token,
            }
        )
        times = []
        matches = 0
        for _ in range(queries):
            t = time.perf_counter()
            await me.send(frame, text=True)
            reply = await me.recv()
            times.append((time.perf_counter() - t) * 1000)
            found = orjson.loads(reply)["payload"]["services_found"]
            matches = sum(len(s["relevant_capabilities"]) for s in found)
        times.sort()
        results[name] = {"matches": matches, **percentiles(times)}
    await close_all([*agents, me])
    return results
