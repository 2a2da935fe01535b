"""The agents of the `storm` phase (`benchmarks.storm`), one client process's share: raw
websockets and orjson (not the SDK's `Agent`, which cannot bind a source address), each agent
registered with acks from this process's source address (127.0.0.x: one source address reaches
one port through about 28k ephemeral ports). Each reconnects as the SDK's `registered_links`
does: at once, to the address that last worked, when its connection is lost; after each failed
attempt (no connection, dropped or refused during REGISTER) to the next of the lobby's
addresses (one, or a cluster's nodes: `benchmarks.storm_cluster`), waiting the next delay of
the SDK's own backoff (`agent_sdk.connection.reconnect_delays`, imported, not copied),
resuming with its token.

The parent drives the process through a pipe: the process answers ("ready", registered) once
every agent is registered (the `held` ones registered and then offline), then on ("storm",)
answers ("storming", None), on ("back",) (the lobby has exited) lets the held agents come
back too, and answers ("done", what happened) once every agent due back has resumed (all
of them, or those `returning`) and every held message has arrived, or at ("stop",)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

import orjson
import websockets.asyncio.client
import websockets.exceptions
from websockets.asyncio.client import ClientConnection

from agent_sdk.connection import reconnect_delays
from benchmarks.harness import raise_fd_limit

MAX_DELAY = 10.0
"""The SDK's default `reconnect_max_delay`."""
OPEN_TIMEOUT = 10.0
"""The SDK's default `open_timeout` (the handshake, and the wait for REGISTER's answer)."""
IN_FLIGHT = 100
"""Handshakes under way at once in the first registration (as `load.IN_FLIGHT`)."""
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
_LOST = (OSError, TimeoutError, websockets.exceptions.WebSocketException)


def register_frame(agent_id: str, token: str | None) -> str:
    body: dict[str, Any] = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {"acks": True},
    }
    if token:
        body["auth_token"] = token
    return orjson.dumps(body).decode()


