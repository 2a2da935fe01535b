"""Multi-turn conversations, synchronously through the Router: `input_required` makes an open
conversation wait for INPUT, INPUT is forwarded only then, and the wait survives a restart
(lobby/core/multiturn.py)."""

from __future__ import annotations

from typing import Any

from lobby.core import Router
from lobby.core.records import StateRemoved, StateSaved
from lobby.store.journal import Folded
from tests.routerkit import Clock, Peer, cap, join, make_router, pair, raw, request, world

ASK = {"status": "in_progress", "input_required": {"question": "Which size?"}}


def refusal(peer: Peer) -> tuple[str, str]:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    return error["payload"]["code"], error["payload"]["error"]


def test_several_turns_then_a_final_response_close_the_conversation() -> None:
    router, alice, bob = pair()
    request(alice)
    assert bob.last()["message_type"] == "REQUEST"
    for size in ("M", "L"):
        bob.to("alice", "RESPONSE", ASK, conversation_id="k")
        asked = alice.last()
        assert asked["payload"] == ASK
        assert router.requests.turns.waiting == {("alice", "bob", "k")}
        alice.to("bob", "INPUT", {"size": size}, conversation_id="k", message_id=f"i-{size}")
        given = bob.last()
        assert (given["message_type"], given["payload"]) == ("INPUT", {"size": size})
        assert given["sender_id"] == "alice"
        assert given["seq"]
        assert "auth_token" not in given
        assert router.requests.turns.waiting == set()
    bob.to("alice", "RESPONSE", {"status": "success", "size": "L"}, conversation_id="k")
    assert alice.last()["payload"] == {"status": "success", "size": "L"}
    assert router.conversations == {}
    alice.to("bob", "INPUT", {"size": "S"}, conversation_id="k")
    assert refusal(alice) == (
        "unknown_conversation",
        "no open REQUEST from 'alice' to 'bob' in conversation 'k'",
    )


def test_input_not_asked_for_is_an_invalid_dialogue_and_changes_nothing() -> None:
    router, alice, bob = pair()
    request(alice)
    bob.take()
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k")
    assert refusal(alice) == (
        "invalid_dialogue",
        "'bob' has not asked for input in conversation 'k'",
    )
    bob.to("alice", "RESPONSE", ASK, conversation_id="k")
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k")
    assert bob.last()["message_type"] == "INPUT"
    alice.to("bob", "INPUT", {"size": "L"}, conversation_id="k")
    assert refusal(alice)[0] == "invalid_dialogue"  # answered already: no longer waiting
    assert bob.take() == []
    assert router.conversations == {("alice", "bob", "k"): 1}


def test_input_from_the_provider_or_a_third_agent_is_refused() -> None:
    router, alice, bob = pair()
    carol = join(router, "carol")
    request(alice)
    bob.take()
    bob.to("alice", "RESPONSE", ASK, conversation_id="k")
    carol.to("bob", "INPUT", {"size": "M"}, conversation_id="k")
    assert refusal(carol) == (
        "unknown_conversation",
        "no open REQUEST from 'carol' to 'bob' in conversation 'k'",
    )
    bob.to("alice", "INPUT", {"size": "M"}, conversation_id="k")
    assert refusal(bob)[0] == "unknown_conversation"
    assert router.requests.turns.waiting == {("alice", "bob", "k")}
    alice.take()
    assert bob.take() == []


def test_bad_input_and_bad_input_required_are_malformed() -> None:
    router, alice, bob = pair()
    request(alice)
    alice.to("bob", "INPUT", {"size": "M"})
    assert refusal(alice) == ("malformed", "an INPUT needs a conversation_id")
    bob.to(
        "alice",
        "RESPONSE",
        {"status": "in_progress", "input_required": "size?"},
        conversation_id="k",
    )
    assert refusal(bob) == ("malformed", "'input_required' must be an object")
    bob.to("alice", "RESPONSE", {"status": "success", "input_required": {}}, conversation_id="k")
    code, sentence = refusal(bob)
    assert code == "malformed"
    assert "only with status 'in_progress'" in sentence
    assert router.conversations == {("alice", "bob", "k"): 1}
    assert router.requests.turns.waiting == set()
    assert not [f for f in alice.take() if f["message_type"] == "RESPONSE"]


