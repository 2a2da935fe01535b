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
    ((home, receiver, sender, message_id, frame),) = a.delivery.forwards
    assert (home, receiver, sender, message_id) == ("b", "bob", "alice", "m1")
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
    (accepted,) = b.committed(batch)
    assert isinstance(accepted, Send)
    assert accepted.session is relay  # goes back to the sender's node
    assert orjson.loads(accepted.frame)["payload"] == {"message_id": "m1"}
    assert b.relayed(relay, orjson.dumps(request)) == []  # a resend: deduped here
    assert b.take_journal().accepted == {relay: "m1"}
    # bob's final RESPONSE closes the conversation here and goes to alice's node.
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    ((home, receiver, sender, message_id, _),) = b.delivery.forwards
    assert (home, receiver, sender) == ("a", "alice", "bob")
    assert message_id  # named by bob's node when bob named none: a resend is deduped
    assert b.conversations == {}


def test_dialogue_moves_do_not_cross_nodes_yet() -> None:
    a = node("a")
    alice = join(a, "alice")
    learn(a, "bob", "b")
    alice.to("bob", "CFP", {"query": {}}, conversation_id="d1")
    error = alice.last()["payload"]
    assert error["code"] == "unknown_receiver"
    assert "another lobby node" in error["error"]
    assert a.delivery.forwards == []


def test_a_move_to_another_nodes_agent_is_refused_with_its_sentence() -> None:
    a = node("a")
    alice = join(a, "alice")
    learn(a, "bob", "b")
    alice.to("bob", "CFP", {"query": {}}, conversation_id="d1")
    assert alice.last()["payload"]["error"] == (
        "agent 'bob' is connected to another lobby node; CFP between nodes is not supported yet "
        "(REQUEST, RESPONSE and TEXT are)"
    )


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
