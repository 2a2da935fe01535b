"""An agent handed over between two live cluster nodes, sans-I/O (`lobby.core.cluster.handover`):
the old home gives up its mailbox, marks, conversations, dialogues and proposals, durably; the new
node adopts them and the resume replays what was held, in order."""

from __future__ import annotations

import orjson

from lobby.core import Router
from lobby.core.cluster.adoption import adopt
from lobby.core.records import Acked, AgentSaved, StateRemoved, StateSaved
from lobby.core.session import Close
from lobby.store.journal import Folded
from tests.core.test_shared_registry import join_shared
from tests.routerkit import Peer, cap, frames, make_router, raw


def learn(router: Router, peer: Peer, home: str) -> None:
    record = peer.router.registry.get(peer.agent_id)
    assert record is not None
    capabilities = orjson.dumps([e.wire for e in record.capabilities.values()])
    router.learned(AgentSaved(peer.agent_id, record.token_hash, capabilities, True), home)


ITEM = {"id": "i1", "name": "pizza", "price": 4, "quantity": 1}


def busy_node() -> tuple[Router, Peer, Peer]:
    """Node a: alice sent bob two REQUESTs, he acknowledged none and asked her for input in the
    first; bob started a dialogue with alice and made her an order proposal."""
    a = make_router()
    a.share("a")
    bob = join_shared(a, "bob", capabilities=[cap("c")], acks=True)
    alice = join_shared(a, "alice", acks=True)
    for n in (1, 2):
        alice.to(
            "bob", "REQUEST", {"capability_name": "c"}, conversation_id=f"k{n}", message_id=f"m{n}"
        )
    ask = {"status": "in_progress", "input_required": {"question": "which?"}}
    bob.to("alice", "RESPONSE", ask, conversation_id="k1")
    bob.to("alice", "CFP", {"query": {}}, conversation_id="d1", message_id="cfp")
    bob.to("alice", "ORDER_PROPOSAL", {"items": [ITEM], "total_price": 4}, message_id="o1")
    a.take_journal()
    return a, alice, bob


def test_the_old_home_gives_the_agent_up_and_journals_it_once_its_adoption_is_confirmed() -> None:
    a, alice, bob = busy_node()
    data, actions = a.release("bob", "b")
    assert actions == [Close(bob.session, 4001, "replaced by a newer connection on node b")]
    record = a.registry.get("bob")
    assert record is not None
    assert (record.home, record.session, list(record.mailbox)) == ("b", None, [])
    assert "d1" not in a.negotiations.dialogues  # decided by bob's new home from now on
    assert "o1" not in a.market.proposals
    assert set(a.conversations) == {("alice", "bob", "k1"), ("alice", "bob", "k2")}  # copied
    # Journaled only once the new home says its adoption is committed: until then a failover
    # of this node still finds bob's messages in its journal.
    assert a.take_journal().records == []
    assert set(a.given_up) == {"bob"}
    a.released("bob")
    assert a.given_up == {}
    records = a.take_journal().records
    assert Acked("bob", 2) in records
    assert StateRemoved("dialogue", "d1") in records
    assert StateRemoved("proposal", "o1") in records
    handover = orjson.loads(data)
    assert [m[3] for m in handover["messages"]] == ["m1", "m2"]
    # Not this node's agent (any more): nothing to hand over, nothing done.
    assert a.release("bob", "c") == (b"", [])
    assert a.release("nobody", "c") == (b"", [])
    # What reaches bob here from now on waits until node b has taken him, then goes there.
    alice.to("bob", "TEXT", {"content": "late"}, message_id="m3")
    assert a.delivery.forwards == []
    assert a.looked_up("bob") == []  # b wrote bob's key: what waited goes on, in order
    ((home, receiver, _, message_id, _, _),) = a.delivery.forwards
    assert (home, receiver, message_id) == ("b", "bob", "m3")


