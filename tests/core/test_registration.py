"""REGISTER, synchronously through the Router: new agents, resumed agents, the agent id rule and
the refusals (lobby/core/registration.py)."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from lobby.core import Close
from tests.routerkit import Peer, cap, frames, join, make_router, raw

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
