"""The routing core, synchronously: registration, authentication, discovery, REQUEST/RESPONSE,
held messages and every refusal. No sockets: `Router.handle` is a function."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson
import pytest

from lobby.core import Close, Router, Send
from lobby.core.limits import Limits
from tests.routerkit import Clock, Peer, join, make_router, world

ERROR_KEYS = {"error", "code", "original_message_type", "original_conversation_id"}


def cap(name: str, authorized: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"does {name}",
        "input_schema": {},
        "output_schema": {},
        "authorized_requester_ids": authorized,
        **extra,
    }


def raw(router: Router, session: Any, **frame: Any) -> list[Any]:
    frame.setdefault("receiver_id", "global_lobby")
    frame.setdefault("payload", {})
    return router.handle(session, orjson.dumps(frame).decode())


def frames(actions: list[Any]) -> list[dict[str, Any]]:
    return [orjson.loads(a.frame) for a in actions if isinstance(a, Send)]


def error_code(peer: Peer) -> str:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    assert set(error["payload"]) == ERROR_KEYS
    return str(error["payload"]["code"])


# -- REGISTER ---------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "change",
    [{"auth_token": None}, {"auth_token": "not-the-token"}, {"sender_id": "someone_else"}],
)
@pytest.mark.parametrize("proven_before", [False, True])
def test_every_message_is_authenticated(change: dict[str, Any], proven_before: bool) -> None:
    """Also after the connection proved its token once (a proven token is not hashed again,
    but any other token still is)."""
    router = make_router()
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")])
    if proven_before:
        alice.send("DISCOVER_SERVICES", {})
        assert alice.last()["message_type"] == "SERVICES_AVAILABLE"
    frame = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "REQUEST",
        "payload": {"capability_name": "c"},
        "conversation_id": "k",
        "auth_token": alice.token,
        **change,
    }
    world.deliver(router.handle(alice.session, orjson.dumps(frame).decode()))
    assert error_code(alice) == "auth_failed"
    assert bob.take() == []


# -- discovery --------------------------------------------------------------------------------


def test_discovery_by_name_and_keywords_excludes_the_requester() -> None:
    router = make_router()
    join(router, "hunter", capabilities=[cap("price", keywords=["Shopping", "deals"])])
    join(router, "other", capabilities=[cap("weather", keywords=["sky"])])
    me = join(router, "me", capabilities=[cap("price", keywords=["shopping"])])
    me.send("DISCOVER_SERVICES", {"capability_name": "price"})
    payload = me.last()["payload"]
    assert payload == {
        "services_found": [
            {
                "agent_id": "hunter",
                "relevant_capabilities": [
                    {
                        **cap("price", keywords=["Shopping", "deals"]),
                        "attributes": None,
                    }
                ],
                "online": True,
            }
        ],
        "discovered_for_capability": "price",
        "next": None,
    }
    me.send("DISCOVER_SERVICES", {"keywords": ["SHOPPING", "sky"]})
    assert [s["agent_id"] for s in me.last()["payload"]["services_found"]] == ["hunter", "other"]
    me.send("DISCOVER_SERVICES", {"query_keywords": ["sky"]})
    assert [s["agent_id"] for s in me.last()["payload"]["services_found"]] == ["other"]


def test_discovery_shows_offline_agents_as_offline() -> None:
    router = make_router()
    hunter = join(router, "hunter", capabilities=[cap("price")])
    router.close(hunter.session)
    me = join(router, "me")
    me.send("DISCOVER_SERVICES", {"capability_name": "price"})
    (service,) = me.last()["payload"]["services_found"]
    assert service["online"] is False


# -- REQUEST / RESPONSE ------------------------------------------------------------------------


def pair(authorized: list[str] | None = None) -> tuple[Router, Peer, Peer]:
    router = make_router()
    return router, join(router, "alice"), join(router, "bob", capabilities=[cap("c", authorized)])


def request(peer: Peer, to: str = "bob", conversation: str | None = "k", **payload: Any) -> None:
    envelope = {"conversation_id": conversation} if conversation else {}
    peer.to(to, "REQUEST", {"capability_name": "c", **payload}, **envelope)


def test_an_authorized_request_and_its_responses_are_forwarded_without_token() -> None:
    router, alice, bob = pair(["alice"])
    request(alice, item="x")
    delivered = bob.last()
    assert delivered["payload"] == {"capability_name": "c", "item": "x"}
    assert "auth_token" not in delivered
    assert delivered["message_id"]
    assert delivered["seq"] == 1
    bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="k")
    bob.to("alice", "RESPONSE", {"status": "success", "price": 3}, conversation_id="k")
    updates = alice.take()
    assert [u["payload"]["status"] for u in updates] == ["in_progress", "success"]
    assert all("auth_token" not in u for u in updates)
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert error_code(bob) == "unknown_conversation"
    assert router.conversations == {}


def test_the_senders_message_id_is_kept() -> None:
    _, alice, bob = pair()
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", message_id="mine")
    assert bob.last()["message_id"] == "mine"


def test_unauthorized_gets_the_seeds_error_response() -> None:
    router = make_router()
    join(router, "price_hunter_A2_v2", capabilities=[cap("find", ["search_agent"])])
    rogue = join(router, "rogue_007")
    rogue.to("price_hunter_A2_v2", "REQUEST", {"capability_name": "find"}, conversation_id="k")
    response = rogue.last()
    assert response["message_type"] == "RESPONSE"
    assert response["conversation_id"] == "k"
    assert response["payload"] == {
        "status": "error",
        "code": "unauthorized",
        "error": "Unauthorized: Agent 'rogue_007' is not authorized to call capability 'find' "
        "on agent 'price_hunter_A2_v2'.",
    }
    assert router.conversations == {}


@pytest.mark.parametrize("authorized", [None, []])
def test_null_or_empty_authorization_is_public(authorized: list[str] | None) -> None:
    _, alice, bob = pair(authorized)
    request(alice)
    assert bob.last()["message_type"] == "REQUEST"


def test_unknown_capability_and_receiver_and_missing_conversation() -> None:
    _, alice, bob = pair()
    alice.to("bob", "REQUEST", {"capability_name": "nope"}, conversation_id="k")
    assert alice.last()["payload"]["code"] == "capability_not_found"
    request(alice, to="nobody")
    assert error_code(alice) == "unknown_receiver"
    request(alice, conversation=None)
    assert error_code(alice) == "malformed"
    assert bob.take() == []


def test_only_the_responder_may_answer_and_only_to_the_requester() -> None:
    router, alice, bob = pair()
    mallory = join(router, "mallory")
    request(alice)
    mallory.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert error_code(mallory) == "unknown_conversation"
    bob.to("mallory", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert error_code(bob) == "unknown_conversation"
    assert alice.take() == []
    assert mallory.take() == []


def test_messages_for_an_offline_agent_are_held_and_delivered_in_order() -> None:
    router, alice, bob = pair()
    router.close(bob.session)
    for n in range(3):
        request(alice, conversation=f"k{n}", n=n)
    assert bob.take() == []
    session = router.open()
    held = frames(
        raw(router, session, sender_id="bob", message_type="REGISTER", auth_token=bob.token)
    )
    assert held[0]["payload"]["status"] == "success_resumed"
    assert [m["payload"]["n"] for m in held[1:]] == [0, 1, 2]


def test_acknowledging_agents_get_unacknowledged_messages_again() -> None:
    router = make_router()
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")], acks=True)
    for n in range(3):
        request(alice, conversation=f"k{n}", n=n)
    first = bob.take()
    bob.send("ACK", {"up_to": first[0]["seq"]})
    session = router.open()
    again = frames(
        raw(
            router,
            session,
            sender_id="bob",
            message_type="REGISTER",
            auth_token=bob.token,
            payload={"acks": True},
        )
    )[1:]
    assert [m["payload"]["n"] for m in again] == [1, 2]
    assert all(m["redelivered"] is True for m in again)


def test_a_full_mailbox_refuses_the_sender() -> None:
    router = make_router(mailbox_limit=2)
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")])
    router.close(bob.session)
    request(alice, conversation="k1")
    request(alice, conversation="k2")
    request(alice, conversation="k3")
    assert error_code(alice) == "mailbox_full"
    assert len(router.registry.agents["bob"].mailbox) == 2


def test_update_capabilities_and_unregister() -> None:
    router, alice, bob = pair()
    bob.send("UPDATE_CAPABILITIES", {"capabilities": [cap("d")]})
    assert bob.take() == []
    request(alice)
    assert alice.last()["payload"]["code"] == "capability_not_found"
    actions = router.handle(
        bob.session,
        orjson.dumps(
            {
                "sender_id": "bob",
                "receiver_id": "global_lobby",
                "message_type": "UNREGISTER",
                "payload": {},
                "auth_token": bob.token,
            }
        ).decode(),
    )
    assert [(a.code) for a in actions if isinstance(a, Close)] == [4003]
    assert "bob" not in router.registry.agents
    (ack,) = frames(
        raw(router, router.open(), sender_id="bob", message_type="REGISTER", auth_token=bob.token)
    )
    assert ack["payload"]["auth_token"] != bob.token  # the old token is gone; a new agent


@pytest.mark.parametrize("kind", ["ERROR", "REGISTER_ACK", "SERVICES_AVAILABLE", "ACCEPTED"])
def test_lobby_only_types_are_refused_from_agents(kind: str) -> None:
    _, alice, bob = pair()
    alice.to("bob", kind, {"error": "x", "code": "x"})
    assert error_code(alice) == "malformed"
    assert bob.take() == []


def test_bad_frames_are_refused_and_the_session_stays_usable() -> None:
    router, alice, _ = pair()
    world.deliver(router.binary(alice.session))
    assert error_code(alice) == "malformed"
    for frame in (b"\xff\xfe not UTF-8", "{not json", "[]", '{"sender_id": "alice"}'):
        world.deliver(router.handle(alice.session, frame))
        assert error_code(alice) == "malformed"
    alice.send("DISCOVER_SERVICES", {})
    assert alice.last()["message_type"] == "SERVICES_AVAILABLE"


def test_open_requests_per_agent_are_bounded_and_freed_by_final_responses() -> None:
    """Every unanswered REQUEST is remembered (so its RESPONSE can be authorized): an agent may
    have at most `max_open_requests` of them, or it could fill the lobby's memory."""
    router = Router(limits=Limits(message_rate=0, registration_rate=0, max_open_requests=2))
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")])
    request(alice, conversation="k1")
    request(alice, conversation="k2")
    assert len(bob.take()) == 2
    request(alice, conversation="k3")
    assert error_code(alice) == "limit_exceeded"
    assert bob.take() == []
    bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="k1")
    request(alice, conversation="k3")
    assert error_code(alice) == "limit_exceeded"  # an in_progress RESPONSE answers nothing yet
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k1")
    request(alice, conversation="k3")
    assert [m["conversation_id"] for m in bob.take()] == ["k3"]
    assert router.registry.agents["alice"].open_requests == 2


def test_the_discovery_rate_refills_with_the_router_clock() -> None:
    clock = Clock()
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0, discover_rate=2, discover_burst=1),
        clock=clock,
    )
    seeker = join(router, "seeker")
    kinds = []
    for _ in range(2):
        seeker.send("DISCOVER_SERVICES", {})
        kinds.append(seeker.last()["message_type"])
    assert kinds == ["SERVICES_AVAILABLE", "ERROR"]
    clock.now += 0.5  # one more query's worth at 2 a second
    seeker.send("DISCOVER_SERVICES", {})
    assert seeker.last()["message_type"] == "SERVICES_AVAILABLE"
    seeker.send("DISCOVER_SERVICES", {})
    assert seeker.last()["payload"]["code"] == "rate_limited"
