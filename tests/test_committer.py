"""The committer (lobby/committer.py) over real stores: it writes the router's journal in
group commits from its writer thread, and carries out the ACCEPTED frames the router makes of
a commit only once that commit is durable. It builds no message itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from lobby.committer import Committer
from lobby.core import Action, Router, Send
from lobby.core.records import Record
from lobby.store.memory import MemoryStore
from lobby.store.sqlite import SqliteStore
from tests.routerkit import Peer, join, make_router


def cap(name: str) -> dict[str, object]:
    return {"name": name, "description": name, "input_schema": {}, "output_schema": {}}


def parties(router: Router) -> Peer:
    alice = join(router, "alice", acks=True)
    join(router, "bob", capabilities=[cap("c")])
    return alice


def accepted(actions: list[Action]) -> list[tuple[int, str]]:
    found = []
    for action in actions:
        assert isinstance(action, Send)
        frame = orjson.loads(action.frame)
        assert frame["message_type"] == "ACCEPTED"
        found.append((action.session.id, frame["payload"]["message_id"]))
    return found


async def test_accepted_is_carried_out_once_the_batch_is_durable(tmp_path: Path) -> None:
    router = make_router()
    alice = parties(router)
    done: list[Action] = []

    def execute(actions: Iterable[Action]) -> None:
        # What the store holds when the ACCEPTED frames are handed over: the batch is in.
        for action in actions:
            done.append(action)
            assert (alice.agent_id, "a-2") in durable()

    store = SqliteStore(tmp_path)

    def durable() -> set[tuple[str, str]]:
        # Read on the loop's thread while the writer thread is idle (its batch is done).
        return {(m.sender, m.message_id) for m in store.load().messages}

    committer = Committer(store, router, execute, interval=0.001)
    for message_id in ("a-1", "a-2"):
        alice.to(
            "bob",
            "REQUEST",
            {"capability_name": "c"},
            conversation_id=message_id,
            message_id=message_id,
        )
    committer.kick()
    await committer.flush()
    assert accepted(done) == [(alice.session.id, "a-2")]
    assert committer.batches >= 1
    assert not router.journal_pending
    await committer.close()
    reopened = SqliteStore(tmp_path)
    try:
        assert [m.message_id for m in reopened.load().messages] == ["a-1", "a-2"]
    finally:
        reopened.close()


async def test_a_store_that_keeps_nothing_confirms_at_once() -> None:
    router = make_router()
    alice = parties(router)
    done: list[Action] = []
    committer = Committer(MemoryStore(), router, done.extend)
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", message_id="a-1")
    committer.kick()  # not durable: no timer, no writer thread
    assert accepted(done) == [(alice.session.id, "a-1")]
    assert not router.journal_pending
    await committer.close()


async def test_a_mark_runs_once_everything_journaled_before_it_is_durable(tmp_path: Path) -> None:
    router = make_router()
    alice = parties(router)
    store = SqliteStore(tmp_path)
    committer = Committer(store, router, lambda actions: None, interval=0.001)
    ran: list[tuple[str, set[str]]] = []

    def mark(name: str) -> None:
        ran.append((name, {m.message_id for m in store.load().messages}))

    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k1", message_id="a-1")
    committer.after_durable(lambda: mark("first"))
    committer.kick()
    await committer.flush()
    assert ran == [("first", {"a-1"})]  # after the commit that holds a-1, not before
    # Nothing waits to be written: a new mark runs at the next kick.
    committer.after_durable(lambda: mark("idle"))
    committer.kick()
    assert ran[-1] == ("idle", {"a-1"})
    assert committer.marks == []
    await committer.close()


async def committed(
    alice: Peer, committer: Committer, message_id: str, mark: Callable[[], None] | None = None
) -> None:
    """alice sends bob a REQUEST, in a commit of its own (which may fail), with `mark` to run
    once it is durable."""
    alice.to(
        "bob",
        "REQUEST",
        {"capability_name": "c"},
        conversation_id=message_id,
        message_id=message_id,
    )
    if mark is not None:
        committer.after_durable(mark)
    committer.kick()
    await committer.flush()


class FailingOnce(SqliteStore):
    """A sqlite store whose first commit fails (a disk error, NATS away past its deadline)."""

    failures = 1

    def write(self, records: list[Record]) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("the first commit fails")
        super().write(records)


async def test_after_a_failed_commit_a_stepping_down_lobby_commits_and_confirms_nothing_more(
    tmp_path: Path,
) -> None:
    """No later ACCEPTED or mark may cover what the failed commit lost: once `failed` says the
    lobby steps down, nothing more is written, confirmed or compacted."""
    router = make_router()
    alice = parties(router)
    store = FailingOnce(tmp_path)
    done: list[Action] = []
    errors: list[BaseException | None] = []

    def failed(error: BaseException | None) -> bool:
        errors.append(error)
        return True

    committer = Committer(store, router, done.extend, interval=0.001, failed=failed)
    ran: list[str] = []
    for message_id in ("a-1", "a-2"):
        await committed(alice, committer, message_id, lambda m=message_id: ran.append(m))  # type: ignore[misc]
    await committer.compact(router.compaction())
    assert [type(e) for e in errors] == [OSError]
    assert committer.halted
    assert done == []  # no ACCEPTED, for a-1 or a-2
    assert ran == []
    assert store.load().messages == []
    await committer.close()


async def test_a_single_lobby_goes_on_committing_after_a_failed_commit(tmp_path: Path) -> None:
    router = make_router()
    alice = parties(router)
    store = FailingOnce(tmp_path)
    done: list[Action] = []
    committer = Committer(store, router, done.extend, interval=0.001)
    for message_id in ("a-1", "a-2"):
        await committed(alice, committer, message_id)
    assert not committer.halted
    assert accepted(done) == [(alice.session.id, "a-2")]
    assert [m.message_id for m in store.load().messages] == ["a-2"]
    await committer.close()
