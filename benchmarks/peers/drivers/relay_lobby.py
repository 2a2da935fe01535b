"""The relay's and the lobby's driver (the main venv): the patterns over raw JSON frames through
`websockets` (compression off), agents registered as `benchmarks.load` does.

Run as `python -m benchmarks.peers.drivers.websocket --url URL --broker-pid PID ...`."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

from benchmarks.load import CAPABILITY, register, run
from benchmarks.peers.drivers.pattern import (
    Window,
    arguments,
    emit,
    request_payload,
    response_payload,
)


def frame(sender: str, receiver: str, kind: str, token: str, payload: Any, cid: str) -> bytes:
    return orjson.dumps(
        {
            "sender_id": sender,
            "receiver_id": receiver,
            "message_type": kind,
            "payload": payload,
            "conversation_id": cid,
            "auth_token": token,
        }
    )


async def pair(url: str, tag: str) -> tuple[ClientConnection, str, str, ClientConnection, str, str]:
    # The relay pairs connections by arrival order: the asker first, then its responder.
    asker, atoken = await register(url, f"{tag}a", [])
    echo, etoken = await register(url, f"{tag}e", [CAPABILITY])
    return asker, atoken, f"{tag}a", echo, etoken, f"{tag}e"


async def serve_echo(ws: ClientConnection, me: str, token: str) -> None:
    async for raw in ws:
        message = orjson.loads(raw)
        payload = response_payload(message["payload"].get("n"))
        cid = message["conversation_id"]
        await ws.send(frame(me, message["sender_id"], "RESPONSE", token, payload, cid), text=True)


async def ask(ws: ClientConnection, me: str, token: str, peer: str, n: int) -> list[float]:
    rtts = []
    for i in range(n):
        started = time.perf_counter()
        await ws.send(frame(me, peer, "REQUEST", token, request_payload(i), f"{me}-{i}"), text=True)
        await ws.recv()
        rtts.append(time.perf_counter() - started)
    return rtts


async def main() -> dict[str, Any]:
    args = arguments()
    tag = uuid.uuid4().hex[:6]
    pairs = [await pair(args.url, f"{tag}p{i}") for i in range(args.pairs)]
    echoes = [asyncio.create_task(serve_echo(e, eid, et)) for _, _, _, e, et, eid in pairs]
    await asyncio.gather(*(ask(a, aid, at, eid, 5) for a, at, aid, _, _, eid in pairs))  # warm-up
    window = Window(args.broker_pid)
    runs = await asyncio.gather(
        *(ask(a, aid, at, eid, args.round_trips) for a, at, aid, _, _, eid in pairs)
    )
    rtts = [rtt for run_ in runs for rtt in run_]
    request_response = window.close(2 * len(rtts), rtts)
    for task in echoes:
        task.cancel()

    sender, stoken, sid, receiver, _, rid = await pair(args.url, f"{tag}ow")
    window = Window(args.broker_pid)

    async def count() -> None:
        for _ in range(args.one_way):
            await receiver.recv()

    counting = asyncio.create_task(count())
    for i in range(args.one_way):
        await sender.send(
            frame(sid, rid, "REQUEST", stoken, request_payload(i), f"ow-{i}"), text=True
        )
    await counting
    one_way = window.close(args.one_way)
    for ws in [sender, receiver, *(p[0] for p in pairs), *(p[3] for p in pairs)]:
        await ws.close()
    return {"request_response": request_response, "one_way": one_way}


if __name__ == "__main__":
    emit(run(main()))
