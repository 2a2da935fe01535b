"""The serving side of an agent: a REQUEST for one of its capabilities, validated and answered."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Coroutine, Iterable
from contextvars import copy_context
from typing import Any, cast

from pydantic import ValidationError

from agent_sdk.caller import Caller
from agent_sdk.capability import CapabilitySpec, RequestContext, error_response_to, response_to
from agent_sdk.errors import AgentSDKError, CapabilityError
from agent_sdk.logs import log
from agent_sdk.stats import AgentStats
from agent_sdk.turns import Inputs
from protocol.models import ErrorCode, Message, MessageType, ResponseStatus

DEADLINE_GRACE = 1.0
"""Seconds a handler may run past its REQUEST's deadline, waiting for the lobby's CANCEL
(the lobby checks deadlines twice a second), before the agent stops it itself."""


class CapabilityServer(Caller):
    """Answers each REQUEST with the handler of its capability (`self.capabilities`); mixed
    into `Agent`. The route of REQUEST. Owns each rate-limited capability's `TokenBucket`.

    Before a handler runs, in this order: the capability exists (`capability_not_found`), the
    requester is authorized (`unauthorized`), the rate limit has room (`rate_limited`), the
    input fits (`invalid_input`)."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self._routes[MessageType.REQUEST] = self._serve_request
        self._routes[MessageType.CANCEL] = self._cancel_serving
        self._serving: dict[tuple[str, str | None], tuple[RequestContext, asyncio.Task[Any]]] = {}
        """(requester, REQUEST message_id) -> the handler serving it and its task, for CANCEL."""
        self._inputs = Inputs(self.agent_id)
        self._routes[MessageType.INPUT] = self._inputs.receive
        now = time.monotonic()
        self._buckets = {
            name: spec.rate_limit.bucket(now)
            for name, spec in self.capabilities.items()
            if spec.rate_limit is not None
        }

    async def set_authorized(self, capability: str, requester_ids: Iterable[str] | None) -> None:
        """Change who may call `capability` (None: anyone), at run time. The agent enforces
        it at once; it is sent to the lobby (UPDATE_CAPABILITIES, its
        `authorized_requester_ids`) and this returns once the lobby has it too."""
        spec = self.capabilities.get(capability)
        if spec is None:
            raise ValueError(f"agent {self.agent_id!r} has no capability {capability!r}")
        authorized = tuple(requester_ids) if requester_ids is not None else None
        self.capabilities[capability] = dataclasses.replace(spec, authorized=authorized)
        await self.update_capabilities()
        # The lobby handles a connection's messages in order and answers UPDATE_CAPABILITIES
        # only when it refuses it: its answer to a question sent next marks the update done.
        await self.ask_lobby(MessageType.DISCOVER_SERVICES, {"capability_name": capability})

    def _serve_request(self, message: Message) -> Coroutine[Any, Any, None] | None:
        """The route of REQUEST: the coroutine serving it, or None when it was served here and
        now. That is so for a capability whose handler never awaits (`CapabilitySpec.immediate`)
        when nothing asks for more (authorized requesters, a rate limit, a trace) and a handler
        slot is free: a task per REQUEST was the largest share of serving one. The answer is
        the same, run in a copy of the context as a task would be."""
        spec = self.capabilities.get(str(message.payload.get("capability_name")))
        if (
            spec is None
            or not spec.immediate
            or spec.authorized is not None
            or spec.rate_limit is not None
            or message.traceparent is not None
            or self._tracing.spans
            or not self._handlers.free
        ):
            return self._serve_in_task(message)
        try:
            copy_context().run(self._serve_now, spec, message)
        except Exception:  # as `Handlers` takes a task's failure: counted, logged, not retried
            self.stats.handler_errors += 1
            log.exception("CALLBACK_FAILED", agent_id=self.agent_id)
        return None

    def _serve_now(self, spec: CapabilitySpec, message: Message) -> None:
        """Serve `message` with `spec`'s handler, which never suspends, at once."""
        payload = message.payload
        data = {k: v for k, v in payload.items() if k != "capability_name"}
        try:
            argument = spec.parse_input(data)
        except ValidationError as exc:
            self._answer_now(error_response_to(message, ErrorCode.INVALID_INPUT, _summary(exc)))
            return
        ctx = RequestContext(
            message.sender_id,
            message.conversation_id or "",
            spec.name,
            message,
            self._sender.send,
            self.agent_id,
            self._inputs,
        )
        work = cast(Coroutine[Any, Any, Any], spec.handler(self, argument, ctx))
        try:
            try:
                work.send(None)
            except StopIteration as done:
                output = {**spec.dump_output(done.value), "status": ResponseStatus.SUCCESS}
            else:  # `never_suspends` was wrong: cannot happen, but never leave it half run
                work.close()
                raise RuntimeError(f"the handler of {spec.name!r} awaited")
        except CapabilityError as exc:
            output = {"status": ResponseStatus.ERROR, "code": exc.code, "error": exc.message}
        except TimeoutError:
            if _bound(spec, message) != spec.timeout:
                self._dispatcher.ended(ctx.conversation_id)
                return  # read as in `_serve_in_task`: its deadline, answered by the lobby
            output = _timed_out(spec)
        except (Exception, asyncio.CancelledError):  # raised, not cancelled: it never waits
            output = _failed(self.agent_id, spec.name, self.stats)
        self._answer_now(response_to(message, output))

    def _answer_now(self, reply: Message) -> None:
        """Send `reply` at once if that needs no wait, else in a task (`send_quietly`)."""
        sender = self._sender
        try:
            if sender.send_now(reply):
                return
        except AgentSDKError as exc:
            log.warning("RESPONSE_NOT_SENT", agent_id=self.agent_id, error=str(exc))
            return
        self._handlers.spawn(sender.send_quietly(reply))

    async def _serve_in_task(self, message: Message) -> None:
        payload = message.payload
        name = str(payload.get("capability_name"))
        spec = self.capabilities.get(name)
        if spec is None:
            reply = error_response_to(
                message,
                ErrorCode.CAPABILITY_NOT_FOUND,
                f"Capability '{name}' not found on agent '{self.agent_id}'.",
            )
            await self._sender.send_quietly(reply)
            return
        if spec.authorized is not None and message.sender_id not in spec.authorized:
            reply = error_response_to(
                message,
                ErrorCode.UNAUTHORIZED,
                f"Agent '{message.sender_id}' is not authorized to call '{name}'.",
            )
            await self._sender.send_quietly(reply)
            return
        bucket = self._buckets.get(name)
        if bucket is not None and not bucket.take(time.monotonic()):
            reply = error_response_to(
                message,
                ErrorCode.RATE_LIMITED,
                f"capability '{name}' is over its rate limit; try again later",
            )
            await self._sender.send_quietly(reply)
            return
        data = {k: v for k, v in payload.items() if k != "capability_name"}
        try:
            argument = spec.parse_input(data)
        except ValidationError as exc:
            reply = error_response_to(message, ErrorCode.INVALID_INPUT, _summary(exc))
            await self._sender.send_quietly(reply)
            return
        ctx = RequestContext(
            message.sender_id,
            message.conversation_id or "",
            name,
            message,
            self._sender.send,
            self.agent_id,
            self._inputs,
        )
        timeout = _bound(spec, message)
        key = (message.sender_id, message.message_id)
        self._serving[key] = (ctx, asyncio.current_task())  # type: ignore[assignment]
        try:
            if timeout is None:  # no timeout scope to enter: about 2 us a REQUEST
                result = await spec.handler(self, argument, ctx)
            else:
                async with asyncio.timeout(timeout):
                    result = await spec.handler(self, argument, ctx)
            output = {**spec.dump_output(result), "status": ResponseStatus.SUCCESS}
        except asyncio.CancelledError:
            if not ctx.cancelled.is_set():
                raise  # the agent stops
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return  # the lobby ended the REQUEST and answered its requester
        except CapabilityError as exc:
            output = {"status": ResponseStatus.ERROR, "code": exc.code, "error": exc.message}
        except TimeoutError:
            if timeout != spec.timeout:
                self._dispatcher.ended(ctx.conversation_id)
                return  # its deadline: the lobby answers the requester `timeout`
            output = _timed_out(spec)
        except Exception:
            output = _failed(self.agent_id, name, self.stats)
        finally:
            self._serving.pop(key, None)
        # `send_quietly`, inlined: one coroutine less on every REQUEST.
        try:
            await self._sender.send(response_to(message, output))
        except AgentSDKError as exc:
            log.warning("RESPONSE_NOT_SENT", agent_id=self.agent_id, error=str(exc))

    def _cancel_serving(self, message: Message) -> None:
        """CANCEL from the lobby: stop the handler serving the REQUEST it names (set its
        `ctx.cancelled`, cancel its task); what the lobby says of it afterwards is quiet."""
        requester = message.payload.get("requester_id")
        self._dispatcher.ended(message.conversation_id or "")
        serving = self._serving.pop((str(requester), message.in_reply_to), None)
        log.info(
            "REQUEST_CANCELLED",
            agent_id=self.agent_id,
            requester=requester,
            conversation_id=message.conversation_id,
            reason=message.payload.get("reason"),
            serving=serving is not None,
        )
        if serving is not None:
            ctx, task = serving
            ctx.cancelled.set()
            task.cancel()


def _bound(spec: CapabilitySpec, message: Message) -> float | None:
    """Seconds the handler serving `message` may run: the capability's timeout, and its
    REQUEST's deadline (the lobby CANCELs it then; this bound is for a CANCEL that never
    comes)."""
    timeout = spec.timeout
    if message.deadline is not None:
        left = message.deadline / 1000 - time.time() + DEADLINE_GRACE
        timeout = left if timeout is None else min(timeout, left)
    return timeout


def _timed_out(spec: CapabilitySpec) -> dict[str, Any]:
    return {
        "status": ResponseStatus.ERROR,
        "code": "timeout",
        "error": f"capability '{spec.name}' did not finish in {spec.timeout} s",
    }


def _failed(agent_id: str, name: str, stats: AgentStats) -> dict[str, Any]:
    """Count and log the exception being handled (a handler's bug); the answer it gets."""
    stats.handler_errors += 1
    log.exception("CAPABILITY_FAILED", agent_id=agent_id, capability=name)
    return {
        "status": ResponseStatus.ERROR,
        "code": ErrorCode.INTERNAL,
        "error": f"capability '{name}' failed with an internal error",
    }


def _summary(exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
        for err in exc.errors()[:5]
    )
    return f"invalid input: {problems}"
