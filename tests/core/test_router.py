"""The router's own work, synchronously: authentication of every message, the dispatch table's
refusals, bad frames, and what it hands out (the journal, the ACCEPTED frames of a commit, the
ERROR for a failure)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from lobby.core import Send
from lobby.core.records import MessageStored
from protocol.models import MessageType, close_code_name
from tests.routerkit import Peer, cap, join, make_router, pair, world

ERROR_KEYS = {"error", "code", "original_message_type", "original_conversation_id"}


def error_code(peer: Peer) -> str:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    assert set(error["payload"]) == ERROR_KEYS
    return str(error["payload"]["code"])


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


@pytest.mark.parametrize("kind", ["ERROR", "REGISTER_ACK", "SERVICES_AVAILABLE", "ACCEPTED"])
def test_lobby_only_types_are_refused_from_agents(kind: str) -> None:
    _, alice, bob = pair()
    alice.to("bob", kind, {"error": "x", "code": "x"})
    refusal = alice.inbox[-1]["payload"]["error"]
    assert error_code(alice) == "malformed"
    assert bob.take() == []
    # An agent sending ERROR most likely meant to fail a REQUEST: the sentence says how.
    hint = "; answer a REQUEST with a RESPONSE whose status is 'error'" if kind == "ERROR" else ""
    assert refusal == f"{kind} is sent by the lobby only{hint}"


def test_bad_frames_are_refused_and_the_session_stays_usable() -> None:
    router, alice, _ = pair()
    world.deliver(router.binary(alice.session))
    assert alice.inbox[-1]["payload"]["error"] == (
        "binary frames are not accepted: send each message as JSON in a text frame"
    )
    assert error_code(alice) == "malformed"
    for frame in (b"\xff\xfe not UTF-8", "{not json", "[]", '{"sender_id": "alice"}'):
        world.deliver(router.handle(alice.session, frame))
        assert error_code(alice) == "malformed"
    alice.send("DISCOVER_SERVICES", {})
    assert alice.last()["message_type"] == "SERVICES_AVAILABLE"


def test_the_dispatch_table_names_every_message_type() -> None:
    """One table, one lookup: a type an agent may send has its handler, every other type its
    refusal; none falls through."""
    router = make_router()
    assert set(router._handlers) == set(MessageType)


def test_a_failure_in_the_core_is_answered_with_error_internal() -> None:
    router, alice, _ = pair()
    (action,) = router.failed(alice.session)
    assert isinstance(action, Send)
    assert action.session is alice.session
    error = orjson.loads(action.frame)
    assert (error["sender_id"], error["receiver_id"], error["message_type"]) == (
        "global_lobby",
        "",
        "ERROR",
    )
    assert error["payload"] == {
        "error": "the lobby failed to process this message; nothing was routed",
        "code": "internal",
        "original_message_type": None,
        "original_conversation_id": None,
    }


def test_a_commit_becomes_accepted_for_the_last_message_of_each_acknowledging_sender() -> None:
    router = make_router()
    alice = join(router, "alice", acks=True)
    join(router, "bob", capabilities=[cap("c")])
    carol = join(router, "carol")  # does not acknowledge: never told ACCEPTED
    for sender, message_id in ((alice, "a-1"), (alice, "a-2"), (carol, "c-1")):
        sender.to(
            "bob",
            "REQUEST",
            {"capability_name": "c"},
            conversation_id=message_id,
            message_id=message_id,
        )
    assert router.journal_pending
    batch = router.take_journal()
    assert not router.journal_pending
    stored = [r for r in batch.records if isinstance(r, MessageStored)]
    assert [r.message_id for r in stored] == ["a-1", "a-2", "c-1"]
    (accepted,) = router.committed(batch)
    assert isinstance(accepted, Send)
    assert accepted.session is alice.session
    frame = orjson.loads(accepted.frame)
    assert (frame["sender_id"], frame["message_type"], frame["receiver_id"]) == (
        "global_lobby",
        "ACCEPTED",
        "alice",
    )
    assert frame["payload"] == {"message_id": "a-2"}


def test_a_sender_gone_before_its_commit_is_told_nothing() -> None:
    router = make_router()
    alice = join(router, "alice", acks=True)
    join(router, "bob", capabilities=[cap("c")])
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", message_id="a-1")
    batch = router.take_journal()
    assert batch.accepted == {alice.session: "a-1"}
    router.close(alice.session)
    assert router.committed(batch) == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"sender_id": "someone_else"},
            "sender_id 'someone_else' is not the agent registered on this connection ('alice')",
        ),
        ({"auth_token": None}, "missing auth_token: every message after REGISTER must carry it"),
        ({"auth_token": "not-the-token"}, "invalid auth_token for agent 'alice'"),
    ],
)
def test_each_authentication_failure_says_which_and_is_logged(
    change: dict[str, Any], reason: str
) -> None:
    router, alice, _ = pair()
    frame = {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "TEXT",
        "payload": {"content": "hi"},
        "auth_token": alice.token,
        "conversation_id": "k",
        **change,
    }
    with capture_logs() as logs:
        world.deliver(router.handle(alice.session, orjson.dumps(frame).decode()))
    assert alice.last()["payload"] == {
        "error": reason,
        "code": "auth_failed",
        "original_message_type": "TEXT",
        "original_conversation_id": "k",
    }
    assert [(e["event"], e["agent_id"], e["reason"]) for e in logs] == [
        ("AUTHENTICATION_FAILED", "alice", reason)
    ]


def test_a_closed_connection_takes_its_agent_offline_once_and_logs_it() -> None:
    router, alice, _ = pair()
    record = router.registry.agents["alice"]
    with capture_logs() as logs:
        assert router.close(router.open()) == []  # a connection that never registered
        assert router.close(alice.session, 1001) == []
        assert router.close(alice.session, 1001) == []  # again: nothing more
    assert (record.session, alice.session.agent) == (None, None)
    assert logs == [
        {
            "event": "AGENT_DISCONNECTED",
            "log_level": "info",
            "agent_id": "alice",
            "close_code": 1001,
            "close": close_code_name(1001),
        }
    ]
