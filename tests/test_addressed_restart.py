"""A capability-addressed REQUEST failed over, then the lobby restarted on its sqlite store,
synchronously: the copy dropped is not given back to the old provider and its conversation
stays closed, whenever the store's checkpoint was taken (lobby/core/addressed.py `restore`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lobby.core import Router
from lobby.store.sqlite import SqliteStore
from tests.routerkit import Clock, cap, join, make_router, world


def commit(router: Router, store: SqliteStore) -> None:
    store.write(router.take_journal().records)


@pytest.mark.parametrize(
    "checkpoint", ["none", "before_dispatch", "after_dispatch", "after_failover"]
)
def test_a_restart_after_a_failover_keeps_the_dropped_copy_dropped(
    tmp_path: Path, checkpoint: str
) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path)
    router = make_router(clock)
    bob = join(router, "bob", capabilities=[cap("quote")], acks=True)
    carol = join(router, "carol", capabilities=[cap("quote")], acks=True)
    alice = join(router, "alice", acks=True)
    alice.to("bob", "TEXT", {"content": "earlier, unacknowledged"})
    commit(router, store)
    if checkpoint == "before_dispatch":
        store.compact(router.compaction())
    alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m-1")
    assert [m["message_type"] for m in bob.take()] == ["TEXT", "REQUEST"]
    commit(router, store)
    if checkpoint == "after_dispatch":
        store.compact(router.compaction())
    world.deliver(router.close(bob.session, 1006))
    assert carol.take()[0]["message_id"] == "m-1"
    commit(router, store)
    if checkpoint == "after_failover":
        store.compact(router.compaction())
    again = make_router(clock)
    again.restore(store.load())
    assert again.conversations == {("alice", "carol", "k"): 1}
    agents = again.registry.agents
    assert [seq for seq, _ in agents["bob"].mailbox] == [1]  # the TEXT only
    assert [seq for seq, _ in agents["carol"].mailbox] == [1]
    assert (agents["alice"].open_requests, agents["bob"].serving, agents["carol"].serving) == (
        1,
        0,
        1,
    )
    # Once bob acknowledges past it and a checkpoint covers the failover, it is forgotten.
    again.delivery.acknowledge(agents["bob"], 2)
    commit(again, store)
    store.compact(again.compaction())
    third = make_router(clock)
    third.restore(store.load())
    assert third.conversations == {("alice", "carol", "k"): 1}
    commit(third, store)
    assert store.load().state.get("dropped_request", []) == []
