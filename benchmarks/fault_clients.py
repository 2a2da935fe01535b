"""Wire-level agents for the `faults` phase (`benchmarks.faults`): raw websockets and orjson,
not the SDK, so that repeats, `redelivered` and close codes are seen as the lobby sends them.

A `Sender` streams numbered TEXTs `<id>-<n>` at a steady rate and keeps each until an ACCEPTED
covers it (ACCEPTED X covers X and all sent before it on that connection, PROTOCOL.md §7); a
`Receiver` records every TEXT and ACKs now and then. Both reconnect on any lost connection, to
their nodes in turn, resuming with their token and (a sender) resending everything not yet
covered, with the same message_ids, in order. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import orjson
import websockets.asyncio.client
import websockets.exceptions
from websockets.asyncio.client import ClientConnection

CONNECT: dict[str, Any] = {
    "open_timeout": 2.0,  # a paused node accepts TCP but never answers the handshake
    "ping_interval": 1.0,  # a paused node's connections must be noticed within seconds
    "ping_timeout": 2.0,
    "close_timeout": 1.0,
    "max_size": None,
}
REGISTER_WAIT = 10.0
"""Seconds a REGISTER may wait for its answer (a resume across nodes waits for a handover)."""
RETRY = 0.2
"""Seconds between connection attempts (1013 says: try again shortly)."""
ACK_EVERY = 50
ACK_INTERVAL = 0.1
_LOST = (OSError, TimeoutError, websockets.exceptions.WebSocketException)


def envelope(sender: str, kind: str, payload: dict[str, Any], **extra: Any) -> str:
    """A text frame (the lobby refuses binary ones)."""
    body = {"sender_id": sender, "receiver_id": "global_lobby", "message_type": kind}
    return orjson.dumps({**body, "payload": payload, **extra}).decode()


def number(message_id: str) -> int:
    return int(message_id.rsplit("-", 1)[1])


@dataclass
class Delivery:
    at: float
    message_id: str
    sender: str
    seq: int
    redelivered: bool


@dataclass
class Wire:
    """What happened on one agent's connections: close codes, refused REGISTERs, resumes that
    came back as new registrations (the lobby lost the agent)."""

    closes: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    reregistered: int = 0
    sessions: int = 0


class Agent:
    """One agent id's connections: `session()` opens the next one (REGISTER or resume)."""

    def __init__(self, agent_id: str, urls: list[str]) -> None:
        self.agent_id = agent_id
        self.urls = urls
        self.token: str | None = None
        self.wire = Wire()
        self._attempt = 0
        self.done = asyncio.Event()

    async def session(self, url: str | None = None) -> ClientConnection | None:
        """A registered connection to `url` (else the next of `urls`), or None (recorded)."""
        if url is None:
            url = self.urls[self._attempt % len(self.urls)]
            self._attempt += 1
        try:
            ws = await websockets.asyncio.client.connect(url, **CONNECT)
        except _LOST as exc:
            self.wire.closes[type(exc).__name__] += 1
            return None
        resume = {"auth_token": self.token} if self.token else {}
        self.begin()
        try:
            await ws.send(envelope(self.agent_id, "REGISTER", {"acks": True}, **resume))
            async with asyncio.timeout(REGISTER_WAIT):
                while True:
                    answer = orjson.loads(await ws.recv())
                    if answer["message_type"] in ("REGISTER_ACK", "ERROR"):
                        break
                    self.handle(answer)  # whatever came first still counts
        except _LOST:
            self._closed(ws)
            await ws.close()
            return None
        if answer["message_type"] == "ERROR":
            self.wire.refusals[answer["payload"].get("code", "?")] += 1
            await ws.close()
            return None
        if self.token and answer["payload"]["status"] != "success_resumed":
            self.wire.reregistered += 1  # a resume answered as a new agent: state was lost
        self.token = answer["payload"]["auth_token"]
        self.wire.sessions += 1
        return ws

    def _closed(self, ws: ClientConnection) -> None:
        code = ws.close_code if ws.close_code is not None else "none"
        self.wire.closes[str(code)] += 1

    async def run(self) -> None:
        """Connect, serve, reconnect, until `done` is set (cancellation also ends it)."""
        while not self.done.is_set():
            ws = await self.session()
            if ws is None:
                await asyncio.sleep(RETRY)
                continue
            try:
                await self.serve(ws)
            except _LOST:
                pass
            finally:
                if not self.done.is_set():
                    self._closed(ws)
                with contextlib.suppress(*_LOST):
                    await ws.close()

    def begin(self) -> None:
        """A new connection is about to REGISTER."""

    async def serve(self, ws: ClientConnection) -> None:
        raise NotImplementedError

    def handle(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def frame(self, kind: str, payload: dict[str, Any], **extra: Any) -> str:
        return envelope(self.agent_id, kind, payload, auth_token=self.token, **extra)


class Sender(Agent):
    """Streams `burst` messages at once, then `rate` a second to `receiver` until `stop` is
    set; `done` once all are covered."""

    def __init__(
        self, agent_id: str, urls: list[str], receiver: str, rate: float, burst: int = 0
    ) -> None:
        super().__init__(agent_id, urls)
        self.receiver, self.rate, self.burst = receiver, rate, burst
        self.stop = asyncio.Event()
        self.produced: list[float] = []
        """When message n was first handed to the connection (index n)."""
        self.pending: dict[str, int] = {}
        """message_id -> n, not yet covered by an ACCEPTED, in the order produced."""
        self.covered: dict[int, float] = {}
        """n -> when an ACCEPTED covered it."""
        self.refused: dict[str, str] = {}
        """message_id -> the ERROR code that refused it (covered, but not stored)."""
        self._outbox: deque[str] | None = None
        """message_ids still to send on the current connection."""
        self._wake = asyncio.Event()
        self.last_progress = time.monotonic()

    @property
    def accepted(self) -> set[str]:
        ids = {f"{self.agent_id}-{n}" for n in self.covered}
        return ids - set(self.refused)

    async def produce(self) -> None:
        start = time.monotonic()
        n = 0
        while not self.stop.is_set():
            if n >= self.burst:
                delay = start + (n - self.burst) / self.rate - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), delay)
                    continue
            message_id = f"{self.agent_id}-{n}"
            self.pending[message_id] = n
            self.produced.append(time.monotonic())
            if self._outbox is not None:
                self._outbox.append(message_id)
                self._wake.set()
            n += 1
            if n == self.burst:
                start = time.monotonic()
        self._check_done()

    def _check_done(self) -> None:
        if self.stop.is_set() and not self.pending:
            self.done.set()
            self._wake.set()

    async def serve(self, ws: ClientConnection) -> None:
        # Everything not yet covered goes again first, in order: a resend on this connection.
        self._outbox = outbox = deque(self.pending)
        reader = asyncio.create_task(self._read(ws))
        try:
            while not self.done.is_set() and not reader.done():
                while outbox:
                    message_id = outbox.popleft()
                    # Framed now, not when produced: the token comes with the REGISTER_ACK.
                    payload = {"content": str(number(message_id))}
                    extra = {"receiver_id": self.receiver, "message_id": message_id}
                    await ws.send(self.frame("TEXT", payload, **extra))
                self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            if reader.done():
                reader.result()
        finally:
            self._outbox = None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_LOST):
                await reader

    async def _read(self, ws: ClientConnection) -> None:
        async for raw in ws:
            self.handle(orjson.loads(raw))

    def handle(self, message: dict[str, Any]) -> None:
        kind = message["message_type"]
        if kind == "ERROR" and message.get("in_reply_to") in self.pending:
            self.refused[message["in_reply_to"]] = message["payload"].get("code", "?")
        elif kind == "ACCEPTED":
            upto = number(message["payload"]["message_id"])
            now = time.monotonic()
            for message_id, n in list(self.pending.items()):  # produced order: n ascending
                if n > upto:
                    break
                del self.pending[message_id]
                self.covered[n] = now
                self.last_progress = now
            self._check_done()


