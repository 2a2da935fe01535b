"""The lobby server: the router's behaviours through `LobbyServer`, on the memory transport (no
sockets) and over real sockets on 127.0.0.1 on each socket transport. What only a socket
shows (framing, HTTP, closing handshakes) is tested in tests/transport/."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.conftest import TRANSPORTS
from tests.wsclient import (
    CLOSED,
    Client,
    Served,
    frame,
    reply,
    running,
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


async def expect_silence(ws: Client, seconds: float = 0.2) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ws.recv(), seconds)


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
        await expect_silence(hunter)


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
        await asyncio.sleep(0.1)
        async with served.connect() as again:
            await again.send(frame("receiver", "REGISTER", {}, auth_token=receiver_token))
            assert (await reply(again))["payload"]["status"] == "success_resumed"
            assert [(await reply(again))["payload"]["n"] for _ in range(3)] == [0, 1, 2]


async def test_a_message_is_confirmed_once_its_group_commit_is_done(tmp_path: Path) -> None:
    """ACCEPTED comes after the commit that holds the message, which starts at most
    `commit_interval` after it was accepted."""
    async with (
        running(tmp_path, commit_interval=0.3) as lobby,
        connect(lobby.url) as sender,
        connect(lobby.url) as receiver,
    ):
        assert lobby.committer.stats()["commit_interval_ms"] == 300
        token = await token_of(sender, "sender", acks=True)
        await token_of(receiver, "receiver", capabilities=[CAP])
        started = asyncio.get_running_loop().time()
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
        accepted = await reply(sender)
        assert accepted["message_type"] == "ACCEPTED"
        assert accepted["payload"] == {"message_id": "m1"}
        assert asyncio.get_running_loop().time() - started >= 0.25


@pytest.mark.parametrize("transport", ["memory", *TRANSPORTS])
async def test_stop_closes_every_connection_with_1001(tmp_path: Path, transport: str) -> None:
    async with serving(tmp_path, transport) as served, served.connect() as ws:
        await token_of(ws, "leaving")
        await served.lobby.stop()
        with pytest.raises(CLOSED):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1001
