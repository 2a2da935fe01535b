"""An agent that is not ours: raw JSON over a different WebSocket library (websocket-client,
synchronous), written from PROTOCOL.md alone, does the whole seed flow against `lobby serve`,
and calls a capability served by an SDK agent."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import websocket

from agent_sdk import Agent, RequestContext, capability
from tests.conftest import LobbyProcess

FIND = "find_cheapest_item_price_v2"
UNAUTHORIZED = (
    "Unauthorized: Agent 'rogue_007' is not authorized to call capability "
    "'find_cheapest_item_price_v2' on agent 'price_hunter_A2_v2'."
)


class RawAgent:
    def __init__(self, url: str, agent_id: str, capabilities: list[dict[str, Any]]) -> None:
        self.agent_id = agent_id
        self.ws = websocket.create_connection(url, timeout=5)
        self.token: str | None = None
        ack = self.exchange("global_lobby", "REGISTER", {"capabilities": capabilities})
        assert ack["message_type"] == "REGISTER_ACK"
        assert ack["payload"]["status"] == "success_registered_finalized"
        assert ack["payload"]["lobby_id"] == "global_lobby"
        self.token = ack["payload"]["auth_token"]

    def send(self, receiver: str, kind: str, payload: dict[str, Any], **extra: Any) -> None:
        message = {
            "sender_id": self.agent_id,
            "receiver_id": receiver,
            "message_type": kind,
            "payload": payload,
            "auth_token": self.token,
            **extra,
        }
        self.ws.send(orjson.dumps(message).decode())

    def recv(self) -> dict[str, Any]:
        message: dict[str, Any] = orjson.loads(self.ws.recv())
        return message

    def exchange(self, receiver: str, kind: str, payload: dict[str, Any], **extra: Any) -> Any:
        self.send(receiver, kind, payload, **extra)
        return self.recv()


def capability_json(name: str, authorized: list[str] | None) -> dict[str, Any]:
    return {
        "name": name,
        "description": "Finds the cheapest price for an item.",
        "input_schema": {"type": "object", "properties": {"item_name": {"type": "string"}}},
        "output_schema": {"type": "object"},
        "keywords": ["price", "shopping"],
        "authorized_requester_ids": authorized,
    }


def test_the_seed_flow_with_another_websocket_library(lobby_process: LobbyProcess) -> None:
    url = lobby_process.url
    hunter = RawAgent(url, "price_hunter_A2_v2", [capability_json(FIND, ["item_search_agent"])])
    searcher = RawAgent(url, "item_search_agent", [])
    rogue = RawAgent(url, "rogue_007", [])

    found = searcher.exchange("global_lobby", "DISCOVER_SERVICES", {"capability_name": FIND})
    assert found["message_type"] == "SERVICES_AVAILABLE"
    assert found["payload"]["discovered_for_capability"] == FIND
    (service,) = found["payload"]["services_found"]
    assert service["agent_id"] == "price_hunter_A2_v2"
    assert service["relevant_capabilities"][0]["name"] == FIND

    searcher.send(
        "price_hunter_A2_v2",
        "REQUEST",
        {"capability_name": FIND, "item_name": "Bose QuietComfort"},
        conversation_id="conv-1",
    )
    request = hunter.recv()
    assert request["sender_id"] == "item_search_agent"
    assert request["payload"]["item_name"] == "Bose QuietComfort"
    assert "auth_token" not in request
    hunter.send(
        "item_search_agent",
        "RESPONSE",
        {"status": "success", "cheapest_price": 108.8},
        conversation_id="conv-1",
    )
    response = searcher.recv()
    assert response["conversation_id"] == "conv-1"
    assert response["payload"] == {"status": "success", "cheapest_price": 108.8}

    refused = rogue.exchange(
        "price_hunter_A2_v2", "REQUEST", {"capability_name": FIND}, conversation_id="conv-2"
    )
    assert refused["message_type"] == "RESPONSE"
    assert refused["conversation_id"] == "conv-2"
    assert refused["payload"] == {"status": "error", "code": "unauthorized", "error": UNAUTHORIZED}

    bad = rogue.exchange("global_lobby", "DISCOVER_SERVICES", {}, auth_token="stolen?")
    assert bad["message_type"] == "ERROR"
    assert bad["payload"]["code"] == "auth_failed"
    for agent in (hunter, searcher, rogue):
        agent.ws.close()


class Doubler(Agent):
    agent_id = "doubler"

    @capability("double", description="Doubles n.")
    async def double(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"n": request["n"] * 2}


def test_a_raw_client_calls_an_sdk_agent(lobby_process: LobbyProcess) -> None:
    ready, done = threading.Event(), threading.Event()

    async def serve() -> None:
        async with Doubler(lobby_url=lobby_process.url):
            ready.set()
            await asyncio.to_thread(done.wait, 20)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(10)
        raw = RawAgent(lobby_process.url, "raw_caller", [])
        answer = raw.exchange(
            "doubler", "REQUEST", {"capability_name": "double", "n": 21}, conversation_id="c"
        )
        assert answer["payload"] == {"n": 42, "status": "success"}
        raw.ws.close()
    finally:
        done.set()
        thread.join(10)
