"""A multi-turn conversation between agents on two lobby nodes: real `lobby serve --cluster`
processes on one real NATS server, agents talking raw WebSocket. Each node checks the waiting
state (the sender's before forwarding, the receiver's home again), as it checks the open
conversation (lobby/core/multiturn.py)."""

from __future__ import annotations

from pathlib import Path

from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_cluster_registry import agent
from tests.test_cluster_routing import send
from tests.test_durability import stop
from tests.wsclient import reply

ASK = {"status": "in_progress", "input_required": {"question": "Which size?"}}


async def test_turns_between_agents_on_two_nodes(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(b, "tailor", capabilities=[cap("order")]) as tailor,
                agent(a, "buyer") as buyer,
            ):
                await buyer.until_discovered({"tailor": ["order"]})
                await send(
                    buyer, "tailor", "REQUEST", {"capability_name": "order"}, conversation_id="c1"
                )
                assert (await reply(tailor.ws))["message_type"] == "REQUEST"
                # Not asked yet: refused on the buyer's node, nothing crosses.
                await send(buyer, "tailor", "INPUT", {"size": "M"}, conversation_id="c1")
                refused = await reply(buyer.ws)
                assert refused["payload"]["code"] == "invalid_dialogue"
                for size in ("M", "L"):
                    await send(tailor, "buyer", "RESPONSE", ASK, conversation_id="c1")
                    assert (await reply(buyer.ws))["payload"] == ASK
                    await send(buyer, "tailor", "INPUT", {"size": size}, conversation_id="c1")
                    given = await reply(tailor.ws)
                    assert (given["message_type"], given["payload"]) == ("INPUT", {"size": size})
                    assert given["sender_id"] == "buyer"
                done = {"status": "success", "size": "L"}
                await send(tailor, "buyer", "RESPONSE", done, conversation_id="c1")
                assert (await reply(buyer.ws))["payload"] == done
                await send(buyer, "tailor", "INPUT", {"size": "S"}, conversation_id="c1")
                assert (await reply(buyer.ws))["payload"]["code"] == "unknown_conversation"
        finally:
            stop(a)
            stop(b)
