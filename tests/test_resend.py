"""A sender's resend over real sockets, from raw clients (no SDK to drop a repeat on its
side): the lobby delivers a (sender, message_id) once within the dedupe horizon, confirms
every copy to the sender, tells two senders' equal ids apart, and forgets an id after the
horizon. "Delivered once" is read from the receiver's socket: the sender's next message
arrives right behind the first copy, with nothing between them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from lobby.server import LobbyServer
from tests.conftest import SETTINGS, TRANSPORTS
from tests.routerkit import Clock, make_router
from tests.wsclient import frame, reply, token_of

HORIZON = 60.0


class Raw:
    """A registered raw client: send TEXTs with a message_id of its choice, read frames."""

    def __init__(self, ws: ClientConnection, agent_id: str, token: str) -> None:
        self.ws, self.agent_id, self.token = ws, agent_id, token

    async def text(self, to: str, content: str, message_id: str) -> None:
        payload = {"content": content}
        await self.ws.send(
            frame(
                self.agent_id,
                "TEXT",
                payload,
                receiver_id=to,
                message_id=message_id,
                auth_token=self.token,
            )
        )

    async def next(self) -> dict[str, Any]:
        return await reply(self.ws)

    async def accepted(self) -> str:
        """The message_id the lobby's next ACCEPTED confirms."""
        confirmation = await self.next()
        assert confirmation["message_type"] == "ACCEPTED", confirmation
        return str(confirmation["payload"]["message_id"])


@asynccontextmanager
async def raw_agent(url: str, agent_id: str) -> AsyncIterator[Raw]:
    async with connect(url) as ws:
        yield Raw(ws, agent_id, await token_of(ws, agent_id, acks=True))


async def texts(receiver: Raw, *, up_to: tuple[str, str]) -> list[tuple[str, str, str]]:
    """(sender, message_id, content) of what `receiver` gets, up to and with the message
    `up_to` names (sender, message_id): the last one sent, so nothing else is on its way."""
    out: list[tuple[str, str, str]] = []
    while not out or out[-1][:2] != up_to:
        message = await receiver.next()
        out.append((message["sender_id"], message["message_id"], message["payload"]["content"]))
    return out


@pytest.fixture
async def alice(lobby: LobbyServer) -> AsyncIterator[Raw]:
    async with raw_agent(lobby.url, "alice") as raw:
        yield raw


@pytest.fixture
async def bob(lobby: LobbyServer) -> AsyncIterator[Raw]:
    async with raw_agent(lobby.url, "bob") as raw:
        yield raw


async def test_the_same_message_id_twice_reaches_the_receiver_once_and_is_confirmed_twice(
    alice: Raw, bob: Raw
) -> None:
    await alice.text("bob", "hello", "m-1")
    assert await alice.accepted() == "m-1"
    await alice.text("bob", "hello again", "m-1")
    assert await alice.accepted() == "m-1"  # the resend is confirmed, not refused
    await alice.text("bob", "next", "m-2")
    assert await alice.accepted() == "m-2"
    assert await texts(bob, up_to=("alice", "m-2")) == [
        ("alice", "m-1", "hello"),
        ("alice", "m-2", "next"),
    ]


async def test_two_senders_with_the_same_message_id_are_both_delivered(
    lobby: LobbyServer, alice: Raw, bob: Raw
) -> None:
    async with raw_agent(lobby.url, "carol") as carol:
        await alice.text("bob", "from alice", "m-1")
        assert await alice.accepted() == "m-1"
        await carol.text("bob", "from carol", "m-1")
        assert await carol.accepted() == "m-1"
        await carol.text("bob", "carol's next", "m-2")
        assert await carol.accepted() == "m-2"
    assert await texts(bob, up_to=("carol", "m-2")) == [
        ("alice", "m-1", "from alice"),
        ("carol", "m-1", "from carol"),
        ("carol", "m-2", "carol's next"),
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_message_id_is_forgotten_after_the_dedupe_horizon(
    tmp_path: Path, transport: Any
) -> None:
    clock = Clock()
    lobby = LobbyServer(
        replace(SETTINGS, data_dir=tmp_path, transport=transport),
        router=make_router(clock, dedupe_horizon=HORIZON),
    )
    await lobby.start()
    try:
        async with raw_agent(lobby.url, "alice") as alice, raw_agent(lobby.url, "bob") as bob:
            await alice.text("bob", "sent", "m-1")
            assert await alice.accepted() == "m-1"
            clock.now += HORIZON
            await alice.text("bob", "resent at the horizon", "m-1")
            assert await alice.accepted() == "m-1"
            clock.now += 1
            await alice.text("bob", "resent past the horizon", "m-1")
            assert await alice.accepted() == "m-1"
            await alice.text("bob", "next", "m-2")
            assert await alice.accepted() == "m-2"
            assert await texts(bob, up_to=("alice", "m-2")) == [
                ("alice", "m-1", "sent"),
                ("alice", "m-1", "resent past the horizon"),
                ("alice", "m-2", "next"),
            ]
    finally:
        await lobby.stop()
