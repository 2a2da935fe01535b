"""Limits against abuse, as plain state: token buckets and the configured bounds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from protocol.limits import TokenBucket

MAX_PAUSE: Final = 1.0
"""Longest the lobby stops reading a connection past its rate (PROTOCOL.md §10): well within
the keepalive's ping timeout, whatever rate is configured."""


def pause_after(bucket: TokenBucket) -> float:
    """Seconds not to read a sender `bucket` just refused: until its next token, at most
    `MAX_PAUSE`."""
    return min(bucket.wait(), MAX_PAUSE)


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """What one agent or one address may do. A rate of 0 turns that limit off."""

    message_rate: float = 10_000.0
    """Messages per second one agent may send (sustained); excess gets `rate_limited`."""
    message_burst: float = 20_000.0
    """Messages one agent may send at once before the rate applies."""
    max_capabilities: int = 1_000
    """Capabilities one agent may declare; more gets `limit_exceeded`."""
    max_open_requests: int = 10_000
    """REQUESTs one agent may have open at once (not yet answered with a final RESPONSE); more
    gets `limit_exceeded`. Each open one is remembered until answered: without a bound, an agent
    could fill the lobby's memory with REQUESTs that are never answered. 0: no limit."""
    max_open_dialogues: int = 10_000
    """Negotiation dialogues one agent may have started and not yet ended (CFPs whose dialogue
    is still open); more gets `limit_exceeded`. 0: no limit."""
    max_discover_bytes: int = 256 * 1024
    """Bytes of one DISCOVER_SERVICES answer (the whole frame): past it, an answer holds fewer
    capabilities and a `next` cursor (but always one capability, whatever its size)."""
    discover_rate: float = 50.0
    """DISCOVER_SERVICES queries per second one agent may send; excess gets `rate_limited`.
    A query costs the lobby about a hundred routed messages (up to a few ms at 100,000
    capabilities), so it has its own, much lower, rate."""
    discover_burst: float = 200.0
    """Queries one agent may send at once (an SDK `discover()` pages through a large answer)."""
    registration_rate: float = 20.0
    """REGISTER attempts per second from one source address; excess gets `rate_limited`."""
    registration_burst: float = 100.0
    registration_key: str | None = None
    """When set, REGISTER must carry this `registration_key` in its payload."""


__all__ = ["Limits", "TokenBucket"]
