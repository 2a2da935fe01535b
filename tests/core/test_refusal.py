"""Refusals (lobby/core/refusal.py): the one ERROR payload shape, and payload checks whose
sentences name the problem and stay short whatever the frame held."""

from __future__ import annotations

import pytest

from lobby.core.refusal import (
    Refusal,
    error_payload,
    require_lobby_receiver,
    unknown_receiver,
    validate,
)
from protocol.limits import MAX_SENTENCE_LENGTH
from protocol.models import ErrorCode, Message, MessageType
from protocol.payloads import FetchMessagesPayload, RegisterPayload


def test_the_error_payload_has_four_keys_and_a_bounded_sentence() -> None:
    payload = error_payload(ErrorCode.MALFORMED, "x" * 5000, "REQUEST", None)
    assert set(payload) == {"error", "code", "original_message_type", "original_conversation_id"}
    assert payload["code"] == "malformed"
    assert len(payload["error"]) < MAX_SENTENCE_LENGTH + 40
    assert payload["error"].endswith(f"...(+{5000 - MAX_SENTENCE_LENGTH} characters)")


def test_an_invalid_payload_is_refused_naming_the_field_and_clipping_it() -> None:
    long_key = "k" * 1000
    msg = Message("alice", "global_lobby", MessageType.FETCH_MESSAGES, {"limit": long_key})
    with pytest.raises(Refusal) as refused:
        validate(FetchMessagesPayload, msg)
    assert refused.value.code == ErrorCode.MALFORMED
    assert refused.value.reason.startswith("invalid FETCH_MESSAGES payload: limit: ")
    assert len(refused.value.reason) < 400


def test_a_message_to_the_lobby_must_name_it() -> None:
    require_lobby_receiver(Message("alice", "global_lobby", MessageType.ACK, {"up_to": 1}))
    with pytest.raises(Refusal) as refused:
        require_lobby_receiver(Message("alice", "bob", MessageType.ACK, {"up_to": 1}))
    assert refused.value.reason == "ACK must be addressed to 'global_lobby'"


def test_an_unknown_receiver_is_named_and_the_lobby_is_told_apart() -> None:
    assert unknown_receiver("nobody") == "no agent 'nobody' is registered"
    assert unknown_receiver("global_lobby") == (
        "'global_lobby' serves no capabilities: address REQUESTs to an agent"
    )


def test_an_invalid_payload_names_its_first_three_problems_where_they_are() -> None:
    """Dotted locations into lists and objects, "payload" for the payload itself; a fourth
    problem (`acks`) is left out."""
    problems = {
        "capabilities": [{"name": ""}, {"name": "ok", "keywords": [1]}],
        "registration_key": 5,
        "acks": "x",
    }
    for payload, reason in (
        (
            problems,
            "invalid REGISTER payload: capabilities.0.name: String should have at least 1 "
            "character; capabilities.1.keywords.0: Input should be a valid string; "
            "registration_key: Input should be a valid string",
        ),
        (
            [1],
            "invalid REGISTER payload: payload: Input should be a valid dictionary or instance "
            "of RegisterPayload",
        ),
    ):
        msg = Message("a", "global_lobby", MessageType.REGISTER, payload)  # type: ignore[arg-type]
        with pytest.raises(Refusal) as refused:
            validate(RegisterPayload, msg)
        assert refused.value.reason == reason
