"""A recorded session: every frame of the examples and a few raw exchanges, both ways, as they
crossed the wire between agents and a real lobby (a WebSocket proxy in between writes them
down). What the generated clients of tests/test_generated_clients.py must parse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import websockets.asyncio.client
import websockets.asyncio.server
from websockets.exceptions import ConnectionClosed

from examples.agora import run as agora
from examples.fipa_haggle import run as fipa_haggle
from examples.marketplace import run as marketplace
from examples.price_hunter import run as price_hunter
from examples.pricer import run as pricer
from tests.wsclient import frame, reply, running, token_of


@dataclass
class Recording:
    """The text frames each way: `sent` by agents, `received` from the lobby."""

    sent: list[str] = field(default_factory=list)
    received: list[str] = field(default_factory=list)

    def types(self, frames: list[str]) -> set[str]:
        return {orjson.loads(text)["message_type"] for text in frames}


@asynccontextmanager
async def recording_proxy(lobby_url: str, recording: Recording) -> AsyncIterator[str]:
    """A WebSocket proxy to `lobby_url` that records every text frame; yields its URL."""

    async def pipe(
        source: Any,
        target: Any,
        frames: list[str],
    ) -> None:
        try:
            async for message in source:
                if isinstance(message, str):
                    frames.append(message)
                await target.send(message)
        except ConnectionClosed:
            pass
        finally:
            await target.close()

    async def handle(agent: websockets.asyncio.server.ServerConnection) -> None:
        async with websockets.asyncio.client.connect(lobby_url, max_size=None) as lobby:
            await asyncio.gather(
                pipe(agent, lobby, recording.sent), pipe(lobby, agent, recording.received)
            )

    async with websockets.asyncio.server.serve(handle, "127.0.0.1", 0, max_size=None) as proxy:
        port = proxy.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/"


async def _raw_exchanges(url: str) -> None:
    """What the examples do not send: a pull of held messages, the ledger, a REQUEST with a
    timeout, its provider's question and the INPUT answering it, and its CANCEL, a watch and the
    capability update it sees, a refused frame, an idle dialogue the lobby ends, and an
    unregister."""
    async with (
        websockets.asyncio.client.connect(url) as a,
        websockets.asyncio.client.connect(url) as b,
    ):
        token_a = await token_of(a, "rec_a")
        token_b = await token_of(b, "rec_b", capabilities=[{"name": "echo", "description": "x"}])
        await a.send(frame("rec_a", "FETCH_MESSAGES", {}, auth_token=token_a))
        assert (await reply(a))["message_type"] == "MESSAGES"
        await a.send(frame("rec_a", "LIST_TRANSACTIONS", {}, auth_token=token_a))
        assert (await reply(a))["message_type"] == "TRANSACTIONS"
        await a.send(
            frame(
                "rec_a",
                "REQUEST",
                {"capability_name": "echo"},
                auth_token=token_a,
                receiver_id="rec_b",
                conversation_id="r",
                timeout_ms=60_000,
            )
        )
        assert (await reply(b))["message_type"] == "REQUEST"  # with its deadline
        ask = {"status": "in_progress", "input_required": {"question": "which?"}}
        await b.send(
            frame(
                "rec_b",
                "RESPONSE",
                ask,
                auth_token=token_b,
                receiver_id="rec_a",
                conversation_id="r",
            )
        )
        assert (await reply(a))["payload"] == ask
        await a.send(
            frame(
                "rec_a",
                "INPUT",
                {"pick": 1},
                auth_token=token_a,
                receiver_id="rec_b",
                conversation_id="r",
            )
        )
        assert (await reply(b))["message_type"] == "INPUT"
        cancel = {"reason": "recorded"}
        await a.send(frame("rec_a", "CANCEL", cancel, auth_token=token_a, conversation_id="r"))
        assert (await reply(b))["message_type"] == "CANCEL"
        assert (await reply(a))["payload"]["code"] == "cancelled"
        watch = {"agent_ids": ["rec_b"]}
        await a.send(frame("rec_a", "WATCH", watch, auth_token=token_a, conversation_id="w"))
        while (await reply(a))["payload"]["event"] != "snapshot_end":
            pass
        caps = {"capabilities": [{"name": "echo2", "description": "y"}]}
        await b.send(frame("rec_b", "UPDATE_CAPABILITIES", caps, auth_token=token_b))
        assert (await reply(a))["payload"]["event"] == "capabilities_changed"
        await a.send(frame("rec_a", "UNWATCH", {}, auth_token=token_a, conversation_id="w"))
        await a.send(frame("rec_a", "TEXT", {"content": "hi"}, auth_token="wrong"))
        assert (await reply(a))["message_type"] == "ERROR"
        cfp = {"query": {"goods": "anything"}}
        await a.send(
            frame("rec_a", "CFP", cfp, auth_token=token_a, receiver_id="rec_b", conversation_id="d")
        )
        while (await reply(a))["message_type"] != "DIALOGUE_EXPIRED":
            pass
        await b.send(frame("rec_b", "UNREGISTER", {}, auth_token=token_b))
        await asyncio.sleep(0.1)


async def record_session(data_dir: Path) -> Recording:
    """Run the examples and the raw exchanges through a recording proxy to a fresh lobby."""
    recording = Recording()
    async with (
        running(data_dir, dialogue_timeout=1.0) as lobby,
        recording_proxy(lobby.url, recording) as url,
    ):
        await price_hunter.main(url)
        await fipa_haggle.main(url)
        await agora.main(url)
        await marketplace.main(url)
        await pricer.main(url)
        await _raw_exchanges(url)
    return recording
