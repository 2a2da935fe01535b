"""`@capability`: declare a capability as an async method whose types are its schemas.

    class PriceHunter(Agent):
        @capability("find_cheapest_item_price_v2", authorized=["search_agent"])
        async def find_cheapest(self, request: PriceQuery, ctx: RequestContext) -> PriceResult:
            ...

The input annotation (a pydantic model) validates the REQUEST payload before the handler runs
and becomes the capability's `input_schema`; the return annotation becomes its
`output_schema`. Annotate with `dict[str, Any]` to take or give the raw payload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import dis
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel

from agent_sdk.policy import RateLimit
from agent_sdk.turns import Inputs, ask
from protocol.models import Message, MessageType, ResponseStatus
from protocol.payloads import Capability

Handler = Callable[..., Awaitable[Any]]
H = TypeVar("H", bound=Handler)

_ATTRIBUTE = "__agent_capability__"


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """A declared capability: its wire description plus how to call its handler."""

    name: str
    description: str
    keywords: tuple[str, ...]
    authorized: tuple[str, ...] | None
    timeout: float | None
    handler: Handler
    rate_limit: RateLimit | None
    input_type: type[BaseModel] | None
    output_type: type[BaseModel] | None
    attributes: dict[str, Any] | None = field(default=None, hash=False)
    """What a DISCOVER's or a capability-addressed REQUEST's filters match."""
    immediate: bool = False
    """The handler never awaits (`never_suspends`): it is run as its REQUEST is read, not in
    a task of its own (`CapabilityServer._serve_request`)."""

    def to_capability(self) -> Capability:
        return Capability(
            name=self.name,
            description=self.description,
            input_schema=self.input_type.model_json_schema() if self.input_type else {},
            output_schema=self.output_type.model_json_schema() if self.output_type else {},
            keywords=list(self.keywords),
            authorized_requester_ids=list(self.authorized) if self.authorized else None,
            attributes=self.attributes,
        )

    def parse_input(self, data: dict[str, Any]) -> Any:
        """The handler's argument; raises `pydantic.ValidationError` on a bad payload."""
        return self.input_type.model_validate(data) if self.input_type else data

    @staticmethod
    def dump_output(result: Any) -> dict[str, Any]:
        if isinstance(result, BaseModel):
            return result.model_dump(mode="json")
        if result is None:
            return {}
        if isinstance(result, dict):
            return result
        raise TypeError(
            f"a capability must return a pydantic model, a dict or None, not {type(result)!r}"
        )


