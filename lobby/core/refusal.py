"""Refusals and payload checks shared by the core's handlers.

Strings from the frame are quoted through `protocol.limits.clip`, so a refusal is never larger
than a few hundred characters, whatever the frame held.
"""

from __future__ import annotations

import hashlib
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from protocol.limits import MAX_SENTENCE_LENGTH, clip
from protocol.models import LOBBY_ID, ErrorCode, Message

_P = TypeVar("_P", bound=BaseModel)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def error_payload(
    code: ErrorCode, reason: str, message_type: str | None, conversation_id: str | None
) -> dict[str, Any]:
    """The payload of every ERROR the lobby sends: the one place its shape is written."""
    return {
        "error": clip(reason, MAX_SENTENCE_LENGTH),  # its quoted values are clipped already
        "code": code,
        "original_message_type": message_type,
        "original_conversation_id": conversation_id,
    }


class Refusal(Exception):
    """Raised inside a handler to answer the sender with an ERROR and change nothing."""

    def __init__(self, code: ErrorCode, reason: str, *, pause: float = 0.0) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.pause = pause
        """Seconds the sender's connection is not read after the ERROR (a rate limit's)."""


def require_lobby_receiver(msg: Message) -> None:
    if msg.receiver_id != LOBBY_ID:
        raise Refusal(ErrorCode.MALFORMED, f"{msg.message_type} must be addressed to {LOBBY_ID!r}")


def unknown_receiver(receiver_id: str) -> str:
    if receiver_id == LOBBY_ID:
        return f"{LOBBY_ID!r} serves no capabilities: address REQUESTs to an agent"
    return f"no agent {clip(receiver_id)!r} is registered"


def validate(model: type[_P], msg: Message) -> _P:
    try:
        return model.model_validate(msg.payload)
    except ValidationError as exc:
        # Without the input (it may be the whole frame) and the docs URL: unused below.
        errors = exc.errors(include_url=False, include_input=False)
        # A location can hold a key of the payload (an attribute name), a message its value.
        problems = "; ".join(
            f"{'.'.join(clip(str(p)) for p in err['loc']) or 'payload'}: {clip(err['msg'])}"
            for err in errors[:3]
        )
        raise Refusal(
            ErrorCode.MALFORMED, f"invalid {msg.message_type} payload: {problems}"
        ) from None
