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
    it quotes from the frame is clipped (`protocol.limits.clip`). The message type and
    conversation id are kept when they could be read, so the ERROR can name them; they are
    clipped too (the conversation id at `MAX_ID_LENGTH`, so a valid one is kept whole).
    """

    def __init__(
        self,
        reason: str,
        *,
        message_type: str | None = None,
        conversation_id: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message_type = message_type
        self.conversation_id = conversation_id
