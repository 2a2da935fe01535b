"""OpenTelemetry spans for an agent (`Agent(otel=True)`, or a `TracerProvider`; the `otel`
extra): each delivered message is handled in a CONSUMER span, a child of its traceparent (a
root span without one), and what the handler sends carries that span's context. A message sent
outside a handler carries the current OpenTelemetry span's context, if there is one."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agent_sdk.tracing import CURRENT, Tracing
from protocol.models import Message

_propagator = TraceContextTextMapPropagator()


class OtelTracing(Tracing):
    """`Tracing` with a span per handled message, from `tracer_provider` (None: the global)."""

    spans = True

    def __init__(self, agent_id: str, tracer_provider: TracerProvider | None = None) -> None:
        self.agent_id = agent_id
        self._tracer = trace.get_tracer("agent_lobby.agent_sdk", tracer_provider=tracer_provider)

    def serving(
        self, work: Coroutine[Any, Any, None], message: Message
    ) -> Coroutine[Any, Any, None]:
        return self._spanned(work, message)

    async def _spanned(self, work: Coroutine[Any, Any, None], message: Message) -> None:
        traceparent = message.traceparent
        parent = None if traceparent is None else _propagator.extract({"traceparent": traceparent})
        with self._tracer.start_as_current_span(
            f"handle {message.message_type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "agent_lobby",
                "messaging.operation.type": "process",
                "messaging.destination.name": self.agent_id,
                "lobby.message_type": message.message_type.value,
                "lobby.sender_id": message.sender_id,
                "lobby.conversation_id": message.conversation_id or "",
            },
        ) as span:
            context = span.get_span_context()
            # Invalid when no SDK tracer provider is set up (the API's no-op tracer).
            CURRENT.set(_traceparent_of(context) if context.is_valid else traceparent)
            await work

    def outgoing(self) -> str | None:
        current = CURRENT.get()
        if current is not None:
            return current
        context = trace.get_current_span().get_span_context()
        return _traceparent_of(context) if context.is_valid else None


def _traceparent_of(context: trace.SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
