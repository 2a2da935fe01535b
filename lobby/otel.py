"""OpenTelemetry spans for the lobby (`lobby serve --otel`, the `otel` extra).

Every message the lobby forwards, and every notice or refusal it makes in a trace, gets one
span, a child of the traceparent the message came with (a root span when it came without);
the span's id is the parent-id the message leaves with, so the receiver's spans hang under the
lobby's. The spans go to the tracer provider given, else the global one (which
`opentelemetry-instrument`, or the program embedding the lobby, sets up with its exporters).
A span marks the routing decision only: it starts and ends within `Router.handle`.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from lobby.core.tracing import Tracing
from protocol.models import Message

_propagator = TraceContextTextMapPropagator()


class OtelTracing(Tracing):
    """`Tracing` whose every hop is a recorded span (and so starts a trace for every message)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        super().__init__(start_traces=True)
        self._tracer = trace.get_tracer("agent_lobby.lobby", tracer_provider=tracer_provider)

    def hop(self, msg: Message, receiver_id: str) -> str:
        traceparent = msg.traceparent
        parent = None if traceparent is None else _propagator.extract({"traceparent": traceparent})
        span = self._tracer.start_span(
            f"route {msg.message_type}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "agent_lobby",
                "messaging.operation.type": "send",
                "messaging.destination.name": receiver_id,
                "lobby.message_type": msg.message_type.value,
                "lobby.sender_id": msg.sender_id,
                "lobby.conversation_id": msg.conversation_id or "",
            },
        )
        span.end()
        context = span.get_span_context()
        new = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        if not context.is_valid or new == traceparent:
            # No SDK tracer provider is set up: the API's no-op tracer made no span.
            return super().hop(msg, receiver_id)
        return new
