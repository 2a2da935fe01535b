"""The serving side of an agent: a REQUEST for one of its capabilities, validated and answered."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from agent_sdk.capability import RequestContext, error_response_to, response_to
from agent_sdk.core import AgentCore
from agent_sdk.errors import CapabilityError
from agent_sdk.logs import log
from protocol.models import ErrorCode, Message, MessageType, ResponseStatus


class CapabilityServer(AgentCore):
    """Answers each REQUEST with the handler of its capability (`self.capabilities`); mixed
    into `Agent`. The route of REQUEST."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self._routes[MessageType.REQUEST] = self._serve_request

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
        )
        try:
            if spec.timeout is None:  # no timeout scope to enter: about 2 us a REQUEST
                result = await spec.handler(self, argument, ctx)
            else:
                async with asyncio.timeout(spec.timeout):
                    result = await spec.handler(self, argument, ctx)
            output = {**spec.dump_output(result), "status": ResponseStatus.SUCCESS}
        except CapabilityError as exc:
            output = {"status": ResponseStatus.ERROR, "code": exc.code, "error": exc.message}
        except TimeoutError:
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
        await self._sender.send_quietly(response_to(message, output))


def _summary(exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
        for err in exc.errors()[:5]
    )
    return f"invalid input: {problems}"
