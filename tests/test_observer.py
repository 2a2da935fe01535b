"""The observer stream (`observe` on /admin) and the conversation viewer's rings: over real
sockets on each socket transport, and the rings' bounds synchronously."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from lobby.observer import KEYS, Rings, redact, summarize
from lobby.server import LobbyServer
from tests.test_admin import admin_token, closed_with, command
from tests.wsclient import frame, reply, running, token_of


def browser_url(lobby: LobbyServer) -> str:
    return f"ws://127.0.0.1:{lobby.port}/admin?auth=message"


async def event(ws: ClientConnection, name: str, **fields: Any) -> dict[str, Any]:
    """The next event called `name` whose message has `fields` (others are skipped)."""
    while True:
        data: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
        if data.get("event") != name:
            continue
        message = data.get("message", {})
        if all(message.get(k) == v for k, v in fields.items()):
            return data


async def test_a_browser_connection_needs_the_token_first(lobby: LobbyServer) -> None:
    token = admin_token(Path(lobby.settings.data_dir))
    with pytest.raises(InvalidStatus) as refused:  # without the query, the header is needed
        async with connect(f"ws://127.0.0.1:{lobby.port}/admin"):
            pass
    assert refused.value.response.status_code == 401
    async with connect(browser_url(lobby)) as ws:
        answer = await command(ws, command="observe", id=1)
        assert (answer["ok"], answer["code"], answer["id"]) == (False, "auth_failed", 1)
        assert await closed_with(ws) == 1008
    async with connect(browser_url(lobby)) as ws:
        answer = await command(ws, command="auth", token=token + "x")
        assert answer["code"] == "auth_failed"
        assert token not in orjson.dumps(answer).decode()
        assert await closed_with(ws) == 1008
    async with connect(browser_url(lobby)) as ws:
        assert (await command(ws, command="auth", token=token, id="a"))["ok"] is True
        answer = await command(ws, command="conversation")
        assert (answer["ok"], answer["code"]) == (False, "malformed")
        assert "observe" in (await command(ws, command="nosuch"))["error"]


async def test_observe_sends_a_snapshot_then_events(lobby: LobbyServer) -> None:
    admin = admin_token(Path(lobby.settings.data_dir))
    cap = {"name": "price", "description": "", "input_schema": {}, "output_schema": {}}
    async with connect(lobby.url) as seller, connect(browser_url(lobby)) as observer:
        seller_token = await token_of(seller, "seller", capabilities=[cap])
        assert (await command(observer, command="auth", token=admin))["ok"] is True
        snapshot = await command(observer, command="observe", id=2)
        assert (snapshot["ok"], snapshot["event"], snapshot["id"]) == (True, "snapshot", 2)
        assert snapshot["agents"] == [
            {"agent_id": "seller", "online": True, "capabilities": ["price"]}
        ]
        async with connect(lobby.url) as buyer:
            buyer_token = await token_of(buyer, "buyer")
            registered = await event(observer, "message", message_type="REGISTER")
            assert "payload" not in registered["message"]  # REGISTER payloads are not shown
            secret = {"content": "hi", "card": {"card_number": "4111-1111", "note": "n"}}
            await buyer.send(
                frame(
                    "buyer",
                    "TEXT",
                    secret,
                    receiver_id="seller",
                    conversation_id="conv-1",
                    auth_token=buyer_token,
                )
            )
            text = (await event(observer, "message", message_type="TEXT"))["message"]
            assert (text["sender_id"], text["receiver_id"]) == ("buyer", "seller")
            assert text["conversation_id"] == "conv-1"
            assert orjson.loads(text["payload"]) == {
                "content": "hi",
                "card": {"card_number": "[secret]", "note": "n"},
            }
            request = frame(
                "buyer",
                "REQUEST",
                {"capability_name": "nosuch"},
                receiver_id="seller",
                conversation_id="conv-1",
                auth_token=buyer_token,
            )
            await buyer.send(request)
            await reply(buyer)
            refused = (await event(observer, "message", message_type="REQUEST"))["message"]
            assert refused["refused"]["code"] == "capability_not_found"
            state = await event(observer, "state")
            assert {a["agent_id"] for a in state["agents"]} == {"seller", "buyer"}
            assert state["routed"] >= 1
            assert state["refused"] >= 1
        viewed = await command(observer, command="conversation", key="conv-1")
        assert [m["message_type"] for m in viewed["messages"]] == ["TEXT", "REQUEST"]
        assert viewed["messages"][1]["refused"]["code"] == "capability_not_found"
        unknown = await command(observer, command="conversation", key="nosuch")
        assert (unknown["ok"], unknown["messages"]) == (True, [])
        seen = orjson.dumps([snapshot, viewed]).decode()
        for token in (admin, seller_token, buyer_token):
            assert token not in seen
    assert not lobby.observers.sessions  # the closed observer is forgotten


def test_a_ring_keeps_the_newest_per_id_and_the_most_recent_ids() -> None:
    rings = Rings(per_key=3, keys=2)
    for n in range(5):
        rings.add({"conversation_id": "a", "n": n})
    assert [s["n"] for s in rings.find("a")] == [2, 3, 4]
    rings.add({"conversation_id": "b", "n": 5})
    rings.add({"conversation_id": "a", "n": 6})  # a is used again: b is now the oldest
    rings.add({"conversation_id": "c", "n": 7})
    assert len(rings) == 2
    assert rings.find("b") == []
    assert [s["n"] for s in rings.find("a")] == [3, 4, 6]
    assert rings.find("c") == [{"conversation_id": "c", "n": 7}]


def test_a_summary_is_found_by_its_trace_id_and_keeps_no_secret() -> None:
    envelope = {
        "sender_id": "a",
        "receiver_id": "b",
        "message_type": "PAYMENT",
        "conversation_id": "c1",
        "auth_token": "tok-123",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "payload": {"amount": "3", "items": [{"Password": "p", "x": 1}], "token": "t"},
    }
    summary = summarize(envelope, 1.0)
    assert summary["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert set(KEYS) <= summary.keys()
    assert "tok-123" not in orjson.dumps(summary).decode()
    assert orjson.loads(summary["payload"]) == redact(envelope["payload"])
    assert redact(envelope["payload"]) == {
        "amount": "3",
        "items": [{"Password": "[secret]", "x": 1}],
        "token": "[secret]",
    }
    rings = Rings()
    rings.add(summary)
    assert rings.find("4bf92f3577b34da6a3ce929d0e0e4736") == rings.find("c1") == [summary]
    long = summarize({"message_type": "TEXT", "payload": {"content": "x" * 1000}}, 1.0)
    assert len(long["payload"]) == 300
    deep: Any = "end"
    for _ in range(5000):
        deep = {"a": [deep]}
    clipped = redact(deep)
    for _ in range(16):
        clipped = clipped["a"][0]
    assert clipped == "[...]"


async def test_a_browser_connection_without_the_token_in_time_is_closed(tmp_path: Path) -> None:
    async with running(tmp_path / "data", handshake_timeout=0.2) as lobby:
        async with connect(browser_url(lobby)) as ws:
            assert await closed_with(ws) == 1008
            assert ws.close_reason == "no admin token in time"
        token = admin_token(tmp_path / "data")
        async with connect(browser_url(lobby)) as ws:
            assert (await command(ws, command="auth", token=token))["ok"] is True
            await asyncio.sleep(0.4)  # past the handshake timeout: an operator stays
            assert (await command(ws, command="observe"))["event"] == "snapshot"
