"""The sqlite store under the router, synchronously: what a restart rebuilds, and compaction."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import orjson

from lobby.core import Router
from lobby.core.limits import Limits
from lobby.core.records import DELIVERED
from lobby.store.sqlite import SqliteStore, stored_messages
from tests.routerkit import Clock, join, make_router, world


def commit(router: Router, store: SqliteStore) -> None:
    records = router.take_journal().records
    store.write(records)


def restarted(store: SqliteStore, clock: Clock) -> Router:
    router = make_router(clock)
    router.restore(store.load())
    return router


CAP = {"name": "c", "description": "", "input_schema": {}, "output_schema": {}}


def test_restore_rebuilds_agents_mailboxes_conversations_and_sequence(tmp_path: Path) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path)
    router = make_router(clock)
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[CAP], acks=True)
    for n in range(4):
        alice.to("bob", "REQUEST", {"capability_name": "c", "n": n}, conversation_id=f"k{n}")
    assert len(bob.take()) == 4
    bob.send("ACK", {"up_to": 2})
    commit(router, store)

    again = restarted(store, clock)
    record = again.registry.agents["bob"]
    assert [seq for seq, _ in record.mailbox] == [3, 4]
    assert record.next_seq == 4
    assert list(record.capabilities) == ["c"]
    assert sorted(k[2] for k in again.conversations) == ["k0", "k1", "k2", "k3"]


def test_compaction_forgets_only_what_is_acknowledged_and_old(tmp_path: Path) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path)
    router = make_router(clock, dedupe_horizon=60)
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[CAP], acks=True)
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="old")
    commit(router, store)
    bob.send("ACK", {"up_to": 1})
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="new")
    commit(router, store)

    clock.now += 120
    store.compact(router.compaction())
    rows = store._db.execute("SELECT count(*) FROM batches").fetchone()[0]
    assert rows == 1  # the acknowledged batch is gone, the unacknowledged one stays

    again = restarted(store, clock)
    assert [seq for seq, _ in again.registry.agents["bob"].mailbox] == [2]
    # Both conversations are still open: the checkpoint kept the one whose REQUEST was deleted.
    assert sorted(k[2] for k in again.conversations) == ["new", "old"]


def test_a_message_delivered_at_once_to_a_non_acknowledging_agent_is_stored_without_its_bytes(
    tmp_path: Path,
) -> None:
    """It was written to its connection, which counts as delivered for an agent that does not
    acknowledge: nothing will read its frame again. A held message keeps its frame."""
    clock = Clock()
    store = SqliteStore(tmp_path)
    router = make_router(clock)
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[CAP])
    carol = join(router, "carol", capabilities=[CAP])
    router.close(carol.session)
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k1")
    alice.to("carol", "REQUEST", {"capability_name": "c"}, conversation_id="k2")
    assert len(bob.take()) == 1
    commit(router, store)

    stored = {m.receiver: m for m in stored_messages(store._db)}
    assert stored["bob"].frame == DELIVERED
    assert orjson.loads(stored["carol"].frame)["conversation_id"] == "k2"
    again = restarted(store, clock)
    assert again.registry.agents["bob"].mailbox == deque()
    assert [seq for seq, _ in again.registry.agents["carol"].mailbox] == [1]
    # What the delivered REQUEST did survives: bob may still answer it.
    assert ("alice", "bob", "k1") in again.conversations


def test_open_requests_are_counted_again_after_a_restart(tmp_path: Path) -> None:
    limits = Limits(message_rate=0, registration_rate=0, max_open_requests=2)
    store = SqliteStore(tmp_path)
    router = Router(limits=limits, clock=Clock())
    alice = join(router, "alice")
    join(router, "bob", capabilities=[CAP])
    for n in range(2):
        alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id=f"k{n}")
    commit(router, store)

    again = Router(limits=limits, clock=Clock())
    again.restore(store.load())
    assert again.registry.agents["alice"].open_requests == 2


def test_open_dialogues_are_counted_again_after_a_restart(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    router = make_router(Clock())
    b = join(router, "b")
    join(router, "s")
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="1")
    commit(router, store)

    again = restarted(store, Clock())
    assert again.negotiations.started == {"b": 1}


def test_an_ended_dialogue_is_forgotten_after_the_dedupe_horizon(tmp_path: Path) -> None:
    """Until then its conversation_id cannot start another dialogue; then it is gone, from
    memory and from the store, so ended dialogues do not pile up forever."""
    clock = Clock()
    store = SqliteStore(tmp_path)
    router = make_router(clock, dedupe_horizon=100)
    b, s = join(router, "b"), join(router, "s")
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="1")
    s.to("b", "DECLINE", {}, conversation_id="d1", message_id="2", in_reply_to="1")
    clock.now += 50
    world.deliver(router.tick())
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="3")
    assert "rule: dialogue_over" in b.last()["payload"]["error"]
    commit(router, store)

    clock.now += 51
    world.deliver(router.tick())
    commit(router, store)
    assert "d1" not in router.negotiations.dialogues
    assert "d1" not in restarted(store, clock).negotiations.dialogues
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="4")
    assert s.take()[-1]["message_type"] == "CFP"
