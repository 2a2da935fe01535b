"""Outstanding calls: what the agent's coroutines wait for, keyed by conversation id.

A `Call` is one `request()`: a future for the final RESPONSE and, for `request_stream()`, a
bounded queue of `in_progress` updates. A question to the lobby (`ask_lobby()`) is a future for
its reply. `Outstanding` holds both; which message completes which is decided by the pure
`agent_sdk.dispatch.Dispatcher`, which reads them. Calls live in the agent, not in a
connection, so they survive a reconnect: a RESPONSE that arrives on the next connection still
completes them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_sdk.errors import AgentSDKError, refused_error, remote_error
from protocol.models import Message, ResponseStatus

PROGRESS_QUEUE_SIZE = 256
"""In-progress updates kept for a slow `request_stream()` consumer; older ones are dropped."""


class Call:
    """One REQUEST waiting for its final RESPONSE: owns the future `request()` awaits and,
    for `request_stream()`, the bounded queue of `in_progress` updates."""

    __slots__ = ("capability", "dropped_updates", "receiver_id", "result", "updates")

    def __init__(self, receiver_id: str, capability: str, *, stream: bool) -> None:
        self.receiver_id = receiver_id
        self.capability = capability
        self.result: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.updates: asyncio.Queue[dict[str, Any]] | None = (
            asyncio.Queue(PROGRESS_QUEUE_SIZE) if stream else None
        )
        self.dropped_updates = 0

    def on_response(self, payload: dict[str, Any]) -> bool:
        """Feed a RESPONSE payload; True when it was the final one."""
        status = payload.get("status")
        if status == ResponseStatus.IN_PROGRESS:
            if self.updates is not None:
                if self.updates.full():
                    self.updates.get_nowait()
                    self.dropped_updates += 1
                self.updates.put_nowait(payload)
            return False
        if not self.result.done():
            if status == ResponseStatus.SUCCESS:
                self.result.set_result(payload)
            else:
                self.result.set_exception(remote_error(payload))
        return True

    def on_error(self, code: str, message: str) -> None:
        """The lobby refused the REQUEST (an ERROR naming its conversation)."""
        if not self.result.done():
            self.result.set_exception(refused_error(code, message))

    def fail(self, exc: AgentSDKError) -> None:
        """End the call with `exc` (the agent stopped)."""
        if not self.result.done():
            self.result.set_exception(exc)
            # Nobody may be awaiting any more (e.g. on stop): mark it retrieved.
            self.result.exception()


class Outstanding:
    """Owns what this agent awaits, by conversation id: `calls` and `questions` (futures of the
    lobby's replies), which the dispatcher reads to tell an answer from other messages.
    `Caller` opens and forgets them; `AgentCore` carries the dispatcher's `Answer`, `Refusal`
    and `Reply` here, and fails them all when the agent stops."""

    def __init__(self) -> None:
        self.calls: dict[str, Call] = {}
        self.questions: dict[str, asyncio.Future[Message]] = {}

    def call(
        self, conversation_id: str, receiver_id: str, capability: str, *, stream: bool
    ) -> Call:
        """Await the RESPONSE to the REQUEST about to go to `receiver_id`."""
        call = self.calls[conversation_id] = Call(receiver_id, capability, stream=stream)
        return call

    def question(self, conversation_id: str) -> asyncio.Future[Message]:
        """Await the lobby's reply to the message about to go out in `conversation_id`."""
        future = self.questions[conversation_id] = asyncio.get_running_loop().create_future()
        return future

    def forget(self, conversation_id: str) -> None:
        """Stop awaiting `conversation_id` (answered, timed out, or never sent)."""
        self.calls.pop(conversation_id, None)
        self.questions.pop(conversation_id, None)

    def answer(self, conversation_id: str, payload: dict[str, Any]) -> None:
        call = self.calls.get(conversation_id)
        if call is not None:
            call.on_response(payload)

    def refuse(self, conversation_id: str, code: str, error: str) -> None:
        call = self.calls.get(conversation_id)
        if call is not None:
            call.on_error(code, error)

    def reply(self, conversation_id: str, message: Message) -> bool:
        """Complete the question; False if it was answered already (or just timed out)."""
        future = self.questions.get(conversation_id)
        if future is None or future.done():
            return False
        future.set_result(message)
        return True

    def fail_all(self, exc: AgentSDKError) -> None:
        """The agent stopped: every call fails with `exc`, every question is cancelled."""
        for call in self.calls.values():
            call.fail(exc)
        for future in self.questions.values():
            if not future.done():
                future.cancel()
