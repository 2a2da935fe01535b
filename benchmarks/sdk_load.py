"""Request/response calls between two SDK agents against the same calls between two bare
clients, through the same lobby: what the SDK costs its process per call.

`sdk_throughput`: an `Echo` agent serves one `@capability` with small pydantic input and output
models; a caller keeps `window` calls outstanding (one asyncio task per slot, each awaiting
`Agent.request()` in a loop). `bare_throughput`: two `websockets` + orjson clients doing what a
careful hand-written client would (registered with acks, each ACKing every `ACK_EVERY`
deliveries), the caller keeping `window` REQUESTs outstanding. Both measured like
`load.throughput` (warm-up, then a window timed inside this process, the server's CPU read from
/proc); `load_cpu_us_per_call` is this process's CPU (both sides of the call live in it) per
completed call."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect

from agent_sdk import Agent, RequestContext, capability
from benchmarks.load import Snapshot

ACK_EVERY = 32
"""Deliveries a bare client acknowledges at once."""
ITEM = "Bose QuietComfort 45"


class EchoIn(BaseModel):
    n: int
    item: str


class EchoOut(BaseModel):
    echo: int
    item: str


class Echo(Agent):
    @capability("echo", description="Returns n.")
    async def echo(self, request: EchoIn, ctx: RequestContext) -> EchoOut:
        return EchoOut(echo=request.n, item=request.item)


def per_call(window: dict[str, Any], calls: int) -> dict[str, Any]:
    """`window` (a `Snapshot.since`) with the calls and this process's CPU per call."""
    own = window["load_cpu_share"] * window["seconds"]
    return {
        **window,
        "calls": calls,
        "calls_per_s": calls / window["seconds"],
        "load_cpu_us_per_call": own * 1e6 / calls if calls else 0.0,
    }


async def _measured(
    tasks: list[asyncio.Task[None]],
    calls: Callable[[], int],
    server_pid: int,
    seconds: float,
    warmup: float,
) -> dict[str, Any]:
    """Let `tasks` run `warmup` seconds, measure the next `seconds` (calls done, this process's
    and the server's CPU), then cancel them."""
    await asyncio.sleep(warmup)
    start, before = Snapshot(server_pid, 2 * calls()), calls()
    await asyncio.sleep(seconds)
    end, after = Snapshot(server_pid, 2 * calls()), calls()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return per_call(end.since(start), after - before)


async def sdk_throughput(
    url: str, server_pid: int, seconds: float, window: int, warmup: float = 0.3
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    calls = 0
    options: dict[str, Any] = {"reconnect": False, "token_store": None}  # fresh ids: keep no files
    async with (
        Echo(f"{tag}echo", lobby_url=url, max_concurrency=window * 2, **options),
        Agent(f"{tag}caller", lobby_url=url, **options) as caller,
    ):

        async def worker() -> None:
            nonlocal calls
            while True:
                answer = await caller.request(
                    f"{tag}echo", "echo", {"n": calls, "item": ITEM}, output_type=EchoOut
                )
                assert answer.item == ITEM
                calls += 1

        tasks = [asyncio.create_task(worker()) for _ in range(window)]
        return await _measured(tasks, lambda: calls, server_pid, seconds, warmup)


class BareClient:
    """One `websockets` connection registered with acks, sending orjson frames and ACKing
    every `ACK_EVERY` deliveries (by their `seq`)."""

    def __init__(self, ws: ClientConnection, agent_id: str, token: str) -> None:
        self.ws = ws
        self.agent_id = agent_id
        self.token = token
        self.unacked = 0

    @classmethod
    async def register(cls, url: str, agent_id: str, capabilities: list[Any]) -> BareClient:
        ws = await connect(url, compression=None, max_size=None, open_timeout=60)
        payload = {"capabilities": capabilities, "acks": True}
        frame = {
            "sender_id": agent_id,
            "receiver_id": "global_lobby",
            "message_type": "REGISTER",
            "payload": payload,
        }
        await ws.send(orjson.dumps(frame), text=True)
        reply = orjson.loads(await ws.recv())
        return cls(ws, agent_id, reply["payload"]["auth_token"])

    async def delivered(self, message: dict[str, Any]) -> None:
        """Count a delivery; ACK when `ACK_EVERY` have come since the last ACK."""
        self.unacked += 1
        if self.unacked >= ACK_EVERY and message.get("seq") is not None:
            self.unacked = 0
            ack = {
                "sender_id": self.agent_id,
                "receiver_id": "global_lobby",
                "message_type": "ACK",
                "payload": {"up_to": message["seq"]},
                "auth_token": self.token,
            }
            await self.ws.send(orjson.dumps(ack), text=True)


async def bare_throughput(
    url: str, server_pid: int, seconds: float, window: int, warmup: float = 0.3
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    capability_ = {"name": "echo", "description": "Returns n.", "input_schema": {}}
    caller = await BareClient.register(url, f"{tag}caller", [])
    echo = await BareClient.register(url, f"{tag}echo", [capability_])
    calls = 0
    ids = itertools.count()

    async def request() -> None:
        n = next(ids)
        frame = {
            "sender_id": caller.agent_id,
            "receiver_id": echo.agent_id,
            "message_type": "REQUEST",
            "payload": {"capability_name": "echo", "n": n, "item": ITEM},
            "conversation_id": f"{tag}-{n}",
            "auth_token": caller.token,
        }
        await caller.ws.send(orjson.dumps(frame), text=True)

    async def serve() -> None:
        async for raw in echo.ws:
            message = orjson.loads(raw)
            await echo.delivered(message)
            if message["message_type"] != "REQUEST":
                continue
            payload = message["payload"]
            answer = {
                "sender_id": echo.agent_id,
                "receiver_id": message["sender_id"],
                "message_type": "RESPONSE",
                "payload": {"status": "success", "echo": payload["n"], "item": payload["item"]},
                "conversation_id": message["conversation_id"],
                "auth_token": echo.token,
            }
            await echo.ws.send(orjson.dumps(answer), text=True)

    async def call() -> None:
        nonlocal calls
        for _ in range(window):
            await request()
        async for raw in caller.ws:
            message = orjson.loads(raw)
            await caller.delivered(message)
            if message["message_type"] == "RESPONSE":
                calls += 1
                await request()

    tasks = [asyncio.create_task(serve()), asyncio.create_task(call())]
    result = await _measured(tasks, lambda: calls, server_pid, seconds, warmup)
    for client in (caller, echo):
        client.ws.transport.abort()
    return result