class Fleet:
    """This process's agents and what happened to them since the storm began."""

    def __init__(self, urls: list[str], source: str, ids: list[str], held: set[str]) -> None:
        self.urls, self.source, self.ids, self.held = urls, source, ids, held
        """`urls`: the lobby's addresses, tried in turn from the first."""
        self.first = asyncio.Semaphore(IN_FLIGHT)
        """Bounds the handshakes of the first registration (the fill, not the storm)."""
        self.tokens: dict[str, str] = {}
        self.storm = asyncio.Event()
        """Set before the lobby is stopped: from then on, what happens is counted."""
        self.back = asyncio.Event()
        """Set once the lobby has exited: the held agents come back from then on."""
        self.registered = 0
        self.offline = 0
        self.resumed: dict[str, float] = {}
        """agent id -> when (time.time()) it was registered again after the storm began."""
        self.resumed_on: Counter[str] = Counter()
        """url -> resumes there after the storm began."""
        self.reregistered: list[str] = []
        """Agents whose resume was answered as a new registration (the lobby lost them)."""
        self.refusals: Counter[str] = Counter()
        self.try_again: set[str] = set()
        """Agents whose last attempt a live node closed with 1013: tried there again."""
        """agent id -> REGISTERs refused (an ERROR) or dropped unanswered, after the storm."""
        self.codes: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()
        self.unreachable = 0
        """Connection attempts that failed (the lobby not yet listening), after the storm."""
        self.deliveries: list[tuple[str, float]] = []
        """(message_id, when ACKed) of every TEXT received."""
        self.changed = asyncio.Event()

    async def session(self, agent_id: str, url: str) -> ClientConnection | None:
        """A registered connection to `url`, or None (counted) after a failed attempt."""
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                sock = await self.connect(url)
            ws = await websockets.asyncio.client.connect(
                url,
                compression=None,
                max_size=None,
                open_timeout=OPEN_TIMEOUT,
                ping_interval=None,
                sock=sock,
            )
        except _LOST:
            self.unreachable += self.storm.is_set()
            return None
        try:
            await ws.send(register_frame(agent_id, self.tokens.get(agent_id)))
            async with asyncio.timeout(OPEN_TIMEOUT):
                answer = orjson.loads(await ws.recv())
        except _LOST:
            # 1013: a cluster node holds the resume until a dead home's failover is done.
            if ws.close_code == 1013:
                self.try_again.add(agent_id)
            await self._refused(ws, agent_id, "1013" if ws.close_code == 1013 else "dropped")
            return None
        if answer["message_type"] != "REGISTER_ACK":
            await self._refused(ws, agent_id, str(answer["payload"].get("code", "?")))
            return None
        payload = answer["payload"]
        if agent_id in self.tokens and self.storm.is_set():
            self.resumed[agent_id] = time.time()
            self.resumed_on[url] += 1
            if payload.get("status") != "success_resumed":
                self.reregistered.append(agent_id)
            self.changed.set()
        self.tokens[agent_id] = payload["auth_token"]
        return ws

    async def connect(self, url: str) -> socket.socket:
        """A TCP connection from `source`, its port chosen at connect() (IP_BIND_ADDRESS_NO_PORT:
        bind() alone would reserve a port for every destination, and search for it)."""
        host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((self.source, 0))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        except BaseException:
            sock.close()
            raise
        return sock

    async def _refused(self, ws: ClientConnection, agent_id: str, code: str) -> None:
        if self.storm.is_set():
            self.refusals[agent_id] += 1
            self.codes[code] += 1
        with contextlib.suppress(*_LOST):
            await ws.close()

    async def run(self, agent_id: str) -> None:
        """Register; then (a held agent: offline until `back`) serve and reconnect: at once
        when a connection is lost, to the next address after the backoff's next delay when an
        attempt fails (the same one when a live node closed it with 1013)."""
        waits = reconnect_delays(MAX_DELAY)()
        at = 0
        async with self.first:
            ws = await self.session(agent_id, self.urls[at])
        while True:
            if ws is None:
                if agent_id in self.try_again:  # as the SDK's `registered_links` does
                    self.try_again.discard(agent_id)
                else:
                    at = (at + 1) % len(self.urls)
                await asyncio.sleep(next(waits))
                ws = await self.session(agent_id, self.urls[at])
                continue
            waits = reconnect_delays(MAX_DELAY)()
            if not self.storm.is_set():
                self.registered += 1
                if agent_id in self.held:
                    await ws.close()
                    self.offline += 1
                    self.changed.set()
                    await self.back.wait()
                    ws = await self.session(agent_id, self.urls[at])
                    continue
                self.changed.set()
            with contextlib.suppress(*_LOST):
                await self.serve(ws)
            self.closes[str(ws.close_code)] += self.storm.is_set()
            with contextlib.suppress(*_LOST):
                await ws.close()
            ws = await self.session(agent_id, self.urls[at])

    async def serve(self, ws: ClientConnection) -> None:
        """Acknowledge each TEXT as it comes (ACK up to its seq)."""
        async for raw in ws:
            message = orjson.loads(raw)
            if message["message_type"] != "TEXT":
                continue
            body = {
                "sender_id": message["receiver_id"],
                "receiver_id": "global_lobby",
                "message_type": "ACK",
                "payload": {"up_to": message["seq"]},
                "auth_token": self.tokens[message["receiver_id"]],
            }
            await ws.send(orjson.dumps(body).decode())
            self.deliveries.append((message["message_id"], time.time()))
            self.changed.set()

    def report(self) -> dict[str, Any]:
        return {
            "agents": len(self.ids),
            "resumed": len(self.resumed),
            "resumed_ids": list(self.resumed),
            "resumed_on": dict(self.resumed_on),
            "last_resumed": max(self.resumed.values(), default=None),
            "reregistered": self.reregistered,
            "refusals": dict(self.refusals),
            "codes": dict(self.codes),
            "closes": dict(self.closes),
            "unreachable": self.unreachable,
            "deliveries": self.deliveries,
        }


async def drive(
    urls: list[str],
    source: str,
    ids: list[str],
    held: list[str],
    expected: int,
    pipe: Connection,
    returning: list[str] | None = None,
) -> None:
    fleet = Fleet(urls, source, ids, set(held))
    due = set(ids if returning is None else returning)
    tasks = [asyncio.create_task(fleet.run(agent_id)) for agent_id in ids]
    loop = asyncio.get_running_loop()
    commands = loop.run_in_executor(None, pipe.recv)
    try:
        while fleet.registered < len(ids) or fleet.offline < len(held):
            fleet.changed.clear()
            await fleet.changed.wait()
        pipe.send(("ready", fleet.registered))
        assert (await commands)[0] == "storm"
        fleet.storm.set()
        pipe.send(("storming", None))  # the parent stops the lobby only after this
        assert (await loop.run_in_executor(None, pipe.recv))[0] == "back"
        fleet.back.set()
        commands = loop.run_in_executor(None, pipe.recv)
        while not commands.done():
            if due.issubset(fleet.resumed) and len(fleet.deliveries) >= expected:
                break
            fleet.changed.clear()
            waiter = asyncio.ensure_future(fleet.changed.wait())
            await asyncio.wait({waiter, commands}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        pipe.send(("done", fleet.report()))
        await commands  # ("stop",): the parent has every report
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main(
    urls: list[str],
    source: str,
    ids: list[str],
    held: list[str],
    expected: int,
    pipe: Connection,
    returning: list[str] | None = None,
) -> None:
    """A client process (spawned): `expected` held messages are due to its held agents;
    `returning`: the agents due to resume after the storm (None: every one)."""
    raise_fd_limit()
    asyncio.run(drive(urls, source, ids, held, expected, pipe, returning))