def capability(
    name: str,
    *,
    description: str | None = None,
    keywords: Sequence[str] = (),
    authorized: Sequence[str] | None = None,
    timeout: float | None = None,
    rate_limit: RateLimit | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Callable[[H], H]:
    """Declare the decorated `async def handler(self, request, ctx)` as capability `name`.

    `authorized` lists the agent ids allowed to call it (the lobby enforces it, and the agent
    too; `Agent.set_authorized()` changes it at run time); `None` means public. `description`
    defaults to the docstring's first line. `timeout` bounds one call of the handler; past it
    the caller gets status `error`, code `timeout` (`RemoteTimeoutError`). `rate_limit`
    (`RateLimit(calls=10, per=1.0)`) answers REQUESTs past it with code `rate_limited`
    (`RateLimitedError`) before the handler runs. `attributes` (`{"region": "eu"}`: strings,
    numbers, booleans, lists of strings) are what filters match, a DISCOVER's or a `call()`'s.
    """

    def declare(handler: H) -> H:
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(f"capability {name!r}: the handler must be an async def")
        doc = (inspect.getdoc(handler) or "").strip().splitlines()
        spec = CapabilitySpec(
            name=name,
            description=description if description is not None else (doc[0] if doc else ""),
            keywords=tuple(keywords),
            authorized=tuple(authorized) if authorized else None,
            timeout=timeout,
            handler=handler,
            rate_limit=rate_limit,
            input_type=None,
            output_type=None,
            attributes=dict(attributes) if attributes else None,
            immediate=never_suspends(handler),
        )
        setattr(handler, _ATTRIBUTE, spec)
        return handler  # type: ignore[return-value]  # H narrowed by the check above

    return declare


def never_suspends(function: Callable[..., Any]) -> bool:
    """True if the coroutine `function` makes has no point where it could suspend (no
    `await`, `async with` or `async for`: each compiles to a YIELD_VALUE), so it runs to its
    end at its first step, and cannot be cancelled or timed out midway."""
    code = getattr(function, "__code__", None)
    return code is not None and all(i.opname != "YIELD_VALUE" for i in dis.get_instructions(code))


def collect_capabilities(cls: type) -> dict[str, CapabilitySpec]:
    """The capabilities declared on `cls` and its bases (a subclass's override wins)."""
    found: dict[str, CapabilitySpec] = {}
    for klass in reversed(cls.__mro__):
        for attribute in vars(klass).values():
            spec: CapabilitySpec | None = getattr(attribute, _ATTRIBUTE, None)
            if spec is not None:
                found[spec.name] = _with_types(spec)
    return found


def _with_types(spec: CapabilitySpec) -> CapabilitySpec:
    """Resolve the handler's annotations (deferred until the class exists)."""
    hints = get_type_hints(spec.handler)
    params = [p for p in inspect.signature(spec.handler).parameters if p != "self"]
    if not params:
        raise TypeError(f"capability {spec.name!r}: the handler must take the request")
    input_type = _model_or_none(hints.get(params[0]))
    output_type = _model_or_none(hints.get("return"))
    return dataclasses.replace(spec, input_type=input_type, output_type=output_type)


def _model_or_none(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


@dataclass(slots=True)
class RequestContext:
    """What a capability handler knows about the call it serves, and how to report progress."""

    requester_id: str
    conversation_id: str
    capability: str
    message: Message
    _send: Callable[[Message], Awaitable[None]] = field(repr=False)
    _agent_id: str = field(repr=False)
    _inputs: Inputs | None = field(default=None, repr=False)
    answer: Message | None = None
    """The INPUT that answered this handler's last `ask()` (its payload is what `ask()`
    returned), if any."""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set when the lobby tells this agent to stop (CANCEL: the requester cancelled, or the
    deadline passed); the handler's task is cancelled at the same moment, so a handler sees
    it only in cleanup (`finally`) or in work it shields. No RESPONSE is sent after it."""

    @property
    def deadline(self) -> float | None:
        """When the requester stops waiting (Unix time in seconds, the lobby's clock), if the
        REQUEST has a deadline: the handler is cancelled soon after it."""
        deadline = self.message.deadline
        return None if deadline is None else deadline / 1000

    @property
    def traceparent(self) -> str | None:
        """The W3C trace of this call (what the handler sends carries it too), if any."""
        return self.message.traceparent

    async def ask(
        self, question: dict[str, Any] | BaseModel, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Ask the requester for input and return its answer (the INPUT's payload): sends an
        `in_progress` RESPONSE with `input_required` = `question` (free form, e.g.
        `{"question": "Which size?"}`). Waits up to `timeout` seconds (None: as long as the
        capability's own timeout allows), then raises `TimeoutError`."""
        data = CapabilitySpec.dump_output(question)
        self.answer = await ask(self._inputs, self._send, self.message, data, timeout)
        return self.answer.payload

    async def progress(self, update: dict[str, Any] | BaseModel) -> None:
        """Send an `in_progress` RESPONSE; the caller's `request_stream()` yields it."""
        data = CapabilitySpec.dump_output(update)
        payload = {**data, "status": ResponseStatus.IN_PROGRESS}
        await self._send(
            Message(
                self._agent_id,
                self.requester_id,
                MessageType.RESPONSE,
                payload,
                self.conversation_id,
                in_reply_to=self.message.message_id,
            )
        )


def response_to(request: Message, payload: dict[str, Any]) -> Message:
    """The RESPONSE its receiver sends to `request`, carrying `payload`."""
    return Message(
        request.receiver_id,
        request.sender_id,
        MessageType.RESPONSE,
        payload,
        request.conversation_id,
        in_reply_to=request.message_id,
    )


def error_response_to(request: Message, code: str, error: str) -> Message:
    """A RESPONSE with status `error` to `request`."""
    return response_to(request, {"status": ResponseStatus.ERROR, "code": code, "error": error})
