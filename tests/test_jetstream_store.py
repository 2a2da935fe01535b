"""The JetStream store under the router, against a real `nats-server -js`: what a restart
rebuilds, compaction (snapshot + purged journal), fencing of a second process claiming the same
node id, an unreachable NATS; and the journal's encoding, synchronously."""

from __future__ import annotations

from pathlib import Path

import nats.js.errors
import orjson
import pytest

from lobby.core import Router
from lobby.core.records import (
    DELIVERED,
    Acked,
    AgentSaved,
    Compaction,
    MessageStored,
    Record,
    StateSaved,
)
from lobby.store.base import StoreFenced, StoreUnavailable
from lobby.store.jetstream import STREAM, JetStreamStore, transient
from lobby.store.journal import Folded, decode_records, encode_records
from tests.natskit import connect, free_port, nats_server
from tests.routerkit import Clock, join, make_router
from tests.test_store import CAP


def commit(router: Router, store: JetStreamStore) -> None:
    store.write(router.take_journal().records)


def restarted(store: JetStreamStore, clock: Clock) -> Router:
    router = make_router(clock)
    router.restore(store.load())
    return router


async def journal_messages(url: str, node: str) -> int:
    client = await connect(url)
    try:
        info = await client.jetstream().stream_info(STREAM, subjects_filter=f"journal.{node}")
        return (info.state.subjects or {}).get(f"journal.{node}", 0)
    finally:
        await client.close()


async def test_a_restart_rebuilds_agents_mailboxes_conversations_and_state(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as server:
        clock = Clock()
        store = JetStreamStore([server.url], "n1")
        try:
            assert store.load().agents == []
            router = make_router(clock)
            alice = join(router, "alice")
            bob = join(router, "bob", capabilities=[CAP], acks=True)
            for n in range(4):
                alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id=f"k{n}")
                commit(router, store)  # one journal message per commit
            assert len(bob.take()) == 4
            bob.send("ACK", {"up_to": 2})
            alice.to("bob", "CFP", {"query": {}}, conversation_id="d1", message_id="m1")
            commit(router, store)
        finally:
            store.close()
        assert await journal_messages(server.url, "n1") == 5

        again = JetStreamStore([server.url], "n1")
        try:
            rebuilt = restarted(again, clock)
        finally:
            again.close()
        record = rebuilt.registry.agents["bob"]
        assert [seq for seq, _ in record.mailbox] == [3, 4, 5]
        assert list(record.capabilities) == ["c"]
        conversations = rebuilt.conversations
        assert sorted(k[2] for k in conversations) == ["k0", "k1", "k2", "k3"]
        assert "d1" in rebuilt.negotiations.dialogues


async def test_compaction_writes_a_snapshot_and_purges_the_journal_up_to_it(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as server:
        clock = Clock()
        store = JetStreamStore([server.url], "n1")
        try:
            router = make_router(clock, dedupe_horizon=60)
            restored = store.load()
            router.restore(restored)
            alice = join(router, "alice")
            bob = join(router, "bob", capabilities=[CAP], acks=True)
            alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="old")
            commit(router, store)
            bob.send("ACK", {"up_to": 1})
            alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="new")
            commit(router, store)
            clock.now += 120
            store.compact(router.compaction())
            assert await journal_messages(server.url, "n1") == 0
            # Written after the snapshot: replayed on top of it.
            alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="later")
            commit(router, store)
            store.compact(router.compaction())  # a second snapshot replaces the first
            alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="last")
            commit(router, store)
        finally:
            store.close()
        assert await journal_messages(server.url, "n1") == 1

        again = JetStreamStore([server.url], "n1")
        try:
            assert len(await_snapshots(again)) == 1
            rebuilt = restarted(again, clock)
        finally:
            again.close()
        bob_record = rebuilt.registry.agents["bob"]
        assert [seq for seq, _ in bob_record.mailbox] == [2, 3, 4]
        assert bob_record.acked_seq == 1
        conversations = rebuilt.conversations
        assert sorted(k[2] for k in conversations) == ["last", "later", "new", "old"]
        assert rebuilt.registry.agents["alice"].open_requests == 4


def await_snapshots(store: JetStreamStore) -> list[tuple[int, str]]:
    return store._call(store._snapshots(), 10)


