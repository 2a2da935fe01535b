"""Failover, sans-I/O: the node that won a dead node's recovery adopts its agents from the dead
node's snapshot (`lobby.core.cluster.adoption`): mailboxes, seq marks, dedupe ids and open
conversations move into its core, journaled, and the agents become its own."""

from __future__ import annotations

import orjson
import pytest

from lobby.core import Router
from lobby.core.cluster.adoption import adopt
from lobby.core.records import (
    DELIVERED,
    Acked,
    AgentSaved,
    MessageStored,
    Snapshot,
    StateSaved,
)
from lobby.core.refusal import hash_token
from lobby.core.session import Session
from lobby.store.journal import Folded
from tests.core.test_shared_registry import join_shared
from tests.routerkit import Clock, cap, frames, make_router, raw

ITEM = {"id": "i1", "name": "pizza", "price": 4, "quantity": 1}


def dead_node() -> tuple[Router, Folded, dict[str, str]]:
    """Node b: alice sent bob three REQUESTs, bob acknowledged the first; what b's journal
    holds, folded as a load would."""
    b = make_router()
    b.share("b")
    folded = Folded()
    bob = join_shared(b, "bob", capabilities=[cap("c")], acks=True)
    alice = join_shared(b, "alice", acks=True)
    tokens = {"bob": bob.token, "alice": alice.token}
    for name in ("alice", "bob"):
        record = b.registry.get(name)
        assert record is not None
        folded.apply([AgentSaved(name, record.token_hash, b"[]", True)])
    for n in (1, 2, 3):
        alice.to(
            "bob", "REQUEST", {"capability_name": "c"}, conversation_id=f"k{n}", message_id=f"m{n}"
        )
    bob.to("global_lobby", "ACK", {"up_to": 1})
    folded.apply(b.take_journal().records)
    return b, folded, tokens


def survivor(b: Router) -> Router:
    a = make_router()
    a.share("a")
    for name in ("alice", "bob"):
        record = b.registry.get(name)
        assert record is not None
        a.learned(AgentSaved(name, record.token_hash, orjson.dumps([cap("c")]), True), "b")
    return a


def test_the_winner_adopts_mailboxes_marks_dedupe_ids_and_conversations() -> None:
    b, folded, tokens = dead_node()
    a = survivor(b)
    assert a.state.shared is not None
    a.state.shared.take()
    assert sorted(adopt(a, folded.snapshot(), "b")) == ["alice", "bob"]
    bob = a.registry.get("bob")
    assert bob is not None
    assert bob.home is None  # this node's agent now, offline until it resumes
    assert (bob.next_seq, bob.acked_seq) == (3, 1)
    assert [seq for seq, _ in bob.mailbox] == [2, 3]
    assert set(a.conversations) == {("alice", "bob", f"k{n}") for n in (1, 2, 3)}
    assert a.registry.get("alice").open_requests == 3  # type: ignore[union-attr]
    # The shared registry learns its new home; a restart of this node finds it all.
    _, changes = a.state.shared.take()
    assert sorted(c.agent_id for c in changes) == ["alice", "bob"]
    records = a.take_journal().records
    stored = [(r.seq, r.frame == DELIVERED) for r in records if isinstance(r, MessageStored)]
    assert stored == [(1, True), (2, False), (3, False)]
    assert Acked("bob", 1) in records
    # bob resumes here: what it had not acknowledged, in order, marked redelivered.
    session = a.open("bob")
    actions = raw(
        a,
        session,
        sender_id="bob",
        message_type="REGISTER",
        payload={"acks": True},
        auth_token=tokens["bob"],
    )
    delivered = frames(actions)
    assert delivered[0]["message_type"] == "REGISTER_ACK"
    assert [(f["seq"], f["message_id"], f.get("redelivered")) for f in delivered[1:]] == [
        (2, "m2", True),
        (3, "m3", True),
    ]
    # A resend of m3 (its sender's node never heard it was committed) is absorbed here.
    relay = a.open("node c")
    relay.agent = a.registry.get("alice")
    request = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "REQUEST",
        "payload": {"capability_name": "c"},
        "conversation_id": "k3",
        "message_id": "m3",
    }
    assert a.relayed(relay, orjson.dumps(request)) == []
    assert bob.next_seq == 3


def bob_held_on_a_survivor() -> tuple[Router, Folded, Session]:
    """bob resumes on a while b, its home, is down (its probe unanswered): a holds the resume
    for the failover; a, b's journal folded, and bob's waiting connection."""
    b, folded, tokens = dead_node()
    a = survivor(b)
    session = a.open("bob")
    resume = {"sender_id": "bob", "message_type": "REGISTER", "payload": {"acks": True}}
    assert raw(a, session, **resume, auth_token=tokens["bob"]) == []
    assert a.probed("b", alive=False) == []  # no 1013
    assert a.state.shared is not None
    assert a.state.shared.registering(session)
    return a, folded, session


