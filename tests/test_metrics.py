"""GET /metrics (Prometheus text, read back with prometheus_client's own parser) and GET
/readyz, over real sockets on each socket transport, after real traffic."""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from lobby.core.counters import Buckets
from lobby.server import LobbyServer
from lobby.store.sqlite import FILE_NAME
from tests.wsclient import frame, reply, token_of

CAP = {"name": "price", "description": "", "input_schema": {}, "output_schema": {}}


async def http_get(url: str) -> tuple[int, str, bytes]:
    def get() -> tuple[int, str, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers["Content-Type"], error.read()

    return await asyncio.to_thread(get)


async def scrape(lobby: LobbyServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by (name, sorted labels)."""
    status, content_type, body = await http_get(f"http://127.0.0.1:{lobby.port}/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


async def test_metrics_count_what_was_routed_and_refused(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as seller, connect(lobby.url) as buyer:
        seller_token = await token_of(seller, "seller", capabilities=[CAP])
        buyer_token = await token_of(buyer, "buyer")
        for n in range(3):
            request = {"capability_name": "price", "n": n}
            await buyer.send(
                frame(
                    "buyer",
                    "REQUEST",
                    request,
                    receiver_id="seller",
                    conversation_id=f"c{n}",
                    auth_token=buyer_token,
                )
            )
            assert (await reply(seller))["payload"] == request
        for n in range(2):  # one conversation stays open
            await seller.send(
                frame(
                    "seller",
                    "RESPONSE",
                    {"status": "success"},
                    receiver_id="buyer",
                    conversation_id=f"c{n}",
                    auth_token=seller_token,
                )
            )
            assert (await reply(buyer))["message_type"] == "RESPONSE"
        await buyer.send("not json")
        assert (await reply(buyer))["payload"]["code"] == "malformed"
        await buyer.send(
            frame("buyer", "TEXT", {"content": "hi"}, receiver_id="nobody", auth_token=buyer_token)
        )
        assert (await reply(buyer))["payload"]["code"] == "unknown_receiver"
        await buyer.send(frame("buyer", "DISCOVER_SERVICES", {}, auth_token="wrong"))
        assert (await reply(buyer))["payload"]["code"] == "auth_failed"
        await lobby.committer.flush()

        metrics = await scrape(lobby)

    def routed(message_type: str) -> float:
        return metrics[("lobby_messages_routed_total", (("message_type", message_type),))]

    def refused(code: str) -> float:
        return metrics[("lobby_refusals_total", (("code", code),))]

    assert (routed("REQUEST"), routed("RESPONSE"), routed("TEXT")) == (3, 2, 0)
    assert (refused("malformed"), refused("unknown_receiver"), refused("auth_failed")) == (1, 1, 1)
    assert refused("mailbox_full") == 0
    assert metrics[("lobby_connections", ())] == 2
    assert metrics[("lobby_agents_registered", ())] == 2
    assert metrics[("lobby_agents_online", ())] == 2
    assert metrics[("lobby_conversations_open", ())] == 1
    assert metrics[("lobby_dialogues_open", ())] == 0
    # Non-acknowledging agents hold nothing once a message is written to them.
    assert metrics[("lobby_mailbox_messages", ())] == 0
    # Every read that routed something is one observation: at least one per message sent.
    batches = metrics[("lobby_routing_batch_seconds_count", ())]
    assert batches >= 8
    assert metrics[("lobby_routing_batch_seconds_bucket", (("le", "+Inf"),))] == batches
    commits = metrics[("lobby_store_commit_seconds_count", ())]
    assert commits >= 1
    assert metrics[("lobby_store_commit_records_count", ())] == commits
    # 2 agents + 5 messages + acknowledgements: every record is in some commit.
    assert metrics[("lobby_store_commit_records_sum", ())] >= 7
    wal = Path(lobby.settings.data_dir) / f"{FILE_NAME}-wal"
    assert metrics[("lobby_store_wal_bytes", ())] == os.stat(wal).st_size


async def test_metrics_show_held_messages_and_the_ledger(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as receiver:
        await token_of(receiver, "receiver", acks=True)
        async with connect(lobby.url) as sender:
            sender_token = await token_of(sender, "sender")
            for _ in range(4):
                text = frame(
                    "sender",
                    "TEXT",
                    {"content": "hi"},
                    receiver_id="receiver",
                    auth_token=sender_token,
                )
                await sender.send(text)
            for _ in range(4):
                assert (await reply(receiver))["message_type"] == "TEXT"
            metrics = await scrape(lobby)
    assert metrics[("lobby_messages_routed_total", (("message_type", "TEXT"),))] == 4
    # An acknowledging agent holds them until it ACKs.
    assert metrics[("lobby_mailbox_messages", ())] == 4
    assert metrics[("lobby_mailbox_largest_messages", ())] == 4


async def test_readyz_is_ready_while_listening_with_a_writable_store(
    lobby: LobbyServer,
) -> None:
    url = f"http://127.0.0.1:{lobby.port}/readyz"
    status, content_type, body = await http_get(url)
    assert (status, content_type, orjson.loads(body)) == (
        200,
        "application/json",
        {"status": "ready"},
    )
    store = Path(lobby.settings.data_dir) / FILE_NAME
    moved = store.with_name("moved-away")
    store.rename(moved)  # writes would go to a file no restart will find
    try:
        status, _, body = await http_get(url)
    finally:
        moved.rename(store)
    answer: dict[str, Any] = orjson.loads(body)
    assert status == 503
    assert answer["status"] == "not_ready"
    assert "was deleted or replaced" in answer["reason"]
    assert (await http_get(url))[0] == 200


def test_buckets_count_each_value_in_the_first_bound_at_or_above_it() -> None:
    buckets = Buckets((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 3.0):
        buckets.observe(value)
    assert buckets.cumulative() == [("1.0", 2), ("2.0", 3), ("+Inf", 4)]
    assert buckets.total == 6.0
