"""Cluster nodes, sans-I/O: a message to an agent whose connection is on another node is
checked here and queued for its home (not stored, not confirmed); the home routes what it is
forwarded (`Router.relayed`) as its own, answering a relay session that stands for the sender."""

from __future__ import annotations

import orjson

from lobby.core import Router
from lobby.core.records import AgentSaved, MessageStored
from lobby.core.refusal import hash_token
from lobby.core.session import Send
from tests.core.test_shared_registry import join_shared as join
from tests.routerkit import cap, frames, make_router


def node(node_id: str) -> Router:
    router = make_router()
    router.share(node_id)
    return router


def learn(router: Router, agent_id: str, home: str, *capabilities: dict[str, object]) -> None:
    saved = AgentSaved(agent_id, hash_token("t"), orjson.dumps(list(capabilities)), True)
    router.learned(saved, home)


def test_a_request_to_another_nodes_agent_is_checked_here_and_queued_for_its_home() -> None:
    a = node("a")
    alice = join(a, "alice", acks=True)
    a.take_journal()
    learn(a, "bob", "b", cap("echo", ["alice"]), cap("secret", ["carol"]))
    alice.to("bob", "REQUEST", {"capability_name": "secret"}, conversation_id="k0")
    assert alice.last()["payload"]["code"] == "unauthorized"  # refused here, not forwarded
    assert a.delivery.forwards == []
    alice.to("bob", "REQUEST", {"capability_name": "echo"}, conversation_id="k", message_id="m1")
    ((home, receiver, sender, message_id, frame, decided),) = a.delivery.forwards
    assert (home, receiver, sender, message_id, decided) == ("b", "bob", "alice", "m1", False)
    forwarded = orjson.loads(frame)
    assert forwarded["message_id"] == "m1"
    assert "auth_token" not in forwarded
    assert "seq" not in forwarded  # the home stamps it
    batch = a.take_journal()
    assert batch.records == []  # the home stores it
    assert batch.accepted == {}  # and confirms it, once committed
    assert a.conversations == {("alice", "bob", "k"): 1}  # its RESPONSE is checked here too


def test_the_home_routes_a_forwarded_message_and_answers_the_relay_session() -> None:
    b = node("b")
    bob = join(b, "bob", capabilities=[cap("echo", ["alice"])])
    b.take_journal()
    learn(b, "alice", "a")
    relay = b.open("node a", link=None)
    relay.agent = b.registry.get("alice")
    request = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "REQUEST",
        "payload": {"capability_name": "echo"},
        "conversation_id": "k",
        "message_id": "m1",
    }
    (delivered,) = frames(b.relayed(relay, orjson.dumps(request)))
    assert delivered["seq"] == 1
    batch = b.take_journal()
    assert isinstance(batch.records[0], MessageStored)  # then its Acked (bob does not ack)
    assert batch.accepted == {relay: "m1"}
    # No ACCEPTED goes back: alice's node tells her once this node's `lobby.done` confirms
    # the batch (`stored_away`), in the order she sent her messages.
    assert b.committed(batch) == []
    assert b.relayed(relay, orjson.dumps(request)) == []  # a resend: deduped here
    assert b.take_journal().accepted == {relay: "m1"}
    # bob's final RESPONSE closes the conversation here and goes to alice's node.
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    ((home, receiver, sender, message_id, _, _),) = b.delivery.forwards
    assert (home, receiver, sender) == ("a", "alice", "bob")
    assert message_id  # named by bob's node when bob named none: a resend is deduped
    assert b.conversations == {}


def test_a_dialogue_is_decided_on_its_initiators_node_and_its_moves_leave_decided() -> None:
    a = node("a")
    alice = join(a, "alice")
    learn(a, "bob", "b")
    a.take_journal()
    alice.to("bob", "CFP", {"query": {}}, conversation_id="d1", message_id="m1")
    ((home, receiver, sender, message_id, frame, decided),) = a.delivery.forwards
    assert (home, receiver, sender, message_id, decided) == ("b", "bob", "alice", "m1", True)
    assert "auth_token" not in orjson.loads(frame)
    assert a.negotiations.dialogues["d1"].state == "cfp_sent"  # held here, on alice's node
    (saved,) = a.take_journal().records  # the dialogue, whole; the move is stored by its home
    assert (saved.kind, saved.key) == ("dialogue", "d1")  # type: ignore[union-attr]