def test_a_resume_held_while_its_home_was_down_goes_ahead_once_adopted() -> None:
    """The router's next tick after a adopted b's agents answers the held resume as any
    resume here, with what bob had not acknowledged."""
    a, folded, session = bob_held_on_a_survivor()
    assert a.tick() == []  # b not adopted yet: still waiting
    adopt(a, folded.snapshot(), "b")
    delivered = frames(a.tick())
    assert delivered[0]["message_type"] == "REGISTER_ACK"
    assert delivered[0]["payload"]["status"] == "success_resumed"
    assert [f["message_id"] for f in delivered[1:]] == ["m2", "m3"]
    assert a.registry.get("bob").session is session  # type: ignore[union-attr]
    assert a.state.shared.failing_over == {}  # type: ignore[union-attr]


def test_a_held_resume_whose_connection_closed_is_dropped_not_run_after_the_adoption() -> None:
    a, folded, session = bob_held_on_a_survivor()
    a.close(session)  # the agent gave up waiting
    assert not a.state.shared.registering(session)  # type: ignore[union-attr]
    adopt(a, folded.snapshot(), "b")
    assert a.tick() == []  # nothing to answer, and bob is not attached to a dead connection
    assert a.registry.get("bob").session is None  # type: ignore[union-attr]


def test_an_agent_that_resumed_on_a_live_node_meanwhile_is_not_adopted() -> None:
    b, folded, _ = dead_node()
    a = survivor(b)
    a.learned(AgentSaved("bob", b.registry.get("bob").token_hash, b"[]", True), "c")  # type: ignore[union-attr]
    assert adopt(a, folded.snapshot(), "b") == ["alice"]
    assert a.registry.get("bob").home == "c"  # type: ignore[union-attr]


def three_agents_and_a_conversation_across_nodes() -> tuple[Router, Router, Snapshot]:
    """Node b (clock at 1000) holds carol, bob and alice; node a (clock at 2000) holds dave.
    Dave asked bob first (forwarded to b, stored there as row 1, a conversation both nodes
    track); then alice asked dave (stored on a, its row 1), carol once and bob three times;
    bob acknowledged dave's REQUEST."""
    b = make_router(Clock(1000.0))
    b.share("b")
    a = make_router(Clock(2000.0))
    a.share("a")
    folded = Folded()
    names = ("carol", "bob", "alice")
    carol, bob, alice = (join_shared(b, n, capabilities=[cap("c")], acks=True) for n in names)
    dave = join_shared(a, "dave", capabilities=[cap("d")], acks=True)
    for peer in (carol, bob, alice):
        record = b.registry.get(peer.agent_id)
        assert record is not None
        folded.apply([AgentSaved(peer.agent_id, record.token_hash, b"[]", True)])
        a.learned(AgentSaved(peer.agent_id, record.token_hash, orjson.dumps([cap("c")]), True), "b")
    b.learned(AgentSaved("dave", hash_token("t"), orjson.dumps([cap("d")]), True), "a")
    for sender, node, other, receiver, capability, key in (
        (dave, a, b, "bob", "c", "kb"),
        (alice, b, a, "dave", "d", "kd"),
    ):
        sender.to(receiver, "REQUEST", {"capability_name": capability}, conversation_id=key)
        ((_, _, _, _, frame, _),) = node.delivery.forwards
        node.delivery.forwards.clear()
        relay = other.open(f"node of {sender.agent_id}")
        relay.agent = other.registry.get(sender.agent_id)
        assert [f["seq"] for f in frames(other.relayed(relay, frame))] == [1]
    alice.to("carol", "REQUEST", {"capability_name": "c"}, conversation_id="kc", message_id="mc")
    for n in (1, 2, 3):
        alice.to(
            "bob", "REQUEST", {"capability_name": "c"}, conversation_id=f"k{n}", message_id=f"m{n}"
        )
    bob.to("global_lobby", "ACK", {"up_to": 1})
    folded.apply(b.take_journal().records)
    a.take_journal()
    assert a.delivery.last_row == 1
    return b, a, folded.snapshot()


@pytest.mark.parametrize("moved", ["carol", "bob", "alice"])
def test_each_agent_that_moved_meanwhile_is_left_and_the_others_adopted(moved: str) -> None:
    b, a, snapshot = three_agents_and_a_conversation_across_nodes()
    record = b.registry.get(moved)
    assert record is not None
    a.learned(AgentSaved(moved, record.token_hash, b"[]", True), "c")
    assert sorted(adopt(a, snapshot, "b")) == sorted({"carol", "bob", "alice"} - {moved})
    assert a.registry.get(moved).home == "c"  # type: ignore[union-attr]


