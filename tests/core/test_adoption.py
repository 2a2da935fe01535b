"""Failover, sans-I/O: the node that won a dead node's recovery adopts its agents from the dead
node's snapshot (`lobby.core.adoption`): mailboxes, seq marks, dedupe ids and open
conversations move into its core, journaled, and the agents become its own."""

from __future__ import annotations

import orjson

from lobby.core import Router
from lobby.core.adoption import adopt
from lobby.core.records import DELIVERED, Acked, AgentSaved, MessageStored
from lobby.store.journal import Folded
from tests.core.test_shared_registry import join_shared
from tests.routerkit import cap, frames, make_router, raw


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


def test_an_agent_that_resumed_on_a_live_node_meanwhile_is_not_adopted() -> None:
    b, folded, _ = dead_node()
    a = survivor(b)
    a.learned(AgentSaved("bob", b.registry.get("bob").token_hash, b"[]", True), "c")  # type: ignore[union-attr]
    assert adopt(a, folded.snapshot(), "b") == ["alice"]
    assert a.registry.get("bob").home == "c"  # type: ignore[union-attr]
