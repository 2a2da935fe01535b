"""REGISTER, synchronously through the Router: new agents, resumed agents, the agent id rule and
the refusals (lobby/core/registration.py)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from lobby.core import Close, Router, Send
from lobby.core.limits import Limits
from lobby.core.records import AgentSaved
from protocol.limits import MAX_SENTENCE_LENGTH, clip
from tests.routerkit import Clock, Peer, cap, frames, join, make_router, raw, world

ERROR_KEYS = {"error", "code", "original_message_type", "original_conversation_id"}


def error_code(peer: Peer) -> str:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    assert set(error["payload"]) == ERROR_KEYS
    return str(error["payload"]["code"])


def test_register_answers_register_ack_with_a_uuid4_token() -> None:
    router = make_router()
    session = router.open()
    (ack,) = frames(raw(router, session, sender_id="a", message_type="REGISTER"))
    assert ack["message_type"] == "REGISTER_ACK"
    assert ack["sender_id"] == "global_lobby"
    payload = ack["payload"]
    assert payload["status"] == "success_registered_finalized"
    assert payload["lobby_id"] == "global_lobby"
    assert uuid.UUID(payload["auth_token"]).version == 4
    record = router.registry.agents["a"]
    assert record.token_hash == hashlib.sha256(payload["auth_token"].encode()).digest()
    assert payload["auth_token"] not in repr(
        vars(record) if hasattr(record, "__dict__") else record
    )


def test_a_new_registration_is_answered_on_its_own_connection_and_logged() -> None:
    router = make_router()
    session = router.open()
    names = [f"capability_{n:03}" for n in range(100)]  # 1,699 characters joined
    with capture_logs() as logs:
        (ack,) = raw(
            router,
            session,
            sender_id="a",
            message_type="REGISTER",
            payload={"capabilities": [cap(name) for name in names]},
        )
    assert isinstance(ack, Send)
    assert ack.session is session
    assert orjson.loads(ack.frame)["receiver_id"] == "a"
    registered = next(e for e in logs if e["event"] == "AGENT_REGISTERED")
    assert registered["capabilities"] == clip(", ".join(names), MAX_SENTENCE_LENGTH)
    assert registered["capabilities"].startswith(", ".join(names)[:MAX_SENTENCE_LENGTH])


def test_anything_before_register_is_refused_with_its_sentence() -> None:
    router = make_router()
    session = router.open()
    (error,) = frames(raw(router, session, sender_id="a", message_type="TEXT", conversation_id="k"))
    assert error["payload"] == {
        "error": "this connection is not registered: its first message must be REGISTER",
        "code": "not_registered",
        "original_message_type": "TEXT",
        "original_conversation_id": "k",
    }
    # A REGISTER refused names itself too.
    (refused,) = frames(
        raw(router, session, sender_id="a b", message_type="REGISTER", conversation_id="r")
    )
    assert (refused["payload"]["original_message_type"], refused["payload"]["code"]) == (
        "REGISTER",
        "malformed",
    )
    assert refused["payload"]["original_conversation_id"] == "r"


def test_register_must_come_first() -> None:
    router = make_router()
    session = router.open()
    (error,) = frames(raw(router, session, sender_id="a", message_type="DISCOVER_SERVICES"))
    assert error["payload"]["code"] == "not_registered"
    assert "a" not in router.registry.agents


@pytest.mark.parametrize("agent_id", ["", "a b", "x" * 129, "é", "global_lobby"])
def test_agent_ids_follow_the_rule(agent_id: str) -> None:
    router = make_router()
    (error,) = frames(raw(router, router.open(), sender_id=agent_id, message_type="REGISTER"))
    assert error["payload"]["code"] == "malformed"
    assert not router.registry.agents


def test_a_taken_id_needs_its_token_and_nothing_changes() -> None:
    router = make_router()
    first = join(router, "a", capabilities=[cap("c")])
    for token in (None, "wrong", str(uuid.uuid4())):
        extra = {"auth_token": token} if token else {}
        (error,) = frames(
            raw(router, router.open(), sender_id="a", message_type="REGISTER", **extra)
        )
        assert error["payload"]["code"] == "agent_id_taken"
    assert router.registry.agents["a"].session is first.session
    assert list(router.registry.agents["a"].capabilities) == ["c"]


def test_resume_keeps_the_token_replaces_the_old_connection_and_capabilities() -> None:
    router = make_router()
    first = join(router, "a", capabilities=[cap("c")])
    session = router.open()
    actions = raw(router, session, sender_id="a", message_type="REGISTER", auth_token=first.token)
    close = next(a for a in actions if isinstance(a, Close))
    assert (close.session, close.code) == (first.session, 4001)
    (ack,) = frames(actions)
    assert ack["payload"]["status"] == "success_resumed"
    assert ack["payload"]["auth_token"] == first.token
    assert list(router.registry.agents["a"].capabilities) == ["c"]  # no capabilities given
    raw(
        router,
        router.open(),
        sender_id="a",
        message_type="REGISTER",
        auth_token=first.token,
        payload={"capabilities": [cap("d")]},
    )
    assert list(router.registry.agents["a"].capabilities) == ["d"]


def test_a_second_register_on_a_registered_connection_is_refused() -> None:
    router = make_router()
    peer = join(router, "a")
    peer.send("REGISTER", {})
    assert error_code(peer) == "already_registered"


def refusal(actions: list[Any]) -> tuple[str, str]:
    (error,) = frames(actions)
    assert error["message_type"] == "ERROR"
    return error["payload"]["code"], error["payload"]["error"]


def test_each_register_refusal_says_what_is_wrong() -> None:
    router = make_router()
    join(router, "a")
    assert refusal(raw(router, router.open(), sender_id="a b", message_type="REGISTER")) == (
        "malformed",
        "invalid agent id 'a b': sender_id must be 1-128 characters of [A-Za-z0-9._:@-] and "
        "not 'global_lobby'",
    )
    to_someone = raw(router, router.open(), sender_id="b", receiver_id="a", message_type="REGISTER")
    assert refusal(to_someone) == ("malformed", "REGISTER must be addressed to 'global_lobby'")
    assert refusal(raw(router, router.open(), sender_id="a", message_type="REGISTER")) == (
        "agent_id_taken",
        "agent id 'a' is already registered: resume with its auth_token or register under "
        "another id",
    )
    assert list(router.registry.agents) == ["a"]


def limited(**limits: Any) -> Router:
    return Router(limits=Limits(**{"message_rate": 0, **limits}), clock=Clock())


def test_register_attempts_are_limited_per_address_and_forgotten_once_refilled() -> None:
    router = limited(registration_rate=1, registration_burst=2)
    clock = router.state.clock
    assert isinstance(clock, Clock)
    first = router.open(host="h1")
    for agent_id in ("a", "b"):
        assert frames(raw(router, first, sender_id=agent_id, message_type="REGISTER"))
        first = router.open(host="h1")
    with capture_logs() as logs:
        third = raw(router, first, sender_id="c", message_type="REGISTER")
    assert refusal(third) == (
        "rate_limited",
        "too many REGISTER attempts from h1; wait and try again",
    )
    assert [(e["event"], e["host"]) for e in logs] == [("REGISTRATION_RATE_LIMITED", "h1")]
    (ack,) = frames(raw(router, router.open(host="h2"), sender_id="c", message_type="REGISTER"))
    assert ack["message_type"] == "REGISTER_ACK"  # another address has its own attempts
    for _ in range(2):
        raw(router, router.open(), sender_id="x", message_type="REGISTER", payload={"acks": 1})
    assert refusal(raw(router, router.open(), sender_id="y", message_type="REGISTER")) == (
        "rate_limited",
        "too many REGISTER attempts from this address; wait and try again",
    )
    clock.now += 1
    router.compaction()
    # h2 (one attempt of two) has refilled and is forgotten; h1 and "" have one of two back.
    assert set(router.registrar.attempts) == {"h1", ""}
    (ack,) = frames(raw(router, router.open(host="h1"), sender_id="c2", message_type="REGISTER"))
    assert ack["message_type"] == "REGISTER_ACK"
    clock.now += 2
    router.compaction()
    assert router.registrar.attempts == {}


def test_a_lobby_with_a_registration_key_registers_only_who_presents_it() -> None:
    router = limited(registration_rate=0, registration_key="s3cret")
    for payload in ({}, {"payload": {"registration_key": "nope"}}):
        actions = raw(
            router, router.open(), sender_id="a", message_type="REGISTER", payload=payload
        )
        assert refusal(actions) == (
            "auth_failed",
            "this lobby requires a valid 'registration_key' in the REGISTER payload",
        )
    good = {"registration_key": "s3cret"}
    (ack,) = frames(
        raw(router, router.open(), sender_id="a", message_type="REGISTER", payload=good)
    )
    assert ack["message_type"] == "REGISTER_ACK"


def test_an_agent_declares_at_most_max_capabilities() -> None:
    router = limited(registration_rate=0, max_capabilities=2)
    too_many = {"capabilities": [cap("x"), cap("y"), cap("z")]}
    actions = raw(router, router.open(), sender_id="a", message_type="REGISTER", payload=too_many)
    assert refusal(actions) == ("limit_exceeded", "3 capabilities declared; at most 2 are allowed")
    assert not router.registry.agents
    enough = {"capabilities": [cap("x"), cap("y")]}
    (ack,) = frames(
        raw(router, router.open(), sender_id="a", message_type="REGISTER", payload=enough)
    )
    assert ack["message_type"] == "REGISTER_ACK"


def test_an_agents_message_rate_holds_across_a_resume() -> None:
    router = limited(registration_rate=0, message_rate=1, message_burst=2)
    alice, bob = join(router, "alice"), join(router, "bob")
    for content in ("1", "2", "3"):
        alice.to("bob", "TEXT", {"content": content})
    assert [m["payload"]["content"] for m in bob.take()] == ["1", "2"]
    error = alice.last()["payload"]
    assert (error["code"], error["error"]) == (
        "rate_limited",
        "agent 'alice' sends more than 1 messages a second; this one was not routed",
    )
    assert error["original_message_type"] == "TEXT"  # the refusal names what it refused
    session = router.open()
    raw(router, session, sender_id="alice", message_type="REGISTER", auth_token=alice.token)
    alice = Peer(router, "alice", session, alice.token)
    world.peers[alice.session.id] = alice
    alice.to("bob", "TEXT", {"content": "4"})
    assert alice.last()["payload"]["code"] == "rate_limited"  # a new connection, no new burst
    router.state.clock.now += 1  # type: ignore[attr-defined]
    alice.to("bob", "TEXT", {"content": "5"})
    assert [m["payload"]["content"] for m in bob.take()] == ["5"]


def test_a_resume_is_journaled_only_when_it_changes_the_agent_and_is_logged() -> None:
    router = make_router()
    first = join(router, "a", capabilities=[cap("c")])
    router.take_journal()

    def resume(**payload: Any) -> list[Any]:
        session = router.open()
        return raw(
            router,
            session,
            sender_id="a",
            message_type="REGISTER",
            auth_token=first.token,
            payload=payload,
        )

    with capture_logs() as logs:
        actions = resume()
    (close,) = [a for a in actions if isinstance(a, Close)]
    assert (close.code, close.reason) == (4001, "replaced by a newer connection")
    (ack,) = frames(actions)
    assert (ack["receiver_id"], ack["payload"]["status"]) == ("a", "success_resumed")
    # The replaced connection is no agent's any more: what still comes on it is refused.
    (stale,) = frames(raw(router, first.session, sender_id="a", message_type="LIST_TRANSACTIONS"))
    assert stale["payload"]["code"] == "not_registered"
    assert [
        (e["event"], e["agent_id"], e["replaced_connection"], e["held_messages"]) for e in logs
    ] == [("AGENT_RESUMED", "a", True, 0)]
    assert router.take_journal().records == []
    router.close(router.registry.agents["a"].session)  # type: ignore[arg-type]
    with capture_logs() as logs:
        assert not [a for a in resume() if isinstance(a, Close)]
    assert logs[0]["replaced_connection"] is False
    resume(acks=True)
    (saved,) = router.take_journal().records
    assert isinstance(saved, AgentSaved)
    assert saved.acks is True
    resume(acks=True, capabilities=[cap("d")])
    (saved,) = router.take_journal().records
    assert isinstance(saved, AgentSaved)
    assert [c["name"] for c in orjson.loads(saved.capabilities)] == ["d"]


def test_a_new_agent_is_logged_with_its_capabilities_by_name_and_journaled() -> None:
    router = make_router()
    with capture_logs() as logs:
        join(router, "a", capabilities=[cap("zeta"), cap("alpha")])
    assert [(e["event"], e["agent_id"], e.get("capabilities")) for e in logs] == [
        ("AGENT_REGISTERED", "a", "alpha, zeta"),
        ("AGENT_REGISTRATION_FINALIZED", "a", None),
    ]
    assert logs[0]["remote"] == "a"
    (saved,) = router.take_journal().records
    assert isinstance(saved, AgentSaved)
    assert saved.agent_id == "a"


# A node of a cluster (`Router.share`): a new id is answered once the shared registry decided.


def claim(router: Router, agent_id: str, **payload: Any) -> Any:
    """A REGISTER on a node of a cluster, its claim taken by the shared registry: the session
    that waits for the verdict."""
    session = router.open(agent_id)
    frame = {"sender_id": agent_id, "message_type": "REGISTER", "payload": payload}
    assert raw(router, session, conversation_id="c", message_id="r1", **frame) == []
    assert router.state.shared is not None
    router.state.shared.take()
    return session


def test_a_lost_or_unreachable_claim_is_refused_with_its_sentence_in_reply_to_the_register() -> (
    None
):
    router = make_router()
    router.share("here")
    claim(router, "x")
    (taken,) = frames(router.claimed("x", False))
    assert (taken["message_type"], taken["receiver_id"]) == ("ERROR", "x")
    assert (taken["conversation_id"], taken["in_reply_to"]) == ("c", "r1")
    assert taken["payload"] == {
        "code": "agent_id_taken",
        "error": "agent id 'x' is already registered (on another node): resume with its "
        "auth_token or register under another id",
        "original_message_type": "REGISTER",
        "original_conversation_id": "c",
    }
    claim(router, "y")
    (unreachable,) = frames(router.claimed("y", None))
    assert (unreachable["payload"]["code"], unreachable["payload"]["error"]) == (
        "internal",
        "the cluster's shared registry could not be reached: try again",
    )
    assert unreachable["in_reply_to"] == "r1"


def test_a_won_claim_registers_the_agent_on_its_connection_and_logs_it() -> None:
    router = make_router()
    router.share("here")
    names = [n * 100 for n in "cab"]  # 302 characters in all: past a clip, within a sentence
    session = claim(router, "x", capabilities=[cap(n) for n in names])
    with capture_logs() as logs:
        (ack,) = router.claimed("x", True)
    assert isinstance(ack, Send)
    assert ack.session is session
    sent = orjson.loads(ack.frame)
    assert (sent["message_type"], sent["receiver_id"]) == ("REGISTER_ACK", "x")
    assert sent["payload"]["status"] == "success_registered_finalized"
    assert logs == [
        {
            "event": "AGENT_REGISTERED",
            "log_level": "info",
            "agent_id": "x",
            "capabilities": ", ".join(sorted(names)),
            "remote": "x",
        }
    ]
    record = router.registry.get("x")
    assert record is not None
    assert (record.session, session.agent) == (session, record)
