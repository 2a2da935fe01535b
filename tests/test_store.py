"""The sqlite store under the router, synchronously: what a restart rebuilds, and compaction."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import orjson

from lobby.core import Router
from lobby.store.base import DELIVERED, MessageStored, Record
from lobby.store.sqlite import SqliteStore, stored_messages
from tests.routerkit import Clock, join, make_router


def commit(router: Router, store: SqliteStore) -> None:
    records, _ = router.delivery.take_journal()
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


def _batch(first_row: int, count: int) -> list[Record]:
    frame = orjson.dumps({"payload": "x" * 500})
    return [
        MessageStored(row, "bob", row, "alice", f"m{row}", None, 0, frame, 1.0)
        for row in range(first_row, first_row + count)
    ]


def test_commits_leave_checkpoints_to_checkpoint_which_runs_beside_them(tmp_path: Path) -> None:
    """No commit copies the WAL into the database file (SQLite's automatic checkpoint is off:
    it would stall the commit that trips it); `checkpoint()` does, from its own connection,
    while commits go on in another thread."""
    store = SqliteStore(tmp_path)
    database = tmp_path / "lobby.sqlite3"
    for n in range(200):  # more than SQLite's automatic checkpoint would let pile up
        store.write(_batch(1 + 50 * n, 50))
    before = database.stat().st_size
    assert before < 1_000_000
    assert (tmp_path / "lobby.sqlite3-wal").stat().st_size > 5_000_000  # all still in the WAL

    def write_more() -> None:
        for n in range(40):
            store.write(_batch(10_001 + 50 * n, 50))

    writing = threading.Thread(target=write_more)
    writing.start()
    store.checkpoint()
    writing.join()
    assert database.stat().st_size > before + 5_000_000
    assert store.checkpoint() == 0  # nothing left once the writer is done
    store.close()

    again = SqliteStore(tmp_path)
    rows = [m.row_id for m in stored_messages(again._db)]
    assert rows == list(range(1, 12_001))