class Receiver(Agent):
    """Records every TEXT it is given; ACKs every `ACK_EVERY` messages or `ACK_INTERVAL`."""

    def __init__(self, agent_id: str, urls: list[str]) -> None:
        super().__init__(agent_id, urls)
        self.deliveries: list[Delivery] = []
        self.connected = False
        self._ws: ClientConnection | None = None
        self._unacked = 0
        self._last_seq = 0

    def begin(self) -> None:
        self._unacked = self._last_seq = 0  # ACK only what came on this connection

    async def serve(self, ws: ClientConnection) -> None:
        self.connected, self._ws = True, ws
        acker = asyncio.create_task(self._ack_periodically(ws))
        try:
            async for raw in ws:
                self.handle(orjson.loads(raw))
                if self._unacked >= ACK_EVERY:
                    await self._ack(ws)
        finally:
            self.connected, self._ws = False, None
            acker.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_LOST):
                await acker

    async def drop(self) -> None:
        """Close the current connection: the agent reconnects to its next node and resumes."""
        if self._ws is not None:
            with contextlib.suppress(*_LOST):
                await self._ws.close()

    def handle(self, message: dict[str, Any]) -> None:
        if message["message_type"] != "TEXT":
            return
        seq = int(message["seq"])
        self.deliveries.append(
            Delivery(
                time.monotonic(),
                message["message_id"],
                message["sender_id"],
                seq,
                bool(message.get("redelivered")),
            )
        )
        self._last_seq = max(self._last_seq, seq)
        self._unacked += 1

    async def _ack(self, ws: ClientConnection) -> None:
        if self._unacked:
            self._unacked = 0
            await ws.send(self.frame("ACK", {"up_to": self._last_seq}))

    async def _ack_periodically(self, ws: ClientConnection) -> None:
        while True:
            await asyncio.sleep(ACK_INTERVAL)
            await self._ack(ws)
