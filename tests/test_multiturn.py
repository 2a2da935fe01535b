"""Multi-turn conversations against a real lobby on 127.0.0.1: a capability asks for input
(`ctx.ask`), the caller answers (`on_input=`, `converse()`), and the lobby forwards INPUT only
to a conversation waiting for it, holds it for an offline provider, and keeps the wait across
a restart (lobby/core/multiturn.py, agent_sdk/turns.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from agent_sdk import Agent, InputRequiredError, RemoteTimeoutError, RequestContext, capability
from lobby.server import LobbyServer
from tests.wsclient import Client, frame, reply, running, token_of

ASK = {"status": "in_progress", "input_required": {"question": "Which size?"}}
SHOP = [{"name": "order", "description": "takes an order", "input_schema": {}}]


class Tailor(Agent):
    """Asks for a size, then a colour, then answers with both."""

    @capability("order")
    async def order(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        size = await ctx.ask({"question": "Which size?", "choices": ["S", "M", "L"]})
        await ctx.progress({"stage": "cutting"})
        colour = await ctx.ask({"question": "Which colour?"})
        return {"item": request["item"], "size": size["size"], "colour": colour["colour"]}


async def test_several_turns_then_the_final_response(lobby: LobbyServer) -> None:
    asked: list[dict[str, Any]] = []
    progress: list[dict[str, Any]] = []

    async def answer(question: dict[str, Any]) -> dict[str, Any]:
        asked.append(question)
        return {"size": "M"} if question["question"] == "Which size?" else {"colour": "red"}

    async with Tailor("tailor", lobby_url=lobby.url), Agent("buyer", lobby_url=lobby.url) as me:
        result = await me.request(
            "tailor", "order", {"item": "shirt"}, on_input=answer, on_progress=progress.append
        )
        assert result == {"item": "shirt", "size": "M", "colour": "red"}
        assert [q["question"] for q in asked] == ["Which size?", "Which colour?"]
        assert [p.get("stage") for p in progress] == [None, "cutting", None]

        talk = await me.converse("tailor", "order", {"item": "coat"})
        updates = []
        async for update in talk:
            updates.append(update)
            if "input_required" in update:
                first = update["input_required"]["question"] == "Which size?"
                await talk.send_input({"size": "L"} if first else {"colour": "blue"})
        assert updates[-1] == {"item": "coat", "size": "L", "colour": "blue"}
        assert lobby.router.conversations == {}


async def test_a_call_that_cannot_answer_an_ask_raises_input_required(lobby: LobbyServer) -> None:
    async with Tailor("tailor", lobby_url=lobby.url), Agent("buyer", lobby_url=lobby.url) as me:
        with pytest.raises(InputRequiredError) as raised:
            await me.request("tailor", "order", {"item": "shirt"})
        assert raised.value.asked["question"] == "Which size?"


async def test_the_deadline_covers_every_turn(lobby: LobbyServer) -> None:
    async with Tailor("tailor", lobby_url=lobby.url), Agent("buyer", lobby_url=lobby.url) as me:
        talk = await me.converse("tailor", "order", {"item": "shirt"}, timeout=0.5)
        first = await anext(talk)
        assert first["input_required"]["question"] == "Which size?"
        await talk.send_input({"size": "M"})
        with pytest.raises(RemoteTimeoutError):  # the lobby's `timeout`, waiting for a colour
            async for _ in talk:
                pass
        assert lobby.router.conversations == {}


async def test_input_refusals(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as shop, connect(lobby.url) as buyer, connect(lobby.url) as eve:
        shop_token = await token_of(shop, "shop", capabilities=SHOP)
        buyer_token = await token_of(buyer, "buyer")
        eve_token = await token_of(eve, "eve")

        async def refused(ws: Client, sender: str, token: str, conversation: str) -> Any:
            await ws.send(
                frame(
                    sender,
                    "INPUT",
                    {"size": "M"},
                    receiver_id="shop",
                    conversation_id=conversation,
                    auth_token=token,
                )
            )
            error = await reply(ws)
            assert error["message_type"] == "ERROR"
            return error["payload"]["code"], error["payload"]["error"]

        assert await refused(buyer, "buyer", buyer_token, "c-1") == (
            "unknown_conversation",
            "no open REQUEST from 'buyer' to 'shop' in conversation 'c-1'",
        )
        request = {"capability_name": "order", "item": "shirt"}
        await buyer.send(
            frame(
                "buyer",
                "REQUEST",
                request,
                receiver_id="shop",
                conversation_id="c-1",
                auth_token=buyer_token,
            )
        )
        assert (await reply(shop))["message_type"] == "REQUEST"
        assert await refused(buyer, "buyer", buyer_token, "c-1") == (
            "invalid_dialogue",
            "'shop' has not asked for input in conversation 'c-1'",
        )
        await shop.send(
            frame(
                "shop",
                "RESPONSE",
                ASK,
                receiver_id="buyer",
                conversation_id="c-1",
                auth_token=shop_token,
            )
        )
        assert (await reply(buyer))["payload"] == ASK
        assert (await refused(eve, "eve", eve_token, "c-1"))[0] == "unknown_conversation"
        await buyer.send(
            frame(
                "buyer",
                "INPUT",
                {"size": "M"},
                receiver_id="shop",
                conversation_id="c-1",
                auth_token=buyer_token,
            )
        )
        given = await reply(shop)
        assert (given["message_type"], given["sender_id"], given["payload"]) == (
            "INPUT",
            "buyer",
            {"size": "M"},
        )


async def _ask_then_input(data: Path, *, restart: bool) -> None:
    """A REQUEST and its ask; the provider goes away (and the lobby restarts, if `restart`);
    the requester's INPUT is held and reaches the provider when it resumes."""
    async with running(data) as lobby, connect(lobby.url) as shop, connect(lobby.url) as buyer:
        shop_token = await token_of(shop, "shop", capabilities=SHOP, acks=True)
        buyer_token = await token_of(buyer, "buyer")
        request = {"capability_name": "order", "item": "shirt"}
        await buyer.send(
            frame(
                "buyer",
                "REQUEST",
                request,
                receiver_id="shop",
                conversation_id="c-1",
                auth_token=buyer_token,
            )
        )
        delivered = await reply(shop)
        await shop.send(frame("shop", "ACK", {"up_to": delivered["seq"]}, auth_token=shop_token))
        await shop.send(
            frame(
                "shop",
                "RESPONSE",
                ASK,
                receiver_id="buyer",
                conversation_id="c-1",
                auth_token=shop_token,
                message_id="ask-1",
            )
        )
        assert (await reply(buyer))["payload"] == ASK
        if not restart:
            await shop.close()
            await _input(buyer, buyer_token)
            await _resumed_shop_gets_the_input(lobby, shop_token)
            return
    async with running(data) as lobby:
        assert lobby.router.requests.turns.waiting == {("buyer", "shop", "c-1")}
        async with connect(lobby.url) as buyer:
            ack = await resume(buyer, "buyer", buyer_token)
            assert ack["payload"]["status"] == "success_resumed"
            await _input(buyer, buyer_token)
            await _resumed_shop_gets_the_input(lobby, shop_token)


async def resume(ws: Client, agent_id: str, token: str) -> dict[str, Any]:
    await ws.send(frame(agent_id, "REGISTER", {}, auth_token=token))
    return await reply(ws)


async def _input(buyer: Client, token: str) -> None:
    await buyer.send(
        frame(
            "buyer",
            "INPUT",
            {"size": "M"},
            receiver_id="shop",
            conversation_id="c-1",
            auth_token=token,
            message_id="input-1",
        )
    )


async def _resumed_shop_gets_the_input(lobby: LobbyServer, token: str) -> None:
    async with connect(lobby.url) as shop:
        ack = await resume(shop, "shop", token)
        assert ack["payload"]["status"] == "success_resumed"
        held = await reply(shop)
        assert (held["message_type"], held["message_id"], held["payload"]) == (
            "INPUT",
            "input-1",
            {"size": "M"},
        )


async def test_input_for_an_offline_provider_is_held_and_delivered_on_resume(
    tmp_path: Path,
) -> None:
    await _ask_then_input(tmp_path / "data", restart=False)


async def test_the_wait_survives_a_durable_lobby_restart(tmp_path: Path) -> None:
    await _ask_then_input(tmp_path / "data", restart=True)
