"""Delivery paced by the reader, synchronously through the Router: a resume writes a window of
its backlog, `release` the rest as the connection drains, a paced agent's live messages are
held behind it, and what is held since it connected is counted for the 4002 bound
(lobby/core/delivery.py; the I/O side is tests/test_pacing.py)."""

from __future__ import annotations

from typing import Any

import orjson

from lobby.core import Router
from lobby.core.records import DELIVERED, Acked, MessageStored
from lobby.core.session import AgentRecord
from tests.core.test_delivery import resume
from tests.routerkit import Peer, join, make_router

WINDOW = 1_000
CONTENT = "x" * 300
"""A TEXT of this is about 420 bytes: three fill a window."""


def setup(acks: bool = True) -> tuple[Router, Peer, Peer, AgentRecord]:
    router = make_router(delivery_window=WINDOW)
    alice = join(router, "alice")
    bob = join(router, "bob", acks=acks)
    return router, alice, bob, router.registry.agents["bob"]


def send(alice: Peer, n: int) -> None:
    alice.to("bob", "TEXT", {"content": CONTENT, "n": n})


def numbers(messages: list[dict[str, Any]]) -> list[int]:
    return [m["payload"]["n"] for m in messages if m["message_type"] == "TEXT"]


def release(router: Router, bob: AgentRecord, room: int = WINDOW) -> list[dict[str, Any]]:
    """What the I/O layer does once bob's queue has drained: write what fits."""
    sent = router.delivery.release(bob, room)
    return [orjson.loads(s.frame) for s in sent]


def test_a_resume_writes_a_window_of_its_backlog_and_release_the_rest_in_order() -> None:
    router, alice, bob_peer, bob = setup()
    router.close(bob_peer.session)
    for n in range(10):
        send(alice, n)
    first = resume(bob_peer, acks=True)
    assert first[0]["message_type"] == "REGISTER_ACK"
    assert numbers(first) == [0, 1, 2]  # the window, and the one that crossed it
    assert bob.paced
    assert router.delivery.paced == {bob_peer.session: bob}  # for the I/O layer to go on
    assert bob.held_bytes == 0  # a backlog is not what the 4002 bound counts
    got = numbers(first)
    while bob.paced:
        got += numbers(release(router, bob))
    assert got == list(range(10))
    assert release(router, bob) == []
    assert len(bob.mailbox) == 10  # kept until acknowledged


def test_a_live_message_to_a_paced_agent_is_held_behind_the_backlog() -> None:
    router, alice, bob_peer, bob = setup()
    router.close(bob_peer.session)
    for n in range(6):
        send(alice, n)
    got = numbers(resume(bob_peer, acks=True))
    router.delivery.paced.clear()
    send(alice, 6)  # live, while the backlog is being written
    assert bob_peer.take() == []
    assert router.delivery.paced == {bob_peer.session: bob}  # the I/O layer checks 4002
    assert 0 < bob.held_bytes < 500
    while bob.paced:
        got += numbers(release(router, bob))
    assert got == list(range(7))
    assert bob.held_bytes == 0


def test_an_unpaced_agent_gets_live_messages_at_once_and_a_paced_one_from_its_mailbox() -> None:
    router, alice, bob_peer, bob = setup()
    send(alice, 0)
    assert numbers(bob_peer.take()) == [0]
    bob.paced = True  # the I/O layer saw its queue past the window
    send(alice, 1)
    send(alice, 2)
    assert bob_peer.take() == []
    assert [seq for seq, _ in bob.mailbox] == [1, 2, 3]  # unacknowledged, and held
    held = bob.held_bytes
    assert numbers(release(router, bob, room=1)) == [1]  # at least one, even in no room
    assert bob.held_bytes < held
    assert bob.paced
    assert numbers(release(router, bob)) == [2]
    assert not bob.paced
    send(alice, 3)
    assert numbers(bob_peer.take()) == [3]


def test_a_paced_agent_without_acks_keeps_held_messages_until_they_are_written() -> None:
    router, alice, bob_peer, bob = setup(acks=False)
    send(alice, 0)
    bob_peer.take()
    router.take_journal()
    bob.paced = True
    for n in (1, 2, 3):
        send(alice, n)
    assert bob_peer.take() == []
    journal = router.take_journal().records
    stored = [r for r in journal if isinstance(r, MessageStored)]
    assert all(r.frame != DELIVERED for r in stored)  # kept in the store, as if offline
    assert [seq for seq, _ in bob.mailbox] == [2, 3, 4]
    assert numbers(release(router, bob, room=1)) == [1]
    assert [seq for seq, _ in bob.mailbox] == [3, 4]  # written = delivered
    assert Acked("bob", 2) in router.take_journal().records
    assert numbers(release(router, bob)) == [2, 3]
    assert not bob.mailbox
    assert not bob.paced
    assert bob.acked_seq == 4


def test_the_backlog_of_an_agent_without_acks_is_delivered_only_as_it_is_written() -> None:
    router, alice, bob_peer, bob = setup(acks=False)
    router.close(bob_peer.session)
    for n in range(6):
        send(alice, n)
    router.take_journal()
    got = numbers(resume(bob_peer))
    assert got == [0, 1, 2]
    assert [seq for seq, _ in bob.mailbox] == [4, 5, 6]
    router.close(bob_peer.session)  # cut before the rest was written: it is still held
    again = numbers(resume(bob_peer))
    while bob.paced:
        again += numbers(release(router, bob))
    assert got + again == list(range(6))


def test_redelivered_marks_only_what_an_earlier_connection_got() -> None:
    router, alice, bob_peer, bob = setup()
    for n in range(2):
        send(alice, n)  # written live
    router.close(bob_peer.session)
    for n in range(2, 8):
        send(alice, n)
    resume(bob_peer, acks=True)
    router.close(bob_peer.session)  # 0-2 were written to that connection; 3-7 never
    resumed = [m for m in resume(bob_peer, acks=True) if m["message_type"] == "TEXT"]
    while bob.paced:
        resumed += release(router, bob)
    assert [(m["payload"]["n"], m.get("redelivered")) for m in resumed] == [
        (0, True),
        (1, True),
        (2, True),
        (3, None),
        (4, None),
        (5, None),
        (6, None),
        (7, None),
    ]


def test_what_is_acknowledged_before_it_is_written_is_not_written_nor_counted() -> None:
    router, alice, bob_peer, bob = setup()
    bob.paced = True
    for n in range(4):
        send(alice, n)
    assert bob.held_bytes > 0
    bob_peer.send("ACK", {"up_to": 3})  # read with FETCH_MESSAGES, say
    assert bob.held_bytes == len(bob.mailbox[0][1])
    assert numbers(release(router, bob)) == [3]
    assert bob.held_bytes == 0