def test_a_handover_the_new_node_never_took_is_taken_back() -> None:
    a, alice, _ = busy_node()
    data, _ = a.release("bob", "b")
    alice.to("bob", "TEXT", {"content": "late"}, message_id="m3")
    a.take_journal()
    a.take_back("b", data)
    record = a.registry.get("bob")
    assert record is not None
    assert record.home is None  # this node's agent again, offline until it resumes
    assert [seq for seq, _ in record.mailbox] == [1, 2, 3]  # what waited is held after
    assert a.negotiations.open["d1"].initiator == "bob"
    assert "o1" in a.market.proposals
    assert a.delivery.forwards == []


def test_the_new_node_adopts_the_handover_and_the_resume_replays_it_in_order() -> None:
    a, alice, bob = busy_node()
    b = make_router()
    shared = b.share("b")
    for peer in (alice, bob):
        learn(b, peer, "a")
    session = b.open("bob")
    sent = raw(
        b,
        session,
        sender_id="bob",
        message_type="REGISTER",
        payload={"acks": True},
        auth_token=bob.token,
    )
    assert sent == []  # waits for a's probe, then for a's handover
    assert b.probed("a", alive=True) == []
    assert shared.releases == [("a", "bob")]
    data, _ = a.release("bob", "b")
    delivered = frames(b.handed_over("a", "bob", data))
    assert delivered[0]["payload"]["status"] == "success_resumed"
    assert [(f["seq"], f["message_id"], f.get("redelivered")) for f in delivered[1:]] == [
        (1, "m1", True),
        (2, "m2", True),
    ]
    record = b.registry.get("bob")
    assert record is not None
    assert (record.home, record.session, record.next_seq) == (None, session, 2)
    assert b.negotiations.open["d1"].initiator == "bob"
    assert b.market.proposals["o1"].sender_id == "bob"
    assert ("alice", "bob", "k2") in b.conversations
    assert b.requests.turns.waiting == {("alice", "bob", "k1")}  # bob asked alice in k1
    saved = {(r.kind, r.key) for r in b.take_journal().records if isinstance(r, StateSaved)}
    assert {("dialogue", "d1"), ("proposal", "o1")} <= saved
    assert ("waiting", '["alice","bob","k1"]') in saved
    # A resend of m2 from alice's node is recognised here.
    relay = b.open("node a")
    relay.agent = b.registry.get("alice")
    request = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "REQUEST",
        "payload": {"capability_name": "c"},
        "conversation_id": "k2",
        "message_id": "m2",
    }
    assert b.relayed(relay, orjson.dumps(request)) == []
    assert record.next_seq == 2


def test_a_failover_of_the_old_home_before_the_adoption_is_confirmed_finds_the_mailbox() -> None:
    """The old home dies after handing bob over, before node b confirmed its adoption (b
    never got the handover, say): the survivor c adopts bob from a's journal, messages and
    all. Once confirmed, a's journal holds none of them."""
    a = make_router()
    a.share("a")
    folded = Folded()
    bob = join_shared(a, "bob", capabilities=[cap("c")], acks=True)
    alice = join_shared(a, "alice", acks=True)
    for n in (1, 2):
        alice.to("bob", "TEXT", {"content": f"m{n}"}, message_id=f"m{n}")
    for name in ("alice", "bob"):
        record = a.registry.get(name)
        assert record is not None
        folded.apply([AgentSaved(name, record.token_hash, b"[]", True)])
    folded.apply(a.take_journal().records)
    a.release("bob", "b")
    folded.apply(a.take_journal().records)
    folded.compact(a.compaction(), keep_done=0)  # a checkpoint meanwhile keeps them whole

    def failover() -> list[int]:
        c = make_router()
        c.share("c")
        learn(c, bob, "a")
        assert adopt(c, folded.snapshot(), "a") == ["bob"]
        record = c.registry.get("bob")
        assert record is not None
        return [seq for seq, _ in record.mailbox]

    assert failover() == [1, 2]
    a.released("bob")
    folded.apply(a.take_journal().records)
    assert failover() == []
