"""What a sender is told ACCEPTED while some of its messages wait on other nodes, sans-I/O:
`Unsettled`'s prefix bookkeeping, and the router's use of it (a commit here, a home's
confirmation of its link's batch: `Router.stored_away`)."""

from __future__ import annotations

import orjson

from lobby.core.accepting import Unsettled
from lobby.core.session import Action, Close, Send
from tests.core.test_forwarding import learn, node
from tests.core.test_shared_registry import join_shared as join


def test_the_prefix_advances_only_over_settled_messages_in_the_order_sent() -> None:
    unsettled = Unsettled()
    unsettled.away("m1")  # to node a
    unsettled.here("m2")
    unsettled.away("m3")  # to node c
    unsettled.take()  # m2's batch goes to the store
    unsettled.here("m4")  # journaled while it is written: the next batch's
    assert unsettled.committed() is None  # m2 stored, m1 not yet
    assert unsettled.stored("m3") is None  # m3 stored elsewhere, m1 still not
    assert unsettled.stored("m1") == "m3"  # m1, m2, m3 all settled: m4 waits for its commit
    assert not unsettled.done
    unsettled.take()
    assert unsettled.committed() == "m4"
    assert unsettled.done
    assert unsettled.stored("m1") is None  # a late repeat confirmation changes nothing


def test_a_batch_taken_before_the_record_began_tells_nothing_of_it() -> None:
    unsettled = Unsettled()
    unsettled.away("m1")
    assert unsettled.taken is None  # the batch being written is the plain path's
    unsettled.here("m2")
    assert unsettled.stored("m1") == "m1"  # m2 is not stored yet
    unsettled.take()
    assert unsettled.committed() == "m2"
    assert unsettled.done


def test_a_forwarded_message_routed_here_after_all_settles_with_a_commit_here() -> None:
    unsettled = Unsettled()
    unsettled.away("m1")
    unsettled.away("m2")
    unsettled.moved_here("m1")  # its receiver moved to this node
    unsettled.here("m1")  # its confirmation as routed here: counted once
    unsettled.take()
    assert unsettled.committed() == "m1"
    assert unsettled.stored("m1") is None  # not waited on there any more
    assert unsettled.stored("m2") == "m2"
    assert unsettled.done


def test_the_same_message_forwarded_twice_waits_once() -> None:
    unsettled = Unsettled()
    unsettled.away("m1")
    unsettled.away("m1")
    assert unsettled.stored("m1") == "m1"
    assert unsettled.done


def accepted(actions: list[Action]) -> list[str]:
    return [
        orjson.loads(a.frame)["payload"]["message_id"]
        for a in actions
        if isinstance(a, Send) and b'"ACCEPTED"' in a.frame
    ]


def test_a_commit_here_confirms_nothing_past_a_message_its_home_has_not_stored() -> None:
    b = node("b")
    alice = join(b, "alice", acks=True)
    join(b, "carol", acks=False)
    learn(b, "bob", "a")
    alice.to("carol", "TEXT", {"content": "0"}, message_id="m0")
    alice.to("bob", "TEXT", {"content": "1"}, message_id="m1")  # forwarded to a
    alice.to("carol", "TEXT", {"content": "2"}, message_id="m2")
    assert [f[3] for f in b.delivery.forwards] == ["m1"]
    assert accepted(b.committed(b.take_journal())) == ["m0"]  # m2 waits for m1
    assert alice.session.unsettled is not None
    assert accepted(b.stored_away([("alice", "m1")])) == ["m2"]
    assert alice.session.unsettled is None  # nothing waits: the plain path again
    alice.to("carol", "TEXT", {"content": "3"}, message_id="m3")
    assert accepted(b.committed(b.take_journal())) == ["m3"]


def test_a_home_storing_first_waits_for_the_commit_here_before_it() -> None:
    b = node("b")
    alice = join(b, "alice", acks=True)
    join(b, "carol", acks=False)
    learn(b, "bob", "a")
    learn(b, "dave", "c")
    alice.to("carol", "TEXT", {"content": "0"}, message_id="m0")
    alice.to("dave", "TEXT", {"content": "1"}, message_id="m1")  # to c
    alice.to("bob", "TEXT", {"content": "2"}, message_id="m2")  # to a
    batch = b.take_journal()
    assert accepted(b.stored_away([("alice", "m2")])) == []  # m0 not stored, m1 not either
    assert accepted(b.committed(batch)) == ["m0"]
    assert accepted(b.stored_away([("alice", "m1"), ("bob", "x")])) == ["m2"]
    assert alice.session.unsettled is None


def test_a_moved_message_refused_here_is_settled_by_its_error() -> None:
    unsettled = Unsettled()
    unsettled.away("m1")
    unsettled.away("m2")
    unsettled.moved_here("m1")
    assert unsettled.routed_here("m1") == "m1"  # m2 still waits on its home
    assert unsettled.stored("m2") == "m2"
    assert unsettled.done
    assert unsettled.routed_here("m1") is None  # once only


def test_a_sender_whose_forwarded_message_was_dropped_unconfirmed_is_closed_to_resend() -> None:
    b = node("b")
    alice = join(b, "alice", acks=True)
    carol = join(b, "carol", acks=True)
    learn(b, "bob", "a")
    alice.to("bob", "TEXT", {"content": "1"}, message_id="m1")
    carol.to("bob", "TEXT", {"content": "1"}, message_id="c1")
    assert b.stored_away([("carol", "c1")]) != []  # carol was told ACCEPTED c1
    (close,) = b.lost_away([("alice", "m1"), ("carol", "c1"), ("alice", "m1"), ("bob", "x")])
    assert isinstance(close, Close)
    assert (close.session, close.code) == (alice.session, 1013)
    assert "resend" in close.reason


def test_a_message_the_sender_did_not_name_is_not_waited_on() -> None:
    b = node("b")
    alice = join(b, "alice", acks=True)
    learn(b, "bob", "a")
    alice.to("bob", "TEXT", {"content": "1"})  # it could not resend it under the same id
    assert alice.session.unsettled is None
