"""Capability-addressed REQUESTs across two real `lobby serve --cluster` nodes on one real
`nats-server -js`, agents talking raw WebSocket: a requester on node a served by a provider
connected to node b, and failover from b back to a provider on a when b's provider drops."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_cluster_registry import Agent, agent
from tests.test_durability import stop
from tests.wsclient import frame, reply


async def next_of(who: Agent, message_type: str) -> dict[str, Any]:
    """The next message of `message_type` to `who` (ACCEPTED and the like passed over)."""
    while True:
        message = await reply(who.ws)
        if message["message_type"] == message_type:
            return message


async def call(requester: Agent, conversation_id: str, message_id: str) -> None:
    payload = {"capability_name": "quote", "arguments": {"item": "tea"}}
    await requester.ws.send(
        frame(
            requester.agent_id,
            "REQUEST",
            payload,
            conversation_id=conversation_id,
            message_id=message_id,
            auth_token=requester.token,
        )
    )


async def answer(provider: Agent, request: dict[str, Any], **result: Any) -> None:
    await provider.ws.send(
        frame(
            provider.agent_id,
            "RESPONSE",
            {"status": "success", **result},
            receiver_id=request["sender_id"],
            conversation_id=request["conversation_id"],
            auth_token=provider.token,
        )
    )


async def test_a_provider_on_another_node_serves_and_fails_over_back(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(b, "bob", capabilities=[cap("quote")]) as bob,
                agent(a, "alice", acks=True) as alice,
            ):
                await alice.until_discovered({"bob": ["quote"]})
                # Nobody on a offers it: the REQUEST goes to b, which gives it to bob.
                await call(alice, "c1", "m-1")
                request = await next_of(bob, "REQUEST")
                assert (request["sender_id"], request["message_id"]) == ("alice", "m-1")
                assert request["payload"] == {"capability_name": "quote", "item": "tea"}
                await answer(bob, request, price=3)
                response = await next_of(alice, "RESPONSE")
                assert (response["sender_id"], response["payload"]) == (
                    "bob",
                    {"status": "success", "price": 3},
                )
                # bob takes the next one and drops; nobody else on b: a's carol gets it.
                await call(alice, "c2", "m-2")
                assert (await next_of(bob, "REQUEST"))["message_id"] == "m-2"
                async with agent(a, "carol", capabilities=[cap("quote")]) as carol:
                    await bob.until_discovered({"carol": ["quote"]})
                    bob.ws.transport.abort()  # the connection is lost, not closed
                    again = await asyncio.wait_for(next_of(carol, "REQUEST"), 30)
                    assert (again["message_id"], again["sender_id"], again["redelivered"]) == (
                        "m-2",
                        "alice",
                        True,
                    )
                    await answer(carol, again, price=4)
                    response = await next_of(alice, "RESPONSE")
                    assert (response["sender_id"], response["conversation_id"]) == (
                        "carol",
                        "c2",
                    )
        finally:
            stop(a)
            stop(b)
