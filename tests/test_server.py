"""The lobby server: the router's behaviours through `LobbyServer`, on the memory transport (no
sockets) and over real sockets on 127.0.0.1 on each socket transport. What only a socket
shows (framing, HTTP, closing handshakes) is tested in tests/transport/."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from lobby.server import LobbyServer
from lobby.store.sqlite import SqliteStore
from tests.conftest import SETTINGS, TRANSPORTS
from tests.waiting import BOUND
from tests.wsclient import (
    CLOSED,
    Client,
    Served,
    frame,
    reply,
    serving,
    token_of,
)

CAP = {"name": "price", "description": "", "input_schema": {}, "output_schema": {}}


@pytest.fixture(params=["memory", *TRANSPORTS])
async def served(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """A lobby with its sqlite store in a fresh directory; every test that uses it runs once
    on the memory transport and once on each socket transport."""
    async with serving(tmp_path / "lobby-data", request.param) as served:
        yield served


async def nothing_before_the_answer_to(ws: Client, agent_id: str, token: str) -> None:
    """Nothing was sent to `ws` before now: what it asks the lobby next is the next thing it
    gets (the lobby handles frames in order and writes each connection's frames in order)."""
    await ws.send(frame(agent_id, "DISCOVER_SERVICES", {}, auth_token=token))
    assert (await reply(ws))["message_type"] == "SERVICES_AVAILABLE"


async def test_the_seed_flow(served: Served) -> None:
    """Register, discover, request, response, and a REQUEST refused by authorization."""
    hunter_cap = {**CAP, "authorized_requester_ids": ["searcher"]}
    async with served.connect() as hunter, served.connect() as searcher, served.connect() as rogue:
        hunter_token = await token_of(hunter, "hunter", capabilities=[hunter_cap])
        searcher_token = await token_of(searcher, "searcher")
        rogue_token = await token_of(rogue, "rogue")
        await searcher.send(
            frame(
                "searcher",
                "DISCOVER_SERVICES",
                {"capability_name": "price"},
                auth_token=searcher_token,
            )
        )
        found = await reply(searcher)
        assert found["payload"]["services_found"][0]["agent_id"] == "hunter"
        request = {"capability_name": "price", "item": "x"}
        await searcher.send(
            frame(
                "searcher",
                "REQUEST",
                request,
                receiver_id="hunter",
                conversation_id="k",
                auth_token=searcher_token,
            )
        )
        delivered = await reply(hunter)
        assert delivered["payload"] == request
        assert "auth_token" not in delivered
        await hunter.send(
            frame(
                "hunter",
                "RESPONSE",
                {"status": "success", "price": 1},
                receiver_id="searcher",
                conversation_id="k",
                auth_token=hunter_token,
            )
        )
        answer = await reply(searcher)
        assert answer["payload"] == {"status": "success", "price": 1}
        assert "auth_token" not in answer
        await rogue.send(
            frame(
                "rogue",
                "REQUEST",
                request,
                receiver_id="hunter",
                conversation_id="r",
                auth_token=rogue_token,
            )
        )
        refused = await reply(rogue)
        assert refused["payload"]["code"] == "unauthorized"
        await nothing_before_the_answer_to(hunter, "hunter", hunter_token)


@pytest.mark.parametrize(
    "bad",
    [
        b"\x00binary",
        "{not json",
        "[1, 2]",
        '{"sender_id": "a", "receiver_id": "b", "message_type": "NOPE", "payload": {}}',
        '{"sender_id": 5, "receiver_id": "b", "message_type": "REQUEST", "payload": {}}',
        '{"sender_id": "a", "message_type": "REQUEST"}',
    ],
)
async def test_bad_input_gets_malformed_and_the_connection_stays_usable(
    served: Served, bad: str | bytes
) -> None:
    async with served.connect() as ws, served.connect() as bystander:
        token = await token_of(ws, "clumsy")
        bystander_token = await token_of(bystander, "bystander")
        await ws.send(bad)
        error = await reply(ws)
        assert error["message_type"] == "ERROR"
        assert error["payload"]["code"] == "malformed"
        assert error["payload"]["error"]
        await ws.send(frame("clumsy", "DISCOVER_SERVICES", {}, auth_token=token))
        assert (await reply(ws))["message_type"] == "SERVICES_AVAILABLE"
        await bystander.send(
            frame("bystander", "DISCOVER_SERVICES", {}, auth_token=bystander_token)
        )
        assert (await reply(bystander))["message_type"] == "SERVICES_AVAILABLE"


async def test_a_malformed_frame_is_answered_in_reply_to_its_message_id(served: Served) -> None:
    """The ERROR names the refused frame's message_id and valid conversation_id, and leaves out
    a conversation_id too long to be valid rather than echo it."""
    async with served.connect() as ws:
        token = await token_of(ws, "clumsy")
        for conversation_id, echoed in (("c1", "c1"), ("c" * 300, None)):
            bad = frame("clumsy", "TEXT", {"content": "x"}, auth_token=token, seq="not a number")
            await ws.send(bad[:-1] + f',"message_id":"m1","conversation_id":"{conversation_id}"}}')
            error = await reply(ws)
            assert error["payload"]["code"] == "malformed"
            assert error["in_reply_to"] == "m1"
            assert error.get("conversation_id") == echoed


async def test_resume_closes_the_old_connection_with_4001(served: Served) -> None:
    async with served.connect() as old, served.connect() as new:
        token = await token_of(old, "twin")
        await new.send(frame("twin", "REGISTER", {}, auth_token=token))
        assert (await reply(new))["payload"]["status"] == "success_resumed"
        with pytest.raises(CLOSED):
            await asyncio.wait_for(old.recv(), 5)
        assert old.close_code == 4001


async def test_unregister_closes_with_4003(served: Served) -> None:
    async with served.connect() as ws:
        token = await token_of(ws, "leaver")
        await ws.send(frame("leaver", "UNREGISTER", {}, auth_token=token))
        with pytest.raises(CLOSED):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 4003
    assert "leaver" not in served.lobby.router.registry.agents


async def test_held_messages_arrive_on_resume(served: Served) -> None:
    async with served.connect() as sender:
        async with served.connect() as receiver:
            receiver_token = await token_of(receiver, "receiver", capabilities=[CAP])
        sender_token = await token_of(sender, "sender")
        for n in range(3):
            await sender.send(
                frame(
                    "sender",
                    "REQUEST",
                    {"capability_name": "price", "n": n},
                    receiver_id="receiver",
                    conversation_id=f"k{n}",
                    auth_token=sender_token,
                )
            )
        await nothing_before_the_answer_to(sender, "sender", sender_token)  # all 3 handled
        async with served.connect() as again:
            await again.send(frame("receiver", "REGISTER", {}, auth_token=receiver_token))
            assert (await reply(again))["payload"]["status"] == "success_resumed"
            assert [(await reply(again))["payload"]["n"] for _ in range(3)] == [0, 1, 2]


class GatedStore(SqliteStore):
    """The sqlite store, whose writer thread waits at `gate` before each batch: the test
    decides when a commit happens, and sees which message ids each one wrote."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.gate = threading.Event()
        self.written: list[str] = []

    def write(self, records: list[Any]) -> None:
        assert self.gate.wait(BOUND), "the test never opened the gate"
        super().write(records)
        self.written += [r.message_id for r in records if hasattr(r, "message_id")]


async def test_a_message_is_confirmed_once_its_group_commit_is_done(tmp_path: Path) -> None:
    """ACCEPTED comes only after the batch that holds the message is written; delivery to
    the receiver does not wait for it."""
    store = GatedStore(tmp_path)
    lobby = LobbyServer(replace(SETTINGS, data_dir=tmp_path), store=store)
    store.gate.set()
    await lobby.start()
    try:
        async with connect(lobby.url) as sender, connect(lobby.url) as receiver:
            token = await token_of(sender, "sender", acks=True)
            await token_of(receiver, "receiver", capabilities=[CAP])
            store.gate.clear()
            await sender.send(
                frame(
                    "sender",
                    "REQUEST",
                    {"capability_name": "price"},
                    receiver_id="receiver",
                    conversation_id="c1",
                    message_id="m1",
                    auth_token=token,
                )
            )
            assert (await reply(receiver))["message_type"] == "REQUEST"  # delivered at once
            await nothing_before_the_answer_to(sender, "sender", token)  # not confirmed yet
            assert "m1" not in store.written
            store.gate.set()
            accepted = await reply(sender)
            assert accepted["message_type"] == "ACCEPTED"
            assert accepted["payload"] == {"message_id": "m1"}
            assert "m1" in store.written
    finally:
        store.gate.set()
        await lobby.stop()


@pytest.mark.parametrize("transport", ["memory", *TRANSPORTS])
async def test_stop_closes_every_connection_with_1001(tmp_path: Path, transport: str) -> None:
    async with serving(tmp_path, transport) as served, served.connect() as ws:
        await token_of(ws, "leaving")
        await served.lobby.stop()
        with pytest.raises(CLOSED):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1001
