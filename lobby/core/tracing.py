"""The lobby's part in W3C Trace Context, as a participant (PROTOCOL.md, "Tracing").

Every message the lobby forwards that carries a `traceparent` is passed on in the same trace
with a new parent-id: the lobby's own hop. With trace ids on (`--trace-ids`) a message without
one starts a new trace. Pure: ids come from `random`; the OpenTelemetry spans of `lobby/otel.py`
replace `hop` and give each hop a recorded span whose id becomes the parent-id.
"""

from __future__ import annotations

from protocol import tracecontext
from protocol.models import Message


class Tracing:
    """Owns how a traceparent moves through the lobby. `Delivery.accept` calls `hop` for every
    message that carries one (or for every message, with `start_traces`)."""

    def __init__(self, *, start_traces: bool = False) -> None:
        self.start_traces = start_traces
        """Start a trace for a message that comes without a traceparent."""

    def hop(self, msg: Message, receiver_id: str) -> str:
        """The traceparent `msg` leaves the lobby with, on its way to `receiver_id`."""
        traceparent = msg.traceparent
        if traceparent is None:
            return tracecontext.start()
        return tracecontext.hop(traceparent)


def trace_id(traceparent: str | None) -> str | None:
    """The trace id a log line names (None for an untraced message)."""
    return None if traceparent is None else tracecontext.trace_id(traceparent)
