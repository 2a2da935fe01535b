"""Messages between agents on different lobby nodes: real `lobby serve --cluster` processes on
one real `nats-server -js`, agents talking raw WebSocket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from lobby.store.jetstream import STREAM
from tests.conftest import LobbyProcess
from tests.natskit import NatsServer, connect, nats_server
from tests.routerkit import cap
from tests.test_cluster_liveness import paused
from tests.test_cluster_node import node
from tests.test_cluster_registry import Agent, agent, healthz
from tests.test_durability import stop
from tests.waiting import BOUND
from tests.wsclient import frame, reply


async def send(
    sender: Agent, receiver: str, message_type: str, payload: dict[str, Any], **extra: Any
) -> None:
    await sender.ws.send(
        frame(
            sender.agent_id,
            message_type,
            payload,
            receiver_id=receiver,
            auth_token=sender.token,
            **extra,
        )
    )


async def journaled_ids(nats: NatsServer, node_id: str) -> set[str]:
    """The message ids of every message stored in `node_id`'s journal on JetStream."""
    client = await connect(nats.url)
    try:
        js = client.jetstream()
        subscription = await js.subscribe(
            f"journal.{node_id}", stream=STREAM, ordered_consumer=True
        )
        ids: set[str] = set()
        pending = (await js.stream_info(STREAM, subjects_filter=f"journal.{node_id}")).state
        count = (pending.subjects or {}).get(f"journal.{node_id}", 0)
        for _ in range(count):
            message = await subscription.next_msg(timeout=5)
            for record in orjson.loads(message.data):
                if record[0] == 2:  # MESSAGE_STORED: [kind, row, receiver, seq, sender, id, ...]
                    ids.add(record[5])
        await subscription.unsubscribe()
        return ids
    finally:
        await client.close()