def test_a_final_response_ends_the_wait_and_a_resent_input_is_confirmed() -> None:
    router, alice, bob = pair()
    request(alice)
    bob.to("alice", "RESPONSE", ASK, conversation_id="k")
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k", message_id="i1")
    bob.take()
    alice.take()
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k", message_id="i1")
    assert alice.take() == []  # a resend: confirmed as accepted, not forwarded twice
    assert bob.take() == []
    bob.to("alice", "RESPONSE", ASK, conversation_id="k")
    bob.to(
        "alice",
        "RESPONSE",
        {"status": "error", "code": "x", "error": "gave up"},
        conversation_id="k",
    )
    assert router.requests.turns.waiting == set()
    saved = router.take_journal().records
    kinds = [type(r) for r in saved if isinstance(r, StateSaved | StateRemoved)]
    assert kinds == [StateSaved, StateRemoved, StateSaved, StateRemoved]


def _resume(router: Router, agent_id: str, token: str) -> Peer:
    session = router.open(agent_id)
    peer = Peer(router, agent_id, session, token)
    world.peers[session.id] = peer
    frame = {"sender_id": agent_id, "message_type": "REGISTER", "auth_token": token}
    world.deliver(raw(router, session, **frame, payload={"auth_token": token}))
    assert peer.inbox[0]["message_type"] == "REGISTER_ACK"
    return peer


def test_the_wait_survives_a_restart_and_a_compaction() -> None:
    router, alice, bob = pair()
    folded = Folded()
    request(alice, conversation="k1")
    request(alice, conversation="k2")
    bob.to("alice", "RESPONSE", ASK, conversation_id="k1")
    bob.to("alice", "RESPONSE", ASK, conversation_id="k2")
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k2")
    folded.apply(router.take_journal().records)
    folded.compact(router.compaction(), keep_done=0)
    restarted = make_router()
    restarted.restore(folded.snapshot())
    assert restarted.requests.turns.waiting == {("alice", "bob", "k1")}
    alice = _resume(restarted, "alice", alice.token)
    bob = _resume(restarted, "bob", bob.token)
    bob.take()
    alice.to("bob", "INPUT", {"size": "S"}, conversation_id="k1")
    assert [f["payload"] for f in bob.take() if f["message_type"] == "INPUT"] == [{"size": "S"}]
    alice.to("bob", "INPUT", {"size": "S"}, conversation_id="k2")
    assert refusal(alice)[0] == "invalid_dialogue"


def test_input_for_an_offline_provider_is_held_and_delivered_on_resume() -> None:
    router, alice, bob = pair()
    request(alice)
    bob.to("alice", "RESPONSE", ASK, conversation_id="k")
    bob.take()
    router.close(bob.session)
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k", message_id="i1")
    assert [f["message_type"] for f in alice.take()] == ["RESPONSE"]  # the ask, nothing else
    bob = _resume(router, "bob", bob.token)
    held: list[dict[str, Any]] = [f for f in bob.take() if f["message_type"] == "INPUT"]
    assert [(f["message_id"], f["payload"]) for f in held] == [("i1", {"size": "M"})]


def test_a_deadline_covers_every_turn_and_a_cancel_ends_the_wait() -> None:
    clock = Clock()
    router = make_router(clock)
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")])
    payload = {"capability_name": "c"}
    alice.to("bob", "REQUEST", payload, conversation_id="k1", message_id="m1", timeout_ms=5000)
    alice.to("bob", "REQUEST", payload, conversation_id="k2", message_id="m2")
    for conversation in ("k1", "k2"):
        bob.to("alice", "RESPONSE", ASK, conversation_id=conversation)
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k1")
    bob.to("alice", "RESPONSE", ASK, conversation_id="k1")  # a second turn
    assert router.requests.turns.waiting == {("alice", "bob", "k1"), ("alice", "bob", "k2")}
    alice.take()
    clock.now += 5.1
    world.deliver(router.tick())
    (timeout,) = [f for f in alice.take() if f["message_type"] == "RESPONSE"]
    assert timeout["payload"]["code"] == "timeout"
    alice.to("global_lobby", "CANCEL", {}, conversation_id="k2")
    (cancelled,) = [f for f in alice.take() if f["message_type"] == "RESPONSE"]
    assert cancelled["payload"]["code"] == "cancelled"
    assert router.requests.turns.waiting == set()
    assert router.conversations == {}
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k2")
    assert refusal(alice)[0] == "unknown_conversation"
