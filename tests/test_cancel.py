"""CANCEL against a real lobby (PROTOCOL.md §5.2): `await me.cancel(conversation_id)` and a
cancelled awaiting task both stop the provider's handler (`ctx.cancelled`) and end the call
(`RequestCancelled`); on the wire, CANCEL with nothing open is `unknown_conversation` and one
addressed to an agent is `malformed`."""

from __future__ import annotations

import asyncio

import pytest
import websockets.asyncio.client

from agent_sdk import Agent, RequestCancelled
from lobby.server import LobbyServer
from tests.sdklogs import sdk_events
from tests.test_deadlines import Worker
from tests.wsclient import frame, reply, token_of


async def test_cancel_by_the_requester_stops_the_provider_and_ends_the_call(
    lobby: LobbyServer,
) -> None:
    async with Worker(lobby_url=lobby.url) as worker, Agent("caller", lobby_url=lobby.url) as me:
        with sdk_events() as events:
            call = asyncio.create_task(me.request("worker", "work", {}, conversation_id="c-1"))
            await asyncio.wait_for(worker.started.wait(), 5)
            await me.cancel("c-1", "the user left")
            with pytest.raises(RequestCancelled) as caught:
                await asyncio.wait_for(call, 5)
            assert caught.value.code == "cancelled"
            assert caught.value.message.endswith("was cancelled by 'caller': the user left")
            await asyncio.wait_for(worker.stopped.wait(), 5)
            assert worker.contexts[0].cancelled.is_set()
            await me.cancel("c-1")  # nothing open any more: refused, quietly
            await me.discover("work")
        assert [e for e in events if e["event"] == "LOBBY_ERROR"] == []
        cancelled = [e for e in events if e["event"] == "REQUEST_CANCELLED"]
        assert [e["reason"] for e in cancelled] == ["the user left"]
        assert lobby.router.conversations == {}


async def test_a_cancelled_awaiting_task_cancels_the_request(lobby: LobbyServer) -> None:
    async with Worker(lobby_url=lobby.url) as worker, Agent("caller", lobby_url=lobby.url) as me:
        call = asyncio.create_task(me.request("worker", "work", {}))
        await asyncio.wait_for(worker.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(worker.stopped.wait(), 5)
        assert worker.contexts[0].cancelled.is_set()
        with pytest.raises(asyncio.CancelledError):
            await call
        await me.discover("work")  # the lobby's `cancelled` answer came before: dropped
    assert lobby.router.conversations == {}


async def test_cancel_on_the_wire(lobby: LobbyServer) -> None:
    async with (
        websockets.asyncio.client.connect(lobby.url) as a,
        websockets.asyncio.client.connect(lobby.url) as b,
    ):
        token_a = await token_of(a, "wire_a")
        await token_of(b, "wire_b", capabilities=[{"name": "echo", "description": "x"}])
        await a.send(frame("wire_a", "CANCEL", {}, auth_token=token_a, conversation_id="none"))
        error = await reply(a)
        assert (error["message_type"], error["payload"]["code"]) == (
            "ERROR",
            "unknown_conversation",
        )
        await a.send(
            frame(
                "wire_a",
                "CANCEL",
                {},
                auth_token=token_a,
                receiver_id="wire_b",
                conversation_id="c",
            )
        )
        error = await reply(a)
        assert error["payload"]["code"] == "malformed"
        assert error["payload"]["error"] == "CANCEL is addressed to global_lobby"
        request = {"capability_name": "echo"}
        await a.send(
            frame(
                "wire_a",
                "REQUEST",
                request,
                auth_token=token_a,
                receiver_id="wire_b",
                conversation_id="c",
                message_id="m-1",
                timeout_ms=60_000,
            )
        )
        delivered = await reply(b)
        assert "timeout_ms" not in delivered
        assert isinstance(delivered["deadline"], int)
        await a.send(frame("wire_a", "CANCEL", {}, auth_token=token_a, conversation_id="c"))
        cancel = await reply(b)
        assert (cancel["message_type"], cancel["in_reply_to"]) == ("CANCEL", "m-1")
        assert cancel["payload"] == {"requester_id": "wire_a", "reason": "cancelled"}
        answer = await reply(a)
        assert (answer["sender_id"], answer["in_reply_to"]) == ("global_lobby", "m-1")
        assert answer["payload"]["code"] == "cancelled"
