"""The serving side of an agent: a REQUEST for one of its capabilities, validated and answered."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from agent_sdk.caller import Caller
from agent_sdk.capability import RequestContext, error_response_to, response_to
from agent_sdk.errors import AgentSDKError, CapabilityError
from agent_sdk.logs import log
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

    async def _serve_request(self, message: Message) -> None:
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
        timeout = spec.timeout
        if message.deadline is not None:
            # The lobby CANCELs it at its deadline; this bound is for a CANCEL that never comes.
            left = message.deadline / 1000 - time.time() + DEADLINE_GRACE
            timeout = left if timeout is None else min(timeout, left)
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
            output = {
                "status": ResponseStatus.ERROR,
                "code": "timeout",
                "error": f"capability '{name}' did not finish in {spec.timeout} s",
            }
        except Exception:
            self.stats.handler_errors += 1
            log.exception("CAPABILITY_FAILED", agent_id=self.agent_id, capability=name)
            output = {
                "status": ResponseStatus.ERROR,
                "code": ErrorCode.INTERNAL,
                "error": f"capability '{name}' failed with an internal error",
            }
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


def _summary(exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
        for err in exc.errors()[:5]
    )
    return f"invalid input: {problems}"
