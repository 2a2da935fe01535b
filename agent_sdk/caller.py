"""The calling side of an agent: request/response, streaming, capability-addressed calls,
discovery, questions to the lobby."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ValidationError

from agent_sdk.calls import Call
from agent_sdk.discovering import Discovery
from agent_sdk.errors import (
    AgentSDKError,
    PayloadError,
    RemoteError,
    RequestError,
    RequestTimeoutError,
)
from agent_sdk.turns import Answer, Conversation, OnInput, answering, input_payload
from protocol.models import LOBBY_ID, MessageType

M = TypeVar("M", bound=BaseModel)
LOBBY_GRACE = 1.0
"""Seconds a call with a `timeout` waits past it for the lobby's `timeout` answer (the lobby
checks deadlines twice a second) before its own timer fails it."""
Progress = Callable[[dict[str, Any]], Awaitable[None] | None]
"""What `request(on_progress=...)` calls with each `in_progress` update: a coroutine function
(awaited) or a plain function."""


class Caller(Discovery):
    """Calls to other agents and questions to the lobby; mixed into `Agent`. What it awaits is
    held in `calls.Outstanding`, completed by the read loop."""

    @overload
    async def request(
        self,
        agent_id: str,
        capability: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        timeout: float | None = None,
        output_type: type[M],
        on_progress: Progress | None = None,
        conversation_id: str | None = None,
        on_input: OnInput | None = None,
    ) -> M: ...

    @overload
    async def request(
        self,
        agent_id: str,
        capability: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        timeout: float | None = None,
        output_type: None = None,
        on_progress: Progress | None = None,
        conversation_id: str | None = None,
        on_input: OnInput | None = None,
    ) -> Any: ...

    async def request(
        self,
        agent_id: str,
        capability: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        timeout: float | None = None,
        output_type: type[M] | None = None,
        on_progress: Progress | None = None,
        conversation_id: str | None = None,
        on_input: OnInput | None = None,
    ) -> Any:
        """Call `capability` on `agent_id`; return the success payload (without `status`), or
        an `output_type` instance. Raises a `RequestError` subclass on failure (a `RemoteError`
        subclass chosen by the error's code, `RequestTimeoutError` on a timeout, the
        caller's or the capability's), `PayloadError` if the answer does not fit
        `output_type`. `on_progress` is called (and awaited, if it is a coroutine function) with
        each `in_progress` update (its payload, `status` included) as it arrives, before the
        final answer is returned. `on_input` answers a capability that asks for input mid-call
        (multi-turn): it is called (and awaited, if a coroutine function) with each
        `input_required` object, and what it returns (a dict or a model) is sent as the INPUT;
        without it, an ask raises `InputRequiredError`.

        A `timeout` given here is the REQUEST's deadline at the lobby too (`timeout_ms`), over
        every turn: past it the lobby stops the provider (CANCEL) and answers `timeout`, raised as
        `RemoteTimeoutError`; the agent's own timer fails the call a little later if that
        answer never comes. Without it, only the local `request_timeout` applies. Cancelling
        the awaiting task cancels the REQUEST at the lobby too, as does `cancel()` with the
        call's `conversation_id` (yours, or one drawn by the agent), which raises
        `RequestCancelled` here."""
        stream = on_progress is not None or on_input is not None
        timeout_ms = None if timeout is None else max(1, math.ceil(timeout * 1000))
        conversation_id, call = await self._start_call(
            agent_id, capability, payload, stream, conversation_id, timeout_ms
        )
        outstanding = self._outstanding
        outstanding.time_out(
            conversation_id, self.request_timeout if timeout is None else timeout + LOBBY_GRACE
        )
        try:
            result = await self._await_call(call, conversation_id, on_progress, on_input)
        finally:
            outstanding.forget(conversation_id)
        return _result(result, output_type)

    async def _await_call(
        self,
        call: Call,
        conversation_id: str,
        on_progress: Progress | None,
        on_input: OnInput | None = None,
    ) -> dict[str, Any]:
        """The final RESPONSE payload of `call`, answering its asks with `on_input`; a caller
        that stops waiting (its task cancelled, its own timer run out) CANCELs the REQUEST at
        the lobby."""
        try:
            # Past the deadline, the shared timer fails the call with RequestTimeoutError.
            if on_input is not None:
                progress = None if on_progress is None else _reporting(on_progress)
                turns = answering(call, conversation_id, progress, on_input, self.send_input)
                return await _with_progress(call, turns)
            if on_progress is not None:
                return await _with_progress(call, on_progress)
            return await call.result
        except asyncio.CancelledError:
            self._handlers.spawn(self._cancel_quietly(conversation_id))
            raise
        except RequestTimeoutError as exc:
            if not isinstance(exc, RemoteError):  # this agent's own timer: it stops waiting
                self._handlers.spawn(self._cancel_quietly(conversation_id))
            raise

    @overload
    async def call(
        self,
        capability: str,
        arguments: dict[str, Any] | BaseModel | None = None,
        *,
        filters: list[dict[str, Any]] | None = None,
        timeout: float | None = None,
        output_type: type[M],
        on_progress: Progress | None = None,
        with_provider: Literal[False] = False,
    ) -> M: ...

    @overload
    async def call(
        self,
        capability: str,
        arguments: dict[str, Any] | BaseModel | None = None,
        *,
        filters: list[dict[str, Any]] | None = None,
        timeout: float | None = None,
        output_type: None = None,
        on_progress: Progress | None = None,
        with_provider: Literal[False] = False,
    ) -> Any: ...

    @overload
    async def call(
        self,
        capability: str,
        arguments: dict[str, Any] | BaseModel | None = None,
        *,
        filters: list[dict[str, Any]] | None = None,
        timeout: float | None = None,
        output_type: type[M],
        on_progress: Progress | None = None,
        with_provider: Literal[True],
    ) -> tuple[M, str]: ...

    @overload
    async def call(
        self,
        capability: str,
        arguments: dict[str, Any] | BaseModel | None = None,
        *,
        filters: list[dict[str, Any]] | None = None,
        timeout: float | None = None,
        output_type: None = None,
        on_progress: Progress | None = None,
        with_provider: Literal[True],
    ) -> tuple[Any, str]: ...

    async def call(
        self,
        capability: str,
        arguments: dict[str, Any] | BaseModel | None = None,
        *,
        filters: list[dict[str, Any]] | None = None,
        timeout: float | None = None,
        output_type: type[M] | None = None,
        on_progress: Progress | None = None,
        with_provider: bool = False,
    ) -> Any:
        """Call `capability` on whichever agent the lobby chooses: one online now that offers
        it to this agent and matches `filters` (DISCOVER's, over capability attributes), the
        least busy, in turn; if it goes before answering, the lobby gives the REQUEST to
        another. Returns what `request` returns; with `with_provider=True`, a pair (that,
        the id of the agent that answered). Raises as `request` does, and `NoProviderError`
        when no agent offers it (none is left)."""
        data = arguments.model_dump(mode="json") if isinstance(arguments, BaseModel) else arguments
        payload: dict[str, Any] = {"capability_name": capability, "arguments": data or {}}
        if filters is not None:
            payload["filters"] = filters
        conversation_id = self.new_id()
        timeout_ms = None if timeout is None else max(1, math.ceil(timeout * 1000))
        outstanding = self._outstanding
        call = outstanding.call(
            conversation_id, LOBBY_ID, capability, stream=on_progress is not None
        )
        try:
            await self.send(
                LOBBY_ID,
                MessageType.REQUEST,
                payload,
                conversation_id=conversation_id,
                timeout_ms=timeout_ms,
            )
            outstanding.time_out(
                conversation_id, self.request_timeout if timeout is None else timeout + LOBBY_GRACE
            )
            result = await self._await_call(call, conversation_id, on_progress)
        finally:
            outstanding.forget(conversation_id)
        answer = _result(result, output_type)
        return (answer, call.provider) if with_provider else answer

    async def cancel(self, conversation_id: str, reason: str | None = None) -> None:
        """Cancel this agent's open REQUESTs in `conversation_id` (CANCEL): the lobby stops
        their providers and ends each call with `RequestCancelled`. Returns once CANCEL is
        sent; one with nothing open is refused by the lobby (`unknown_conversation`), quietly."""
        self._dispatcher.ended(conversation_id)
        payload = {} if reason is None else {"reason": reason}
        await self.send(LOBBY_ID, MessageType.CANCEL, payload, conversation_id=conversation_id)

    async def _cancel_quietly(self, conversation_id: str) -> None:
        """CANCEL for a call whose awaiting task was cancelled (it may be answered already)."""
        # Not connected: the deadline, if any, ends it at the lobby.
        with contextlib.suppress(AgentSDKError):
            await self.cancel(conversation_id, "the requester stopped waiting")

    async def request_stream(
        self,
        agent_id: str,
        capability: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield each `in_progress` update, then the final success payload. A `timeout` given
        is the REQUEST's deadline at the lobby too, as in `request()`."""
        timeout_ms = None if timeout is None else max(1, math.ceil(timeout * 1000))
        conversation_id, call = await self._start_call(
            agent_id, capability, payload, True, None, timeout_ms
        )
        assert call.updates is not None
        try:
            async with asyncio.timeout(
                self.request_timeout if timeout is None else timeout + LOBBY_GRACE
            ):
                while True:
                    update = asyncio.ensure_future(call.updates.get())
                    await asyncio.wait({update, call.result}, return_when=asyncio.FIRST_COMPLETED)
                    if update.done():
                        yield update.result()
                        continue
                    update.cancel()
                    while not call.updates.empty():
                        yield call.updates.get_nowait()
                    yield _result(call.result.result(), None)
                    return
        except RequestError:
            raise  # the capability's own timeout is a TimeoutError too: not ours
        except TimeoutError:
            raise RequestTimeoutError(
                f"no final RESPONSE from {agent_id!r} for {capability!r} in time"
            ) from None
        finally:
            self._outstanding.forget(conversation_id)
            if not call.result.done():  # stopped waiting (cancelled, timed out, left early)
                self._handlers.spawn(self._cancel_quietly(conversation_id))

    async def converse(
        self,
        agent_id: str,
        capability: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        timeout: float | None = None,
        message_id: str | None = None,
    ) -> Conversation:
        """Call `capability` on `agent_id` and return the call as a `Conversation`: iterate
        it for each update (an ask carries `input_required`; answer it with
        `conversation.send_input(...)`) and, last, the final success payload. `message_id`
        (None: one is made) is the REQUEST's. A `timeout` given is its deadline at the lobby
        too, over every turn, as in `request()`; `cancel()` with the conversation's
        `conversation_id` ends it."""
        timeout_ms = None if timeout is None else max(1, math.ceil(timeout * 1000))
        conversation_id, call = await self._start_call(
            agent_id, capability, payload, True, None, timeout_ms, message_id
        )
        return Conversation(
            call,
            conversation_id,
            self._outstanding,
            self.send_input,
            self.request_timeout if timeout is None else timeout + LOBBY_GRACE,
            self.cancel,
        )

    async def send_input(
        self,
        agent_id: str,
        conversation_id: str,
        answer: Answer,
        *,
        message_id: str | None = None,
    ) -> None:
        """Answer the ask of `agent_id` in `conversation_id`: an INPUT carrying `answer` (a
        dict or a model), with `message_id` if given. The lobby refuses it
        (`invalid_dialogue`) unless the capability asked."""
        await self.send(
            agent_id,
            MessageType.INPUT,
            input_payload(answer),
            conversation_id=conversation_id,
            message_id=message_id,
        )

    async def _start_call(
        self,
        agent_id: str,
        capability: str,
        payload: dict[str, Any] | BaseModel | None,
        stream: bool,
        conversation_id: str | None = None,
        timeout_ms: int | None = None,
        message_id: str | None = None,
    ) -> tuple[str, Call]:
        data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
        if conversation_id is None:
            conversation_id = self.new_id()
        elif conversation_id in self._outstanding.calls:
            raise ValueError(f"a call in conversation {conversation_id!r} is already awaited")
        call = self._outstanding.call(conversation_id, agent_id, capability, stream=stream)
        try:
            await self.send(
                agent_id,
                MessageType.REQUEST,
                {**(data or {}), "capability_name": capability},
                conversation_id=conversation_id,
                timeout_ms=timeout_ms,
                message_id=message_id,
            )
        except BaseException:
            self._outstanding.forget(conversation_id)
            raise
        return conversation_id, call


async def _with_progress(call: Call, on_progress: Progress) -> dict[str, Any]:
    """The final RESPONSE payload of `call`, handing each update to `on_progress` first."""
    assert call.updates is not None
    while True:
        update = asyncio.ensure_future(call.updates.get())
        try:
            await asyncio.wait({update, call.result}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            update.cancel()
        if update.done() and not update.cancelled():
            await _report(on_progress, update.result())
            continue
        while not call.updates.empty():
            await _report(on_progress, call.updates.get_nowait())
        return call.result.result()


def _reporting(on_progress: Progress) -> Callable[[dict[str, Any]], Awaitable[None]]:
    async def report(update: dict[str, Any]) -> None:
        await _report(on_progress, update)

    return report


async def _report(on_progress: Progress, update: dict[str, Any]) -> None:
    """Hand one update to `on_progress`, awaiting what it returns if that is awaitable (a
    plain function returns None)."""
    outcome = on_progress(update)
    if inspect.isawaitable(outcome):
        await outcome


def _result(payload: dict[str, Any], output_type: type[M] | None) -> Any:
    data = {k: v for k, v in payload.items() if k != "status"}
    if output_type is None:
        return data
    try:
        return output_type.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(
            f"the RESPONSE does not fit {output_type.__name__}: {exc}", exc.errors()
        ) from None
