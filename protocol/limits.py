"""Length limits on identifiers, and `clip`, the one way a string from the wire is quoted.

A frame may be as large as the lobby allows (256 KiB by default), but nothing that names a
thing needs to be: the limits below are checked where each field is read (`codec.decode` for
the envelope, the `Capability` model for names), and every string from a frame that the lobby
quotes in an ERROR or a log line goes through `clip` first. So what an agent sends can make
neither a log line nor an ERROR larger than a few hundred characters per quoted value. (Agent
ids are the exception that needs no clip: `decode` already bounds them at `CLIP_LENGTH`.)
"""

from __future__ import annotations

from typing import Final

# Generous but sane: a UUID is 36 characters, a ULID 26, and composed ids such as
# "tenant:agent:uuid" stay well under 256. Any id is then at most 1/1000 of a frame, which keeps
# dedupe keys, journal rows and the ids quoted back in ERRORs small.
MAX_AGENT_ID_LENGTH: Final = 128
"""`sender_id`, `receiver_id`, `authorized_requester_ids` entries: the agent id rule (REGISTER
accepts 1-128 characters), so a longer one can never name an agent."""
MAX_ID_LENGTH: Final = 256
"""`conversation_id`, `message_id`, `in_reply_to`, and `auth_token` (a UUID4, 36 characters)."""
MAX_NAME_LENGTH: Final = 256
"""Capability names, keywords and attribute keys."""

MAX_TIMEOUT_MS: Final = 86_400_000
"""A REQUEST's `timeout_ms` is 1..this (24 h: the dedupe horizon's default, so the REQUEST's
stored frame, which carries its deadline, outlives it)."""
MAX_REASON_LENGTH: Final = 1_000
"""Characters of a CANCEL's `reason`."""

CLIP_LENGTH: Final = 128
"""Characters of a wire string kept when it is quoted in an ERROR sentence or a log field."""
MAX_SENTENCE_LENGTH: Final = 1024
"""Characters kept of a whole ERROR sentence or log field: the bound on what quoting several
clipped values (and their escapes) can add up to."""


def clip(text: str, limit: int = CLIP_LENGTH) -> str:
    """`text` if it has at most `limit` characters, else its first `limit` characters followed
    by a marker saying how many were cut: `'abc...(+249997 characters)'`. Call it on every
    string from a frame before quoting it in an ERROR or passing it to a logger."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...(+{len(text) - limit} characters)"


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved; `take(now)` spends one if there is one. The
    lobby limits agents with it, and the SDK its capabilities' callers."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = now

    def take(self, now: float) -> bool:
        tokens = self.tokens + (now - self.last) * self.rate
        self.last = now
        if tokens >= 1.0:
            self.tokens = min(tokens, self.burst) - 1.0
            return True
        self.tokens = tokens
        return False

    def wait(self) -> float:
        """Seconds until the next token, as of the last `take()`."""
        return max(0.0, (1.0 - self.tokens) / self.rate)

    def is_full(self, now: float) -> bool:
        return self.tokens + (now - self.last) * self.rate >= self.burst
