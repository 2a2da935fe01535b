"""Exceptions of the `protocol` package.

ProtocolError
 └── DecodeError    a frame is not a valid message (ERROR code `malformed`)
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Root of every exception raised by `protocol`."""


class DecodeError(ProtocolError):
    """A frame could not be decoded into a `Message`.

    `str(exc)` is a sentence naming the problem, fit to send back to the agent or to log: what
    it quotes from the frame is clipped (`protocol.limits.clip`). The message type (clipped),
    and the conversation id and message id when they are valid ids, are kept so the ERROR can
    name them (`in_reply_to` is the refused frame's `message_id`); an invalid id is left out
    rather than echoed in a form no schema allows.
    """

    def __init__(
        self,
        reason: str,
        *,
        message_type: str | None = None,
        conversation_id: str | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message_type = message_type
        self.conversation_id = conversation_id
        self.message_id = message_id