def test_adopted_rows_are_journaled_whole_after_this_nodes_own_rows() -> None:
    b, a, snapshot = three_agents_and_a_conversation_across_nodes()
    carol = b.registry.get("carol")
    assert carol is not None
    a.learned(AgentSaved("carol", carol.token_hash, b"[]", True), "c")  # carol's row stays
    assert sorted(adopt(a, snapshot, "b")) == ["alice", "bob"]
    to_bob = [row for row in snapshot.messages if row.receiver == "bob"]
    assert [row.row_id for row in snapshot.messages if row.receiver == "carol"] == [2]
    stored = [r for r in a.take_journal().records if isinstance(r, MessageStored)]
    assert stored == [
        MessageStored(
            2 + n,  # numbered on from this node's own last row
            "bob",
            row.seq,
            row.sender,
            row.message_id,
            row.conversation_id,
            row.effect,
            DELIVERED if row.seq == 1 else row.frame,  # bob acknowledged dave's, seq 1
            1000.0,  # when the dead node stored it
        )
        for n, row in enumerate(to_bob)
    ]
    assert [(r.sender, r.message_id, r.conversation_id) for r in stored[1:]] == [
        ("alice", "m1", "k1"),
        ("alice", "m2", "k2"),
        ("alice", "m3", "k3"),
    ]
    assert (stored[0].sender, stored[0].conversation_id) == ("dave", "kb")
    assert a.delivery.last_row == 5


def test_conversations_already_tracked_here_are_not_counted_twice() -> None:
    _, a, snapshot = three_agents_and_a_conversation_across_nodes()
    dave, alice = a.registry.get("dave"), a.registry.get("alice")
    assert dave is not None
    assert alice is not None
    assert (dave.open_requests, alice.open_requests) == (1, 1)  # kb as requester's node, kd
    adopt(a, snapshot, "b")
    assert a.requests.open == {
        ("dave", "bob", "kb"): 1,
        ("alice", "dave", "kd"): 1,
        ("alice", "carol", "kc"): 1,
        ("alice", "bob", "k1"): 1,
        ("alice", "bob", "k2"): 1,
        ("alice", "bob", "k3"): 1,
    }
    assert (dave.open_requests, alice.open_requests) == (1, 5)


def test_the_winner_takes_over_the_dead_nodes_dialogues_proposals_and_trades() -> None:
    """On b, alice started a dialogue with bob and made him an order proposal he paid; the
    winner a then decides the dialogue's next move and refuses a second payment."""
    b, folded, tokens = dead_node()
    alice, bob = b.registry.get("alice"), b.registry.get("bob")
    assert alice is not None
    assert alice.session is not None
    assert bob is not None
    assert bob.session is not None
    for sender, receiver, mtype, payload, mid in (
        ("alice", "bob", "CFP", {"query": {}}, "d-cfp"),
        ("alice", "bob", "ORDER_PROPOSAL", {"items": [ITEM], "total_price": 4}, "o1"),
        ("bob", "alice", "PAYMENT", {"proposal_message_id": "o1", "amount": 4}, "p1"),
    ):
        session = alice.session if sender == "alice" else bob.session
        conversation = {"conversation_id": "d1"} if mtype == "CFP" else {}
        assert (
            frames(
                raw(
                    b,
                    session,
                    sender_id=sender,
                    receiver_id=receiver,
                    message_type=mtype,
                    payload=payload,
                    message_id=mid,
                    auth_token=tokens[sender],
                    **conversation,
                )
            )[0]["message_type"]
            == mtype
        )
    folded.apply(b.take_journal().records)
    (tx,) = b.ledger.transactions
    a = survivor(b)
    a.take_journal()
    adopt(a, folded.snapshot(), "b")
    assert a.negotiations.open["d1"].state == "cfp_sent"
    assert a.market.proposals["o1"].paid_by == "p1"
    assert a.ledger.transactions == [tx]
    saved = {(r.kind, r.key) for r in a.take_journal().records if isinstance(r, StateSaved)}
    assert {("dialogue", "d1"), ("proposal", "o1"), ("transaction", tx["transaction_id"])} <= saved
    # Adopting the same state again (it is already held) changes nothing.
    adopt(a, folded.snapshot(), "b")
    assert a.ledger.transactions == [tx]
    assert not [r for r in a.take_journal().records if isinstance(r, StateSaved)]
