"""Multi-turn calls: a capability asks its caller for input mid-call, the caller answers.

The serving side: a handler's `await ctx.ask({...})` sends an `in_progress` RESPONSE carrying
`input_required` and waits in `Inputs` for the requester's INPUT in that conversation (INPUT is
routed to `Inputs.receive`, which completes it at once, never as a task, so a busy agent still
takes its answers). The calling side: `request(on_input=...)` answers each ask with what the
callback returns; `converse()` gives a `Conversation` to iterate, answering with its
`send_input()` by hand.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pydantic import BaseModel

from agent_sdk.calls import Call, Outstanding
from agent_sdk.errors import RequestTimeoutError
from agent_sdk.logs import log
from protocol.models import Message, MessageType, ResponseStatus

Answer = dict[str, Any] | BaseModel
"""What an INPUT carries: a dict, or a model (sent as its JSON form)."""
OnInput = Callable[[dict[str, Any]], Awaitable[Answer] | Answer]
"""What `request(on_input=...)` calls with each `input_required` object the capability sends:
a coroutine function (awaited) or a plain function; what it returns is sent as the INPUT."""


class SendInput(Protocol):
    """Send an INPUT (`Caller.send_input`)."""

    async def __call__(
        self,
        agent_id: str,
        conversation_id: str,
        answer: Answer,
        *,
        message_id: str | None = None,
    ) -> None: ...


def input_payload(answer: Answer) -> dict[str, Any]:
    return answer.model_dump(mode="json") if isinstance(answer, BaseModel) else dict(answer)


def asks(update: dict[str, Any]) -> dict[str, Any] | None:
    """The `input_required` of an `in_progress` RESPONSE payload, if it asks for input."""
    asked = update.get("input_required")
    return asked if isinstance(asked, dict) else None


class Inputs:
    """The asks of this agent's handlers waiting for their INPUT, by (requester, conversation);
    owned by `CapabilityServer`, read by `RequestContext.ask`."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.waiting: dict[tuple[str, str], asyncio.Future[Message]] = {}

    def expect(self, requester_id: str, conversation_id: str) -> asyncio.Future[Message]:
        """Wait for the INPUT of `requester_id` in `conversation_id` (call before asking)."""
        future = asyncio.get_running_loop().create_future()
        self.waiting[(requester_id, conversation_id)] = future
        return future

    def forget(self, requester_id: str, conversation_id: str) -> None:
        self.waiting.pop((requester_id, conversation_id), None)

    def receive(self, message: Message) -> None:
        """The route of INPUT: complete the ask it answers (None: no task needed)."""
        key = (message.sender_id, message.conversation_id or "")
        future = self.waiting.pop(key, None)
        if future is None or future.done():
            # Asked by a handler no longer running (this agent restarted, or it timed out).
            log.warning(
                "INPUT_NOT_AWAITED",
                agent_id=self.agent_id,
                requester=message.sender_id,
                conversation_id=message.conversation_id,
            )
            return None
        future.set_result(message)
        return None


async def ask(
    inputs: Inputs | None,
    send: Callable[[Message], Awaitable[None]],
    request: Message,
    question: dict[str, Any],
    timeout: float | None,
) -> Message:
    """`RequestContext.ask`: send `question` as `input_required`, return the INPUT."""
    if inputs is None:
        raise RuntimeError("ask() needs the context of a capability handler the agent runs")
    conversation_id = request.conversation_id or ""
    future = inputs.expect(request.sender_id, conversation_id)
    try:
        await send(
            Message(
                request.receiver_id,
                request.sender_id,
                MessageType.RESPONSE,
                {"status": ResponseStatus.IN_PROGRESS, "input_required": question},
                request.conversation_id,
                in_reply_to=request.message_id,
            )
        )
        async with asyncio.timeout(timeout):
            return await future
    finally:
        inputs.forget(request.sender_id, conversation_id)


def answering(
    call: Call,
    conversation_id: str,
    on_progress: Callable[[dict[str, Any]], Awaitable[None]] | None,
    on_input: OnInput,
    send_input: SendInput,
) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """The update handler of `request(on_input=...)`: progress first, then the answer to an
    ask, sent as INPUT."""

    async def update(payload: dict[str, Any]) -> None:
        if on_progress is not None:
            await on_progress(payload)
        asked = asks(payload)
        if asked is not None:
            answer = on_input(asked)
            if inspect.isawaitable(answer):
                answer = await answer
            await send_input(call.receiver_id, conversation_id, answer)

    return update


class Conversation:
    """A call whose updates are read one by one, answering asks by hand: iterate it for each
    `in_progress` update (an ask has `input_required`) and, last, the final success payload;
    `send_input()` answers an ask. Made by `Agent.converse()`; the final payload ends the
    call (an error RESPONSE raises as `request()` does). Each step may be awaited from a
    different task (a server that parks the call between turns): `timeout`, counted from the
    REQUEST, covers every turn. `cancel()` ends the call at the lobby; `close()` only stops
    awaiting it."""

    def __init__(
        self,
        call: Call,
        conversation_id: str,
        outstanding: Outstanding,
        send_input: SendInput,
        timeout: float,
        cancel: Callable[[str, str | None], Awaitable[None]],
    ) -> None:
        self.conversation_id = conversation_id
        self.agent_id = call.receiver_id
        self.capability = call.capability
        self._call = call
        self._outstanding = outstanding
        self._send_input = send_input
        self._cancel = cancel
        self._deadline = asyncio.get_running_loop().time() + timeout
        self._ended = False

    async def send_input(self, answer: Answer, *, message_id: str | None = None) -> None:
        """Answer the capability's last ask (an INPUT in this conversation, with `message_id`
        if given)."""
        await self._send_input(self.agent_id, self.conversation_id, answer, message_id=message_id)

    async def cancel(self, reason: str | None = None) -> None:
        """Cancel the call at the lobby (CANCEL: the provider is told to stop) and stop
        awaiting it."""
        self.close()
        await self._cancel(self.conversation_id, reason)

    def close(self) -> None:
        """Stop awaiting this call (its answers are then dropped)."""
        self._ended = True
        self._outstanding.forget(self.conversation_id)

    def __aiter__(self) -> Conversation:
        return self

    async def __anext__(self) -> dict[str, Any]:
        call = self._call
        updates = call.updates
        assert updates is not None
        if self._ended:
            raise StopAsyncIteration
        if updates.empty() and not call.result.done():
            update = asyncio.ensure_future(updates.get())
            try:
                async with asyncio.timeout_at(self._deadline):
                    await asyncio.wait({update, call.result}, return_when=asyncio.FIRST_COMPLETED)
            except TimeoutError:
                self.close()
                raise RequestTimeoutError(
                    f"no final RESPONSE from {self.agent_id!r} for {self.capability!r} in time"
                ) from None
            finally:
                update.cancel()
            if update.done() and not update.cancelled():
                return update.result()
        if not updates.empty():
            return updates.get_nowait()
        self.close()
        return {k: v for k, v in call.result.result().items() if k != "status"}
