"""Outstanding calls: what the agent's coroutines wait for, keyed by conversation id.

A `Call` is one `request()`: a future for the final RESPONSE and, for `request_stream()`, a
bounded queue of `in_progress` updates. A question to the lobby (`ask_lobby()`) is a future for
its reply. `Outstanding` holds both, and times calls out (one timer for all of them); which
message completes which is decided by the pure `agent_sdk.dispatch.Dispatcher`, which reads
them. Calls live in the agent, not in a
connection, so they survive a reconnect: a RESPONSE that arrives on the next connection still
completes them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_sdk.errors import (
    AgentSDKError,
    InputRequiredError,
    RequestTimeoutError,
    refused_error,
    remote_error,
)
from protocol.models import LOBBY_ID, Message, ResponseStatus

PROGRESS_QUEUE_SIZE = 256
"""In-progress updates kept for a slow `request_stream()` consumer; older ones are dropped."""


class Call:
    """One REQUEST waiting for its final RESPONSE: owns the future `request()` awaits and,
    for `request_stream()`, the bounded queue of `in_progress` updates."""

    __slots__ = (
        "capability",
        "dropped_updates",
        "provider",
        "receiver_id",
        "result",
        "timeouts",
        "updates",
    )

    def __init__(self, receiver_id: str, capability: str, *, stream: bool) -> None:
        self.receiver_id = receiver_id
        self.capability = capability
        self.result: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.updates: asyncio.Queue[dict[str, Any]] | None = (
            asyncio.Queue(PROGRESS_QUEUE_SIZE) if stream else None
        )
        self.dropped_updates = 0
        self.timeouts: dict[str, float] | None = None
        """The deadlines this call's deadline is among (`Outstanding.time_out`), if it has one."""
        self.provider = receiver_id
        """The agent whose RESPONSE answered: for a capability-addressed call (`receiver_id`
        the lobby), the provider the lobby chose, once one answered."""

    def on_response(self, payload: dict[str, Any], sender_id: str = "") -> bool:
        """Feed a RESPONSE payload (from `sender_id`); True when it was the final one."""
        if sender_id and sender_id != LOBBY_ID:
            self.provider = sender_id
        status = payload.get("status")
        if status == ResponseStatus.IN_PROGRESS:
            if self.updates is not None:
                if self.updates.full():
                    self.updates.get_nowait()
                    self.dropped_updates += 1
                self.updates.put_nowait(payload)
            elif "input_required" in payload and not self.result.done():
                self.result.set_exception(
                    InputRequiredError(
                        f"{self.receiver_id!r} asked for input for {self.capability!r}; "
                        "answer it with request(on_input=...) or converse()",
                        payload["input_required"],
                    )
                )
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

    def time_out(self) -> None:
        """No final RESPONSE came in time."""
        if not self.result.done():
            source = "any provider" if self.receiver_id == LOBBY_ID else repr(self.receiver_id)
            self.result.set_exception(
                RequestTimeoutError(f"no RESPONSE from {source} for {self.capability!r} in time")
            )

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
    and `Reply` here, and fails them all when the agent stops.

    Call deadlines share one timer (`time_out`), not one each: a timer per call (an
    `asyncio.timeout`) was a few percent of a busy caller's time. Deadlines are kept per
    timeout length, in the order set, which is their order in time too (a monotonic clock), so
    the earliest of each is its first, and a call answered in time leaves its deadline in O(1).
    """

    def __init__(self) -> None:
        self.calls: dict[str, Call] = {}
        self.questions: dict[str, asyncio.Future[Message]] = {}
        self._deadlines: dict[float, dict[str, float]] = {}
        """Per timeout length, conversation id -> deadline (loop time), earliest first."""
        self._timer: asyncio.TimerHandle | None = None

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

    def time_out(self, conversation_id: str, after: float) -> None:
        """Fail the call in `conversation_id` with `RequestTimeoutError` unless its final
        RESPONSE comes within `after` seconds (call once the REQUEST is sent)."""
        call = self.calls.get(conversation_id)
        if call is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + after
        deadlines = self._deadlines.get(after)
        if deadlines is None:
            deadlines = self._deadlines[after] = {}
        deadlines[conversation_id] = deadline
        call.timeouts = deadlines
        timer = self._timer
        if timer is None or deadline < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """The timer: time out every call past its deadline, re-arm for the next one."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        earliest: float | None = None
        for after, deadlines in list(self._deadlines.items()):
            expired = []
            for conversation_id, deadline in deadlines.items():
                if deadline > now:
                    if earliest is None or deadline < earliest:
                        earliest = deadline
                    break
                expired.append(conversation_id)
            for conversation_id in expired:
                del deadlines[conversation_id]
                call = self.calls.get(conversation_id)
                if call is not None:
                    call.timeouts = None
                    call.time_out()
            if not deadlines:
                del self._deadlines[after]
        if earliest is not None:
            self._timer = loop.call_at(earliest, self._expire)

    def forget(self, conversation_id: str) -> None:
        """Stop awaiting `conversation_id` (answered, timed out, or never sent)."""
        call = self.calls.pop(conversation_id, None)
        if call is not None and call.timeouts is not None:
            call.timeouts.pop(conversation_id, None)
        self.questions.pop(conversation_id, None)

    def answer(self, conversation_id: str, payload: dict[str, Any], sender_id: str = "") -> None:
        call = self.calls.get(conversation_id)
        if call is not None:
            call.on_response(payload, sender_id)

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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()
        for call in self.calls.values():
            call.timeouts = None
            call.fail(exc)
        for future in self.questions.values():
            if not future.done():
                future.cancel()