async def until_unconfirmed(proc: LobbyProcess, expected: int) -> None:
    """Until `proc` keeps `expected` forwarded messages not yet confirmed by their home."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while (health := await healthz(proc))["unconfirmed_forwards"] != expected:
        assert loop.time() < deadline, f"still {health}"
        await asyncio.sleep(0.05)


async def test_request_and_response_between_nodes_with_authorization(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            allowed = [cap("echo", ["alice"])]
            async with (
                agent(b, "bob", capabilities=allowed, acks=False) as bob,
                agent(a, "alice", acks=True) as alice,
                agent(a, "mallory") as mallory,
            ):
                await alice.until_discovered({"bob": ["echo"]})
                # Refused by authorization on the sender's node: the seed's error RESPONSE.
                await send(
                    mallory, "bob", "REQUEST", {"capability_name": "echo"}, conversation_id="m1"
                )
                denied = await reply(mallory.ws)
                assert denied["message_type"] == "RESPONSE"
                assert denied["payload"]["code"] == "unauthorized"
                # Allowed: delivered on b; ACCEPTED on a only once b committed it.
                await send(
                    alice,
                    "bob",
                    "REQUEST",
                    {"capability_name": "echo", "x": 1},
                    conversation_id="c1",
                    message_id="alice-1",
                )
                request = await reply(bob.ws)
                assert request["message_type"] == "REQUEST"
                assert request["sender_id"] == "alice"
                assert request["payload"]["x"] == 1
                assert request["seq"] == 1
                assert "auth_token" not in request
                accepted = await reply(alice.ws)
                assert accepted["message_type"] == "ACCEPTED"
                assert accepted["payload"]["message_id"] == "alice-1"
                assert "alice-1" in await journaled_ids(nats, "b")  # its home stored it
                assert "alice-1" not in await journaled_ids(nats, "a")
                # A resend is absorbed by the home's dedupe (and confirmed again).
                await send(
                    alice,
                    "bob",
                    "REQUEST",
                    {"capability_name": "echo", "x": 1},
                    conversation_id="c1",
                    message_id="alice-1",
                )
                assert (await reply(alice.ws))["message_type"] == "ACCEPTED"
                # The RESPONSE goes back across, checked against the open conversation.
                await send(
                    bob, "alice", "RESPONSE", {"status": "success", "y": 2}, conversation_id="c1"
                )
                response = await reply(alice.ws)
                assert response["message_type"] == "RESPONSE"
                assert response["payload"] == {"status": "success", "y": 2}
                assert response["sender_id"] == "bob"
                # That closed it: a second final RESPONSE is refused on bob's node.
                await send(bob, "alice", "RESPONSE", {"status": "success"}, conversation_id="c1")
                refused = await reply(bob.ws)
                assert refused["payload"]["code"] == "unknown_conversation"
                # TEXT crosses, stored by its home.
                await send(alice, "bob", "TEXT", {"content": "hi"}, message_id="alice-2")
                assert (await reply(bob.ws))["payload"] == {"content": "hi"}
                assert (await reply(alice.ws))["message_type"] == "ACCEPTED"
                # Each home said what it committed (`lobby.done`): nothing waits for a resend.
                for proc in (a, b):
                    await until_unconfirmed(proc, 0)
        finally:
            stop(a)
            stop(b)


async def test_a_message_sent_the_moment_its_receiver_registered_elsewhere_arrives(
    tmp_path: Path,
) -> None:
    """Each receiver registers on b and is sent a TEXT from a as soon as b acknowledged it,
    before a has necessarily watched its entry: a reads the entry itself, then routes. A
    receiver no node holds is still refused."""
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with agent(a, "alice", acks=True) as alice:
                for n in range(10):
                    async with agent(b, f"fresh{n}", acks=False) as fresh:
                        await send(
                            alice, fresh.agent_id, "TEXT", {"content": f"n{n}"}, message_id=f"m{n}"
                        )
                        accepted = await reply(alice.ws)
                        assert accepted["message_type"] == "ACCEPTED", accepted
                        text = await reply(fresh.ws)
                        assert (text["sender_id"], text["payload"]) == (
                            "alice",
                            {"content": f"n{n}"},
                        )
                await send(alice, "nobody", "TEXT", {"content": "hi"}, message_id="x")
                refused = await reply(alice.ws)
                assert refused["payload"]["code"] == "unknown_receiver"
                assert refused["in_reply_to"] == "x"
        finally:
            stop(a)
            stop(b)


async def test_an_accepted_never_covers_a_message_its_home_has_not_stored(tmp_path: Path) -> None:
    """alice, on b, sends m1 to bob (homed on a), then m2 to carol (on b) while a is paused
    (SIGSTOP): b commits m2, yet alice is told no ACCEPTED (that would cover m1) until a has
    stored m1; after SIGCONT she is told ACCEPTED m2, covering both."""
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(a, "bob", acks=False) as bob,
                agent(b, "carol", acks=False) as carol,
                agent(b, "dave", acks=True) as dave,
                agent(b, "alice", acks=True) as alice,
            ):
                await send(alice, "bob", "TEXT", {"content": "0"}, message_id="m0")
                assert (await reply(bob.ws))["payload"] == {"content": "0"}
                assert (await reply(alice.ws))["payload"] == {"message_id": "m0"}
                with paused(a):
                    await send(alice, "bob", "TEXT", {"content": "1"}, message_id="m1")
                    await send(alice, "carol", "TEXT", {"content": "2"}, message_id="m2")
                    assert (await reply(carol.ws))["payload"] == {"content": "2"}
                    # dave's message is journaled after m2: its ACCEPTED says b committed m2.
                    await send(dave, "carol", "TEXT", {"content": "3"}, message_id="d1")
                    assert (await reply(carol.ws))["payload"] == {"content": "3"}
                    assert (await reply(dave.ws))["payload"] == {"message_id": "d1"}
                    # Answered at once, after anything b wrote alice before: no ACCEPTED.
                    answer = await alice.ask("DISCOVER_SERVICES", {})
                    assert answer["message_type"] == "SERVICES_AVAILABLE", answer
                assert (await reply(bob.ws))["payload"] == {"content": "1"}
                accepted = await reply(alice.ws)
                assert (accepted["message_type"], accepted["payload"]) == (
                    "ACCEPTED",
                    {"message_id": "m2"},
                )
                await until_unconfirmed(b, 0)
        finally:
            stop(a)
            stop(b)


async def test_an_accepted_from_one_home_never_covers_a_message_another_has_not_stored(
    tmp_path: Path,
) -> None:
    """alice, on b, sends m1 to bob (homed on a, paused) then m2 to dave (homed on c): c
    stores m2, yet alice is told nothing until a has stored m1, then ACCEPTED m2."""
    async with nats_server(tmp_path) as nats:
        a, b, c = (node(tmp_path / n, nats, n) for n in "abc")
        try:
            async with (
                agent(a, "bob", acks=False) as bob,
                agent(c, "dave", acks=False) as dave,
                agent(b, "erin", acks=True) as erin,
                agent(b, "alice", acks=True) as alice,
            ):
                for receiver, ws in (("bob", bob.ws), ("dave", dave.ws)):
                    await send(alice, receiver, "TEXT", {"content": "0"}, message_id=receiver)
                    assert (await reply(ws))["payload"] == {"content": "0"}
                    assert (await reply(alice.ws))["payload"] == {"message_id": receiver}
                with paused(a):
                    await send(alice, "bob", "TEXT", {"content": "1"}, message_id="m1")
                    await send(alice, "dave", "TEXT", {"content": "2"}, message_id="m2")
                    assert (await reply(dave.ws))["payload"] == {"content": "2"}
                    # erin's message reaches c after m2: her ACCEPTED says c committed m2.
                    await send(erin, "dave", "TEXT", {"content": "3"}, message_id="e1")
                    assert (await reply(dave.ws))["payload"] == {"content": "3"}
                    assert (await reply(erin.ws))["payload"] == {"message_id": "e1"}
                    answer = await alice.ask("DISCOVER_SERVICES", {})
                    assert answer["message_type"] == "SERVICES_AVAILABLE", answer
                assert (await reply(bob.ws))["payload"] == {"content": "1"}
                assert (await reply(alice.ws))["payload"] == {"message_id": "m2"}
        finally:
            for proc in (a, b, c):
                stop(proc)
