"""Capability-addressed REQUESTs served on another cluster node, where §5.1 meets §5.2, §5.3
and §4.1: the requester's CANCEL, a deadline and an INPUT reach the provider's node, and a
REQUEST goes to a node whose provider is online. Real `lobby serve --cluster` processes on
one real `nats-server -js`, agents talking raw WebSocket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_addressed_cluster import next_of
from tests.test_cluster_node import node
from tests.test_cluster_registry import WAIT, Agent, agent
from tests.test_cluster_routing import send
from tests.test_durability import stop
from tests.wsclient import reply

ASK = {"status": "in_progress", "input_required": {"question": "Which size?"}}


async def call(requester: Agent, conversation_id: str, message_id: str, **extra: Any) -> None:
    payload = {"capability_name": "quote", "arguments": {"item": "tea"}}
    await send(
        requester,
        "global_lobby",
        "REQUEST",
        payload,
        conversation_id=conversation_id,
        message_id=message_id,
        **extra,
    )


async def test_cancel_deadline_and_input_of_a_request_served_on_another_node(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(b, "bob", capabilities=[cap("quote")], acks=False) as bob,
                agent(a, "alice", acks=False) as alice,
            ):
                await alice.until_discovered({"bob": ["quote"]})
                # CANCEL on the requester's node: answered there, the provider told on its own.
                await call(alice, "c1", "m1", timeout_ms=60_000)
                assert (await next_of(bob, "REQUEST"))["message_id"] == "m1"
                await send(alice, "global_lobby", "CANCEL", {}, conversation_id="c1")
                answer = await next_of(alice, "RESPONSE")
                assert (answer["sender_id"], answer["in_reply_to"]) == ("global_lobby", "m1")
                assert answer["payload"]["code"] == "cancelled"
                cancel = await next_of(bob, "CANCEL")
                assert (cancel["in_reply_to"], cancel["payload"]) == (
                    "m1",
                    {"requester_id": "alice", "reason": "cancelled"},
                )
                await send(bob, "alice", "RESPONSE", {"status": "success"}, conversation_id="c1")
                assert (await reply(bob.ws))["payload"]["code"] == "unknown_conversation"

                # A deadline: the requester hears `timeout`, the provider CANCEL.
                await call(alice, "c2", "m2", timeout_ms=300)
                assert (await next_of(bob, "REQUEST"))["message_id"] == "m2"
                timeout = await next_of(alice, "RESPONSE")
                assert (timeout["in_reply_to"], timeout["payload"]["code"]) == ("m2", "timeout")
                cancel = await next_of(bob, "CANCEL")
                assert (cancel["in_reply_to"], cancel["payload"]["reason"]) == ("m2", "deadline")

                # The provider asks; the requester's INPUT goes to it, turn after turn.
                await call(alice, "c3", "m3", timeout_ms=60_000)
                assert (await next_of(bob, "REQUEST"))["message_id"] == "m3"
                for size in ("M", "L"):
                    await send(bob, "alice", "RESPONSE", ASK, conversation_id="c3")
                    asked = await next_of(alice, "RESPONSE")
                    assert (asked["sender_id"], asked["payload"]) == ("bob", ASK)
                    await send(alice, "bob", "INPUT", {"size": size}, conversation_id="c3")
                    given = await next_of(bob, "INPUT")
                    assert (given["sender_id"], given["payload"]) == ("alice", {"size": size})
                # Not asked again: refused on the provider's node, back to the requester.
                await send(alice, "bob", "INPUT", {"size": "S"}, conversation_id="c3")
                refused = await next_of(alice, "ERROR")
                assert refused["payload"]["code"] == "invalid_dialogue"
                done = {"status": "success", "size": "L"}
                await send(bob, "alice", "RESPONSE", done, conversation_id="c3")
                assert (await next_of(alice, "RESPONSE"))["payload"] == done
                # Answered: nothing is left open on the requester's node to cancel or expire.
                await send(alice, "global_lobby", "CANCEL", {}, conversation_id="c3")
                assert (await next_of(alice, "ERROR"))["payload"]["code"] == (
                    "unknown_conversation"
                )
                await send(alice, "bob", "INPUT", {"size": "S"}, conversation_id="c3")
                assert (await next_of(alice, "ERROR"))["payload"]["code"] == (
                    "unknown_conversation"
                )
        finally:
            stop(a)
            stop(b)


async def until_online(watcher: Agent, expected: dict[str, bool]) -> None:
    """Watch `expected`'s agents from `watcher`'s node until each is online (or not) as given."""
    await send(
        watcher, "global_lobby", "WATCH", {"agent_ids": sorted(expected)}, conversation_id="w"
    )
    seen: dict[str, bool] = {}
    async with asyncio.timeout(WAIT):
        while seen != expected:
            message = await reply(watcher.ws)
            payload = message["payload"]
            if message["message_type"] == "PRESENCE" and "online" in payload:
                seen[payload["agent_id"]] = payload["online"]


async def test_a_request_goes_to_the_node_of_a_provider_online(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        nodes = [node(tmp_path / n, nats, n) for n in ("a", "b", "c")]
        a, b, c = nodes
        try:
            async with agent(b, "early", capabilities=[cap("quote")]):
                pass  # registered on b, then offline: first in turn, but nobody to serve there
            async with (
                agent(c, "late", capabilities=[cap("quote")], acks=False) as late,
                agent(a, "alice", acks=False) as alice,
            ):
                await alice.until_discovered({"early": ["quote"], "late": ["quote"]})
                await until_online(alice, {"early": False, "late": True})
                await call(alice, "c1", "m1")
                request = await next_of(late, "REQUEST")
                assert (request["sender_id"], request["message_id"]) == ("alice", "m1")
                await send(late, "alice", "RESPONSE", {"status": "success"}, conversation_id="c1")
                answer = await next_of(alice, "RESPONSE")
                assert (answer["sender_id"], answer["payload"]) == ("late", {"status": "success"})
        finally:
            for proc in nodes:
                stop(proc)
