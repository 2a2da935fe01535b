"""Delivery paced by the reader, over real sockets on both transports: a slow reader drains a
backlog several times `--max-outbound-bytes` without being cut, a live message never overtakes
the backlog, a reader that stops reading live traffic is still closed with 4002 and finds its
messages on resume, and what is held for an agent without acks is kept (the pure decisions:
tests/core/test_pacing.py)."""

from __future__ import annotations

import asyncio
import socket
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from lobby.server import LobbyServer
from tests.conftest import TRANSPORTS
from tests.waiting import until
from tests.wsclient import frame, reply, running, token_of

BOUND = 1024 * 1024
"""`--max-outbound-bytes` here; the window is half of it (the default one, capped)."""
CONTENT = "x" * 1000
"""About 1.1 KB as delivered."""
RATE = 256 * 1024
"""Bytes per second the slow reader takes."""


def slowly(url: str) -> AbstractAsyncContextManager[ClientConnection]:
    """A client whose socket holds little (a 32 KiB receive buffer, 4 messages queued):
    what it does not read stays in the lobby."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    host, port = url.removeprefix("ws://").rstrip("/").split(":")
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return connect(url, sock=sock, max_queue=4, max_size=None)


async def read_slowly(
    ws: ClientConnection, count: int, token: str | None = None
) -> list[dict[str, Any]]:
    """Read `count` TEXTs at about `RATE` (a pause after each 16th of it), acknowledging every
    200th with `token`, if given."""
    got: list[dict[str, Any]] = []
    budget = 0
    while len(got) < count:
        data = await asyncio.wait_for(ws.recv(), 10)
        message = orjson.loads(data)
        assert message["message_type"] == "TEXT", message
        got.append(message)
        budget += len(data)
        if budget >= RATE // 16:
            budget = 0
            await asyncio.sleep(1 / 16)
        if token is not None and len(got) % 200 == 0:
            receiver = message["receiver_id"]
            await ws.send(frame(receiver, "ACK", {"up_to": message["seq"]}, auth_token=token))
    return got


async def read_to_the_end(ws: ClientConnection) -> None:
    """Read what the connection got before the cut, until the close (or the TCP connection
    lost)."""
    while True:
        await asyncio.wait_for(ws.recv(), 10)


def small_send_buffer(lobby: LobbyServer, agent_id: str) -> None:
    """Give the lobby's socket to `agent_id` a small send buffer, as a slow link has: what
    the reader has not taken then waits in the lobby's queue, not in the kernel's."""
    link: Any = record(lobby, agent_id).session.link
    transport = getattr(link, "_transport", None)  # picows' WSTransport
    transport = link.transport if transport is None else transport.underlying_transport
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)


async def flood(ws: ClientConnection, token: str, to: str, numbers: range) -> None:
    for n in numbers:
        await ws.send(
            frame(
                "sender",
                "TEXT",
                {"content": CONTENT, "n": n},
                receiver_id=to,
                auth_token=token,
            )
        )


def record(lobby: LobbyServer, agent_id: str) -> Any:
    return lobby.router.registry.agents[agent_id]


async def drain_a_backlog(data_dir: Path, transport: str) -> None:
    backlog = 4500  # about 5 MB: five times the bound, at 256 KB/s about 20 s
    async with (
        running(data_dir, transport=transport, max_outbound_bytes=BOUND) as lobby,
        connect(lobby.url) as sender,
    ):
        sender_token = await token_of(sender, "sender")
        async with connect(lobby.url) as first:
            token = await token_of(first, "reader", acks=True)
        await until(lambda: record(lobby, "reader").session is None, "reader still online")
        await flood(sender, sender_token, "reader", range(backlog))
        reader = record(lobby, "reader")
        await until(lambda: len(reader.mailbox) == backlog, "the backlog never filled")
        assert sum(len(f) for _, f in reader.mailbox) > 4 * BOUND
        async with slowly(lobby.url) as ws:
            await ws.send(frame("reader", "REGISTER", {"acks": True}, auth_token=token))
            assert (await reply(ws))["payload"]["status"] == "success_resumed"
            assert reader.paced  # what did not fit the window waits for the socket to drain
            got = await read_slowly(ws, 1000, token)
            await flood(sender, sender_token, "reader", range(backlog, backlog + 10))  # live
            got += await read_slowly(ws, backlog + 10 - 1000, token)
            assert ws.close_code is None
            assert reader.session is not None
        assert [m["payload"]["n"] for m in got] == list(range(backlog + 10))
        assert [m["seq"] for m in got] == list(range(1, backlog + 11))
        assert all(m.get("redelivered") is None for m in got)


async def test_a_slow_reader_drains_a_backlog_of_five_times_the_bound_uncut(
    tmp_path: Path,
) -> None:
    """Both transports at once (the reading is the slow part): an acknowledging agent that
    resumes to about 5 MB held, reading at 256 KB/s, gets all of it and the live messages
    sent meanwhile, in order, on one connection. Unpaced, the replay would have filled its
    queue past the bound at once and been cut with 4002 (so 5 MB proves what 10 MB would:
    only the ratio to the bound matters, and the window is refilled from the same code)."""
    await asyncio.gather(
        *(drain_a_backlog(tmp_path / transport, transport) for transport in TRANSPORTS)
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reader_that_stops_reading_live_traffic_is_cut_and_finds_it_on_resume(
    tmp_path: Path, transport: str
) -> None:
    """Paced, what is held for a connected agent counts towards the bound with its queue:
    one that stops reading is closed with 4002, and resumes to every message, in order."""
    async with (
        running(tmp_path, transport=transport, max_outbound_bytes=BOUND) as lobby,
        connect(lobby.url) as sender,
        slowly(lobby.url) as stalled,
    ):
        sender_token = await token_of(sender, "sender")
        token = await token_of(stalled, "stalled", acks=True)
        agent = record(lobby, "stalled")
        sent = 0
        while agent.session is not None and sent < 20_000:
            await flood(sender, sender_token, "stalled", range(sent, sent + 50))
            sent += 50
            await asyncio.sleep(0)
        assert agent.session is None, "never cut"
        assert sent * len(CONTENT) < 20 * BOUND  # cut near the bound, not at the mailbox limit
        with pytest.raises(ConnectionClosed):
            await read_to_the_end(stalled)
        async with connect(lobby.url, max_size=None) as again:
            await again.send(frame("stalled", "REGISTER", {"acks": True}, auth_token=token))
            assert (await reply(again))["payload"]["status"] == "success_resumed"
            got = [(await reply(again))["payload"]["n"] for _ in range(sent)]
        assert got == list(range(sent))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_what_is_held_for_an_agent_without_acks_is_kept_and_written_in_order(
    tmp_path: Path, transport: str
) -> None:
    """An agent without acks counts a message delivered once written: what its full window
    holds back stays in its mailbox (and the store) until written. Read slowly, a burst of
    more than its window arrives whole and in order; cut, it finds the held rest on resume."""
    burst = 700  # about 770 KB: past the window (512 KiB), within the bound
    async with (
        running(tmp_path, transport=transport, max_outbound_bytes=BOUND) as lobby,
        connect(lobby.url) as sender,
        slowly(lobby.url) as reader,
    ):
        sender_token = await token_of(sender, "sender")
        token = await token_of(reader, "reader")
        agent = record(lobby, "reader")
        small_send_buffer(lobby, "reader")
        await flood(sender, sender_token, "reader", range(burst))
        await until(lambda: agent.next_seq == burst, "the burst never arrived")
        assert agent.paced
        held = len(agent.mailbox)
        assert held > 0  # held, not counted delivered
        assert agent.acked_seq == burst - held
        got = await read_slowly(reader, burst)
        assert [m["payload"]["n"] for m in got] == list(range(burst))
        await until(lambda: not agent.mailbox, "written, yet still held")
        # Now it stops reading: cut once what is held and its queue pass the bound.
        sent = burst
        while agent.session is not None and sent < 20_000:
            await flood(sender, sender_token, "reader", range(sent, sent + 50))
            sent += 50
            await asyncio.sleep(0)
        assert agent.session is None, "never cut"
        await until(lambda: agent.next_seq == sent, "the last messages never arrived")
        kept = [orjson.loads(f)["payload"]["n"] for _, f in agent.mailbox]
        assert kept == list(range(sent - len(kept), sent))  # the newest, none written
        with pytest.raises(ConnectionClosed):
            await read_to_the_end(reader)
        async with connect(lobby.url, max_size=None) as again:
            await again.send(frame("reader", "REGISTER", {}, auth_token=token))
            assert (await reply(again))["payload"]["status"] == "success_resumed"
            got = [(await reply(again))["payload"]["n"] for _ in kept]
        assert got == kept
