"""W3C trace context in an agent: the trace of the message a handler serves is carried to every
message that handler sends.

The reader runs each delivered message that has a `traceparent` in `serving()`, which sets
`CURRENT` for the handler's task (contextvars: a task sees only its own); `Sender.send` puts
`CURRENT` on an outgoing message that names no trace of its own. With OpenTelemetry on
(`Agent(otel=...)`, `agent_sdk.otel`) a handler runs in a span, a child of the message's
traceparent, and what it sends carries that span's id.
"""

from __future__ import annotations

from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any

from protocol.models import Message

CURRENT: ContextVar[str | None] = ContextVar("agent_lobby_traceparent", default=None)
"""The traceparent of the message this task is handling (None outside a traced handler)."""


def current_traceparent() -> str | None:
    """The traceparent messages sent from here carry: the one of the message being handled."""
    return CURRENT.get()


class Tracing:
    """How an agent carries traces without OpenTelemetry: no spans, the received traceparent
    passed on as it came (the lobby gives each hop its own parent-id)."""

    spans = False
    """Whether every handled message gets a span (then `serving` wraps every route)."""

    def serving(
        self, work: Coroutine[Any, Any, None], message: Message
    ) -> Coroutine[Any, Any, None]:
        """`work` (a route's coroutine for `message`), to run in `message`'s trace. Call only
        for a message with a traceparent, unless spans are on."""
        return _in_trace(work, message.traceparent)

    def outgoing(self) -> str | None:
        """The traceparent for a message sent without one."""
        return CURRENT.get()


async def _in_trace(work: Coroutine[Any, Any, None], traceparent: str | None) -> None:
    CURRENT.set(traceparent)  # the task's own context: no reset needed
    await work
