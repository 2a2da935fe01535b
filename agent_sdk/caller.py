"""The calling side of an agent: request/response, streaming, discovery, questions to the lobby."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from agent_sdk.calls import Call
from agent_sdk.core import AgentCore
from agent_sdk.errors import (
    AgentSDKError,
    LobbyError,
    PayloadError,
    RequestError,
    RequestTimeoutError,
)
from agent_sdk.turns import Answer, Conversation, OnInput, answering, input_payload
from protocol.models import LOBBY_ID, Message, MessageType
from protocol.payloads import MAX_DISCOVER_LIMIT, ServiceRecord, ServicesAvailablePayload

M = TypeVar("M", bound=BaseModel)
LOBBY_GRACE = 1.0
"""Seconds a call with a `timeout` waits past it for the lobby's `timeout` answer (the lobby
checks deadlines twice a second) before its own timer fails it."""
Progress = Callable[[dict[str, Any]], Awaitable[None] | None]
"""What `request(on_progress=...)` calls with each `in_progress` update: a coroutine function
(awaited) or a plain function."""


class Caller(AgentCore):
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
            # Past the deadline, the shared timer fails the call with RequestTimeoutError.
            if on_input is not None:
                progress = None if on_progress is None else _reporting(on_progress)
                turns = answering(call, conversation_id, progress, on_input, self.send_input)
                result = await _with_progress(call, turns)
            elif on_progress is not None:
                result = await _with_progress(call, on_progress)
            else:
                result = await call.result
        except asyncio.CancelledError:
            self._handlers.spawn(self._cancel_quietly(conversation_id))
            raise
        finally:
            outstanding.forget(conversation_id)
        return _result(result, output_type)

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

    async def discover(
        self,
        capability_name: str | None = None,
        *,
        keywords: list[str] | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> list[ServiceRecord]:
        """Agents (other than this one) offering a capability, by name and/or keywords: every
        match, by agent id. The lobby answers in pages; this follows them to the end,
        `page_size` capabilities per DISCOVER (None: the lobby's default, 100; at most 200).
        `timeout` is per page."""
        payload: dict[str, Any] = {}
        if capability_name is not None:
            payload["capability_name"] = capability_name
        if keywords is not None:
            payload["keywords"] = keywords
        if page_size is not None:
            payload["limit"] = page_size
        return await self._pages(payload, None, timeout)

    async def search(
        self,
        query: str | None = None,
        *,
        algorithm: str | None = None,
        filters: list[dict[str, Any]] | None = None,
        capability_name: str | None = None,
        keywords: list[str] | None = None,
        limit: int = 50,
        offset: int = 0,
        timeout: float | None = None,
    ) -> list[ServiceRecord]:
        """Ranked search (`simple`, `filtered`, `lexical`; default lexical with a query):
        services in rank order, each with its `score`. Filters match capability `attributes`:
        `{"attribute": "price", "op": "lt", "value": 10}`. Up to `limit` capabilities from rank
        `offset` (a lexical search serves ranks below 1000), fetched in as many pages as that
        takes; `timeout` is per page."""
        payload: dict[str, Any] = {"algorithm": algorithm or ("lexical" if query else "filtered")}
        optional = {
            "query": query,
            "filters": filters,
            "capability_name": capability_name,
            "keywords": keywords,
        }
        payload.update({k: v for k, v in optional.items() if v is not None})
        if offset:
            payload["offset"] = offset
        return await self._pages(payload, limit, timeout)

    async def _pages(
        self, query: dict[str, Any], want: int | None, timeout: float | None
    ) -> list[ServiceRecord]:
        """DISCOVER_SERVICES `query`, then each answer's `next`, until there is none or `want`
        capabilities came; an agent listed on several pages is merged into its first place."""
        found: dict[str, ServiceRecord] = {}
        got = 0
        payload = dict(query)
        while want is None or got < want:
            if want is not None:
                payload["limit"] = min(want - got, MAX_DISCOVER_LIMIT)
            reply = await self.ask_lobby(MessageType.DISCOVER_SERVICES, payload, timeout=timeout)
            answer = ServicesAvailablePayload.model_validate(reply.payload)
            for service in answer.services_found:
                got += len(service.relevant_capabilities)
                first = found.get(service.agent_id)
                if first is not None:
                    more = [*first.relevant_capabilities, *service.relevant_capabilities]
                    service = first.model_copy(update={"relevant_capabilities": more})
                found[service.agent_id] = service
            if answer.next is None:
                break
            payload = {k: v for k, v in payload.items() if k != "offset"}
            payload["cursor"] = answer.next
        return list(found.values())

    async def ask_lobby(
        self,
        message_type: MessageType,
        payload: dict[str, Any],
        *,
        timeout: float | None = None,
        receiver_id: str = LOBBY_ID,
    ) -> Message:
        """Send a message and return the lobby's answer in its conversation; `LobbyError` if
        it is an ERROR. Usually to the lobby itself; a PAYMENT goes to the payee and the
        lobby answers with PAYMENT_CONFIRMED."""
        conversation_id = self.new_id()
        future = self._outstanding.question(conversation_id)
        try:
            async with asyncio.timeout(timeout or self.request_timeout):
                await self.send(receiver_id, message_type, payload, conversation_id=conversation_id)
                reply = await future
        except TimeoutError:
            raise RequestTimeoutError(f"no reply from the lobby to {message_type}") from None
        finally:
            self._outstanding.forget(conversation_id)
        if reply.message_type is MessageType.ERROR:
            raise LobbyError(str(reply.payload.get("code")), str(reply.payload.get("error")))
        return reply

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