def test_a_move_in_a_dialogue_held_elsewhere_is_forwarded_to_be_decided_there() -> None:
    b = node("b")
    bob = join(b, "bob")
    learn(b, "alice", "a")
    bob.to("alice", "PROPOSE", {"proposal": {"price": 3}}, conversation_id="d1", in_reply_to="m1")
    ((home, receiver, sender, _, _, decided),) = b.delivery.forwards
    assert (home, receiver, sender, decided) == ("a", "alice", "bob", False)
    assert b.negotiations.dialogues == {}  # not tracked here: a decides it
    # A dialogue that names a party of this node's only is not looked for elsewhere.
    join(b, "carol")
    b.delivery.forwards.clear()
    bob.to("carol", "PROPOSE", {"proposal": {"price": 3}}, conversation_id="d2", in_reply_to="x")
    assert bob.last()["payload"]["code"] == "invalid_dialogue"
    assert b.delivery.forwards == []


def test_a_payment_for_a_proposal_held_elsewhere_is_forwarded_to_be_checked_there() -> None:
    b = node("b")
    bea = join(b, "bea")
    learn(b, "sam", "a")
    bea.to("sam", "PAYMENT", {"proposal_message_id": "o1", "amount": 5}, message_id="p1")
    ((home, receiver, sender, message_id, _, decided),) = b.delivery.forwards
    assert (home, receiver, sender, message_id, decided) == ("a", "sam", "bea", "p1", False)


def test_the_home_stores_and_delivers_a_decided_move_once_and_leaves_confirming_to_done() -> None:
    b = node("b")
    bob = join(b, "bob", acks=False)
    learn(b, "alice", "a")
    b.take_journal()
    relay = b.open("node a", link=None)
    relay.agent = b.registry.get("alice")
    cfp = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "CFP",
        "payload": {"query": {}},
        "conversation_id": "d1",
        "message_id": "m1",
    }
    delivered = b.decided(relay, orjson.dumps(cfp))
    assert delivered is not None
    ((sent, got),) = [(a.session, orjson.loads(a.frame)) for a in delivered if isinstance(a, Send)]
    assert sent is bob.session
    assert (got["message_type"], got["seq"], got["message_id"]) == ("CFP", 1, "m1")
    assert b.negotiations.dialogues == {}  # decided on a: not checked or tracked again here
    batch = b.take_journal()
    assert next(type(r) for r in batch.records) is MessageStored
    assert batch.accepted == {relay: "m1"}
    assert b.committed(batch) == []  # alice's node tells her, on this node's `lobby.done`
    assert b.decided(relay, orjson.dumps(cfp)) == []  # a resend: confirmed, not delivered
    assert b.take_journal().accepted == {relay: "m1"}
    # Its receiver moved on to another node: left to the deciding node to send there.
    learn(b, "bob", "c")
    assert b.decided(relay, orjson.dumps({**cfp, "message_id": "m2"})) is None


def test_a_trade_notice_from_another_node_enters_this_nodes_ledger_once() -> None:
    b = node("b")
    join(b, "bea", acks=False)
    join(b, "sam", acks=False)
    tx = {"transaction_id": "tx-1", "buyer": "bea", "seller": "sam", "amount": "5.00"}
    sent = []
    for n, party in enumerate(("sam", "bea", "bea")):  # the last one a resend
        notice = {
            "sender_id": "global_lobby",
            "receiver_id": party,
            "message_type": "PAYMENT_CONFIRMED",
            "payload": {"transaction": tx},
            "message_id": f"n{min(n, 1)}",
        }
        sent.append(frames(b.decided(None, orjson.dumps(notice)) or []))
    assert b.ledger.transactions == [tx]  # both parties here: recorded once
    assert [[f["receiver_id"] for f in each] for each in sent] == [["sam"], ["bea"], []]


def test_a_relayed_frame_the_home_refuses_is_answered_on_the_relay_session() -> None:
    b = node("b")
    join(b, "bob", capabilities=[cap("echo", ["alice"])])
    learn(b, "alice", "a")
    relay = b.open("node a", link=None)
    relay.agent = b.registry.get("alice")
    (broken,) = b.relayed(relay, b'{"sender_id": "alice"')
    assert isinstance(broken, Send)
    assert broken.session is relay
    error = orjson.loads(broken.frame)
    assert (error["message_type"], error["receiver_id"]) == ("ERROR", "alice")
    assert error["payload"]["code"] == "malformed"
    assert (
        error["payload"]["error"]
        == "invalid JSON: unexpected end of data: line 1 column 22 (char 21)"
    )
    response = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "RESPONSE",
        "payload": {"status": "success"},
        "conversation_id": "k",
        "message_id": "m2",
    }
    (refused,) = b.relayed(relay, orjson.dumps(response))
    assert isinstance(refused, Send)
    assert refused.session is relay
    error = orjson.loads(refused.frame)
    assert error["in_reply_to"] == "m2"
    assert error["payload"] == {
        "code": "unknown_conversation",
        "error": "no open REQUEST from 'bob' to 'alice' in conversation 'k'",
        "original_message_type": "RESPONSE",
        "original_conversation_id": "k",
    }
