"""An agent that resumes on another live node takes its mailbox along: real `lobby serve
--cluster` processes on one real `nats-server -js`, agents talking raw WebSocket, messages in
flight to the agent from both nodes while it moves."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_cluster_registry import WAIT, Agent, agent
from tests.test_cluster_routing import send
from tests.test_durability import stop
from tests.wsclient import frame, reply

BEFORE, DURING = 40, 120
"""TEXTs each sender sends before the move, and while it happens."""


async def texts(sender: Agent, first: int, last: int) -> None:
    for n in range(first, last):
        await send(sender, "bob", "TEXT", {"content": str(n)}, message_id=f"{sender.agent_id}-{n}")
        if n % 10 == 0:
            await asyncio.sleep(0.005)  # a steady stream, not one burst


async def closed(ws: ClientConnection) -> None:
    """Until `ws` is closed, dropping what it still receives (what reached it before a move,
    unacknowledged: its new connection gets it again)."""
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(WAIT):
            async for _ in ws:
                pass


async def until_all(ws: ClientConnection, ids: set[str]) -> list[dict[str, Any]]:
    """What `ws` receives until every id in `ids` came (with nothing else but TEXTs)."""
    got: list[dict[str, Any]] = []
    seen: set[str] = set()
    async with asyncio.timeout(WAIT):
        while not ids <= seen:
            message = await reply(ws)
            assert message["message_type"] == "TEXT", message
            got.append(message)
            seen.add(message["message_id"])
    return got


async def test_a_resume_on_another_live_node_takes_the_mailbox_and_what_is_in_flight(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(a, "bob", capabilities=[cap("c")], acks=True) as bob,
                agent(a, "alice", acks=False) as alice,
                agent(b, "carol", acks=False) as carol,
            ):
                await carol.until_discovered({"bob": ["c"]})
                await asyncio.gather(texts(alice, 0, BEFORE), texts(carol, 0, BEFORE))
                early = {f"{s}-{n}" for s in ("alice", "carol") for n in range(BEFORE)}
                await until_all(bob.ws, early)  # delivered on a, none acknowledged
                senders = asyncio.gather(
                    texts(alice, BEFORE, BEFORE + DURING), texts(carol, BEFORE, BEFORE + DURING)
                )
                await asyncio.sleep(0.05)
                async with connect(b.url) as moved:
                    await moved.send(frame("bob", "REGISTER", {"acks": True}, auth_token=bob.token))
                    ack = await reply(moved)
                    assert ack["payload"]["status"] == "success_resumed", ack
                    await closed(bob.ws)
                    assert bob.ws.close_code == 4001
                    await senders
                    every = {f"{s}-{n}" for s in ("alice", "carol") for n in range(BEFORE + DURING)}
                    got = await until_all(moved, every)
        finally:
            stop(a)
            stop(b)
    # Every message once on the new connection, numbered on, each sender's in order; what a
    # held unacknowledged came again marked redelivered.
    ids = [m["message_id"] for m in got]
    assert len(ids) == len(set(ids)) == len(every)
    seqs = [m["seq"] for m in got]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    for sender in ("alice", "carol"):
        numbers = [int(m["payload"]["content"]) for m in got if m["sender_id"] == sender]
        assert numbers == list(range(BEFORE + DURING))
    assert {m["message_id"] for m in got if m.get("redelivered")} >= early
