"""Refusals and payload checks shared by the core's handlers."""

from __future__ import annotations

import hashlib
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from protocol.models import LOBBY_ID, ErrorCode, Message

_P = TypeVar("_P", bound=BaseModel)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Refusal(Exception):
    """Raised inside a handler to answer the sender with an ERROR and change nothing."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def require_lobby_receiver(msg: Message) -> None:
    if msg.receiver_id != LOBBY_ID:
        raise Refusal(ErrorCode.MALFORMED, f"{msg.message_type} must be addressed to {LOBBY_ID!r}")


def unknown_receiver(receiver_id: str) -> str:
    if receiver_id == LOBBY_ID:
        return f"{LOBBY_ID!r} serves no capabilities: address REQUESTs to an agent"
    return f"no agent {receiver_id!r} is registered"


def validate(model: type[_P], msg: Message) -> _P:
    try:
        return model.model_validate(msg.payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
            for err in exc.errors()[:3]
        )
        raise Refusal(
            ErrorCode.MALFORMED, f"invalid {msg.message_type} payload: {problems}"
        ) from None
