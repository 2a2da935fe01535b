"""What the lobby counts as it works, in plain ints: `lobby.metrics` reads them at scrape time.

A Prometheus client metric costs a label lookup and a lock per increment; here a routed
message costs one dict increment where the code already knows its type, and the exposition
format is produced only when /metrics is asked for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from protocol.models import ErrorCode, MessageType


class Counters:
    """Counts the router keeps; each key is there from the start, so an increment is `+= 1`.

    Messages accepted for a receiver (delivered or held) are counted by message_type: agents'
    messages and the lobby's own notices, not its direct replies (ERROR, ACKs...). REQUEST
    and RESPONSE, the hot path, have int fields of their own (an attribute increment costs
    about half a dict one); `by_type` puts them together."""

    __slots__ = ("refused", "requests", "responses", "routed")

    def __init__(self) -> None:
        self.requests = 0
        self.responses = 0
        self.routed: dict[str, int] = dict.fromkeys(MessageType, 0)
        """Every other message type."""
        self.refused: dict[str, int] = dict.fromkeys(ErrorCode, 0)
        """Refusals (an ERROR, or the seed's error RESPONSE to a REQUEST), by code."""

    def by_type(self) -> dict[str, int]:
        """Messages accepted, by message_type (for /metrics)."""
        return {
            **self.routed,
            MessageType.REQUEST: self.requests,
            MessageType.RESPONSE: self.responses,
        }


class Buckets:
    """A histogram in plain ints: `observe` is a bisect and two additions. `counts[i]` holds
    the observations in (bounds[i-1], bounds[i]]; the last one those above every bound."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        """The sum of every observed value."""

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it) as Prometheus writes them, `+Inf` last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""Bounds for durations of the lobby's own work (a routing batch, a commit)."""

SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""Bounds for how many records a commit writes."""
