"""CANCEL and deadlines for a provider on another node: real `lobby serve --cluster` processes
on one real `nats-server -js`, agents talking raw WebSocket (PROTOCOL.md §5.2)."""

from __future__ import annotations

from pathlib import Path

from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_cluster_registry import agent
from tests.test_cluster_routing import send
from tests.test_durability import stop
from tests.wsclient import reply


async def test_cancel_and_a_deadline_for_a_provider_on_another_node(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(b, "bob", capabilities=[cap("echo")], acks=False) as bob,
                agent(a, "alice", acks=False) as alice,
            ):
                await alice.until_discovered({"bob": ["echo"]})
                echo = {"capability_name": "echo"}
                await send(
                    alice, "bob", "REQUEST", echo, conversation_id="c1", message_id="m1",
                    timeout_ms=60_000,
                )  # fmt: skip
                request = await reply(bob.ws)
                assert isinstance(request["deadline"], int)
                await send(alice, "global_lobby", "CANCEL", {}, conversation_id="c1")
                answer = await reply(alice.ws)
                assert (answer["message_type"], answer["in_reply_to"]) == ("RESPONSE", "m1")
                assert answer["payload"]["code"] == "cancelled"
                cancel = await reply(bob.ws)
                assert (cancel["message_type"], cancel["in_reply_to"]) == ("CANCEL", "m1")
                assert cancel["payload"] == {"requester_id": "alice", "reason": "cancelled"}
                await send(bob, "alice", "RESPONSE", {"status": "success"}, conversation_id="c1")
                assert (await reply(bob.ws))["payload"]["code"] == "unknown_conversation"

                await send(
                    alice, "bob", "REQUEST", echo, conversation_id="c2", message_id="m2",
                    timeout_ms=300,
                )  # fmt: skip
                assert (await reply(bob.ws))["message_id"] == "m2"
                timeout = await reply(alice.ws)
                assert (timeout["in_reply_to"], timeout["payload"]["code"]) == ("m2", "timeout")
                cancel = await reply(bob.ws)
                assert (cancel["in_reply_to"], cancel["payload"]["reason"]) == ("m2", "deadline")
                # Once each: the next frames are the answers to what each asks now.
                assert await alice.discovered() == {"bob": ["echo"]}
                assert await bob.discovered() == {}  # alice offers nothing
        finally:
            stop(a)
            stop(b)
