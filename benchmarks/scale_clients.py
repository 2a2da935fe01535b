"""The idle agents of the `scale` phase (`benchmarks.scale`), one client process's share:
`load.LeanClient`s (websockets' sans-I/O protocol, no task per connection, pings answered as
they come), each connected from this process's source address (127.0.0.x: one source address
reaches one listening port through about 28k ephemeral ports) and registered; every
`CAPABLE_EVERY`th agent offers one capability (`capability`), so DISCOVER_SERVICES has a
registry to search that grows with the agents.

The parent drives the process through a pipe: the process answers ("loaded", None) once
imported, registers its agents on ("go",) (`IN_FLIGHT` handshakes at a time) and answers
("ready", what it measured), then holds them until ("stop",), drops them (TCP abort) and
answers ("stopped", None)."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from multiprocessing.connection import Connection
from typing import Any

import orjson

from benchmarks.harness import raise_fd_limit
from benchmarks.load import IN_FLIGHT, LeanClient, run
from benchmarks.storm_clients import IP_BIND_ADDRESS_NO_PORT

CAPABLE_EVERY = 10
"""One agent in this many offers a capability."""
SKILLS = 100
"""Capability names in rotation: an exact-name DISCOVER matches agents/(CAPABLE_EVERY*SKILLS)."""
KEYWORDS = 50
OPEN_TIMEOUT = 60.0


def capability(n: int) -> dict[str, Any]:
    """The capability agent number `n` offers (when `n % CAPABLE_EVERY == 0`)."""
    k = n // CAPABLE_EVERY
    return {
        "name": f"skill_{k % SKILLS}",
        "description": f"does task number {k} well",
        "input_schema": {},
        "output_schema": {},
        "keywords": [f"kw{k % KEYWORDS}"],
    }


def register_frame(agent_id: str, n: int) -> bytes:
    capabilities = [capability(n)] if n % CAPABLE_EVERY == 0 else []
    return orjson.dumps(
        {
            "sender_id": agent_id,
            "receiver_id": "global_lobby",
            "message_type": "REGISTER",
            "payload": {"capabilities": capabilities},
        }
    )


async def connect(url: str, source: str, agent_id: str, n: int) -> LeanClient:
    """A registered `LeanClient` from `source` (its port chosen at connect(), as
    `storm_clients.Fleet.connect` does)."""
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((source, 0))
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
    except BaseException:
        sock.close()
        raise
    frame = register_frame(agent_id, n)
    _, lean = await loop.create_connection(lambda: LeanClient(url, frame), sock=sock)
    answer = orjson.loads(await asyncio.wait_for(lean.registered, OPEN_TIMEOUT))
    if answer["message_type"] != "REGISTER_ACK":
        assert lean.transport is not None
        lean.transport.abort()
        raise ConnectionError(f"REGISTER refused: {answer['payload']}")
    return lean


async def drive(url: str, source: str, tag: str, numbers: range, pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    pipe.send(("loaded", None))
    assert (await loop.run_in_executor(None, pipe.recv))[0] == "go"
    held: list[LeanClient] = []
    failures: list[str] = []
    in_flight = asyncio.Semaphore(IN_FLIGHT)

    async def one(n: int) -> None:
        async with in_flight:
            try:
                held.append(await connect(url, source, f"{tag}{n}", n))
            except (OSError, TimeoutError) as exc:
                failures.append(repr(exc)[:200])

    started, cpu = time.time(), time.process_time()
    try:
        await asyncio.gather(*(one(n) for n in numbers))
        finished, cpu = time.time(), time.process_time() - cpu
        pipe.send(
            (
                "ready",
                {
                    "registered": len(held),
                    "failed": len(failures),
                    "failures": failures[:3],
                    "started": started,
                    "finished": finished,
                    "cpu": cpu,
                },
            )
        )
        assert (await loop.run_in_executor(None, pipe.recv))[0] == "stop"
    finally:
        for lean in held:
            if lean.transport is not None:
                lean.transport.abort()
    await asyncio.sleep(0)
    pipe.send(("stopped", None))


def main(url: str, source: str, tag: str, numbers: range, pipe: Connection) -> None:
    """A client process (spawned), on uvloop as the other load processes. Its collector is
    tuned as the lobby's (`lobby serve`): every connection it opens lives until the end, and
    with the default young generation of 700 the collector walked them again and again (15%
    of the process's CPU while registering)."""
    raise_fd_limit()
    gc.freeze()
    gc.set_threshold(20_000, *gc.get_threshold()[1:])
    run(drive(url, source, tag, numbers, pipe))
