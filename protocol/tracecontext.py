"""W3C Trace Context `traceparent` values: checked, started, and moved on by one hop.

A traceparent is `VERSION-TRACEID-PARENTID-FLAGS` in lowercase hex
(https://www.w3.org/TR/trace-context/#traceparent-header), e.g.
`00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`. The lobby and the SDK share these
rules: `problem` is what `codec.decode` refuses a field with, `hop` is what a participant does
before passing a traceparent on (same trace, a new parent-id: its own span), `start` begins a
trace for a message that came without one.
"""

from __future__ import annotations

import random
import re
from typing import Final

TRACEPARENT_RE: Final = re.compile(
    r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[^\s]*)?", re.ASCII
)
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
SAMPLED: Final = "01"
"""The flags of a trace the lobby or the SDK starts: recorded, so a collector downstream that
follows its parent's decision records the rest of it too."""

_random_bytes = random.randbytes  # twice as fast as formatting getrandbits() as hex


def problem(value: str) -> str | None:
    """None if `value` is a traceparent W3C allows, else what is wrong with it."""
    if TRACEPARENT_RE.fullmatch(value) is None:
        return "is not a W3C traceparent (00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>)"
    version = value[:2]
    if version == "ff":
        return "has version ff, which W3C forbids"
    if version == "00" and len(value) != 55:
        return "has version 00 and must be exactly 55 characters"
    if value[3:35] == _ZERO_TRACE:
        return "has an all-zero trace-id"
    if value[36:52] == _ZERO_SPAN:
        return "has an all-zero parent-id"
    return None


def trace_id(traceparent: str) -> str:
    """The 32-hex trace-id of a valid traceparent."""
    return traceparent[3:35]


def parent_id(traceparent: str) -> str:
    """The 16-hex parent-id (the span it was sent from) of a valid traceparent."""
    return traceparent[36:52]


def new_span_id() -> str:
    """A random, non-zero 16-hex span id (not for security: ids only need to be unique)."""
    span_id = _random_bytes(8).hex()
    return span_id if span_id != _ZERO_SPAN else new_span_id()


def new_trace_id() -> str:
    """A random, non-zero 32-hex trace id."""
    trace_id = _random_bytes(16).hex()
    return trace_id if trace_id != _ZERO_TRACE else new_trace_id()


def start() -> str:
    """A traceparent for a new trace (version 00, sampled)."""
    return f"00-{new_trace_id()}-{new_span_id()}-{SAMPLED}"


def hop(traceparent: str, span_id: str | None = None) -> str:
    """`traceparent` as a participant passes it on: same trace and flags, `span_id` (a new one
    when not given) as the parent-id, in version 00 (what W3C asks of a participant that
    receives a higher version)."""
    if traceparent.startswith("00-"):  # exactly 55 characters, as `problem` holds it to
        return traceparent[:36] + (span_id or new_span_id()) + traceparent[52:]
    return f"00-{traceparent[3:35]}-{span_id or new_span_id()}-{traceparent[53:55]}"