async def test_a_second_process_claiming_the_node_id_fences_the_first(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as server:
        clock = Clock()
        first = JetStreamStore([server.url], "n1")
        try:
            router = make_router(clock)
            router.restore(first.load())
            join(router, "alice")
            commit(router, first)
            second = JetStreamStore([server.url], "n1")
            try:
                join(router, "bob")
                with pytest.raises(StoreFenced):
                    commit(router, first)
                assert "another process claimed node id 'n1'" in (first.unwritable() or "")
                with pytest.raises(StoreFenced):  # and every write after it
                    commit(router, first)
                # The second sees what the first wrote before it was fenced, nothing after.
                assert [a.agent_id for a in second.load().agents] == ["alice"]
                assert second.unwritable() is None
                second.write([AgentSaved("carol", b"\0" * 32, b"[]", False)])
            finally:
                second.close()
        finally:
            first.close()


async def test_an_unreachable_nats_is_one_clear_failure(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(StoreUnavailable) as failed:
        JetStreamStore([url], "n1", connect_timeout=0.5)
    assert str(failed.value) == f"cannot reach NATS at {url}: no server answered"


def test_a_commit_larger_than_max_payload_is_split_and_reads_back_in_order() -> None:
    frame = orjson.dumps({"payload": "x" * 300})
    records: list[Record] = [
        MessageStored(n, "bob", n, "alice", f"m{n}", None, 0, frame, 1.0) for n in range(1, 9)
    ]
    messages = encode_records([*records, Acked("bob", 3)], 1000)
    assert len(messages) > 1
    assert all(len(message) <= 1000 for message in messages)
    decoded = [record for message in messages for record in decode_records(message)]
    assert decoded == [*records, Acked("bob", 3)]
    with pytest.raises(ValueError, match="exceeds NATS's max_payload"):
        encode_records(records, 200)


def test_a_snapshot_reads_back_the_state_and_forgets_acknowledged_frames() -> None:
    folded = Folded()
    frame = orjson.dumps({"n": 1})
    folded.apply(
        [
            AgentSaved("bob", b"\1" * 32, b'[{"name":"c"}]', True),
            MessageStored(1, "bob", 1, "alice", "m1", "k", 1, frame, 1.0),
            MessageStored(2, "bob", 2, "alice", "m2", "k", 1, frame, 1.0),
            Acked("bob", 1),
            StateSaved("dialogue", "d1", b'{"a":1}'),
        ]
    )
    compaction = Compaction(
        conversations={("alice", "bob", "k"): 2}, upto_row=2, acked={"bob": 1}, forget_before=0.0
    )
    folded.compact(compaction, keep_done=10)
    again = Folded.decode(folded.encode())
    snapshot = again.snapshot()
    assert [m.frame for m in snapshot.messages] == [DELIVERED, frame]
    assert snapshot.acked == {"bob": 1}
    assert snapshot.state == {"dialogue": [b'{"a":1}']}
    assert snapshot.conversations == {("alice", "bob", "k"): 2}
    assert snapshot.agents == [AgentSaved("bob", b"\1" * 32, b'[{"name":"c"}]', True)]
    again.apply([MessageStored(2, "bob", 2, "alice", "m2", "k", 1, frame, 1.0)])  # a replay
    assert len(again.messages) == 2


def test_a_snapshot_keeps_no_more_acknowledged_messages_than_the_core_remembers() -> None:
    folded = Folded()
    frame = orjson.dumps({"n": 1})
    folded.apply(
        [MessageStored(n, "bob", n, "alice", f"m{n}", None, 0, frame, 1.0) for n in range(1, 6)]
    )
    compaction = Compaction(conversations={}, upto_row=4, acked={"bob": 3}, forget_before=0.0)
    folded.compact(compaction, keep_done=2)
    # 1-3 acknowledged: the newest two kept (without bytes); 4 and 5 held for bob.
    assert [(m.seq, m.frame) for m in folded.messages] == [
        (2, DELIVERED),
        (3, DELIVERED),
        (4, frame),
        (5, frame),
    ]


def test_a_publish_refused_for_a_while_is_retried_and_one_refused_for_good_is_not() -> None:
    """Within the write deadline a commit retries what JetStream refuses while it stalls or
    elects a leader; a bad request or a missing stream fails it at once."""
    assert transient(nats.js.errors.ServiceUnavailableError(code=503, description="x"))
    assert transient(nats.js.errors.ServerError(code=500, description="x"))
    assert transient(nats.js.errors.APIError())  # no code at all: seen during a NATS stall
    assert not transient(nats.js.errors.BadRequestError(code=400, description="x"))
    assert not transient(nats.js.errors.NotFoundError(code=404, description="x"))
    assert not transient(nats.js.errors.APIError(code=409, err_code=10071, description="x"))
