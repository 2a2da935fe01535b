"""Multi-turn calls across the MCP bridges: a lobby `input_required` is an MCP elicitation.

`lobby mcp` (a lobby capability as an MCP tool): a provider that asks for input mid-call (an
`in_progress` RESPONSE with `input_required`, PROTOCOL.md §5.3) makes the bridge send its MCP
client `elicitation/create` (form mode), related to the tool call; the form's answer
(`accept`) is sent to the provider as INPUT, its `content` the payload. `decline` or `cancel`
ends the call: its REQUEST is cancelled (CANCEL) and the tool call answered with the tool error
`input_declined: ...` (so does a client that answers the elicitation with an error). A client
that declared no form elicitation cannot be asked: the REQUEST is cancelled and the tool error
is `input_required: ...`, quoting what the provider asked.

The form (`elicitation_form()`): its message is the ask's `question` when that is a string,
else the ask as JSON; its schema is the ask's `schema` when that is a form MCP allows (an
object whose properties are strings, numbers, integers or booleans, optionally enums), else one
field, `answer`: a string, limited to the ask's `choices` when those are strings.

`lobby bridge mcp` (an MCP server as a lobby agent): the server's `elicitation/create` during a
tool call becomes the provider's ask to its lobby requester, `input_required`
`{"question": <message>, "schema": <requestedSchema>}`, and the requester's INPUT the form's
answer (`accept`, the INPUT's payload its `content`: an object of strings, numbers, booleans
or lists of strings). The MCP Python client takes no note of which call a server's request
belongs to, so the bridge asks the requester of the one call in flight; with none or several in
flight it answers the server with an error. The MCP Python client reads nothing else from the
server while an elicitation waits for its answer; a call that ends meanwhile (cancelled, at its
deadline) answers the elicitation `cancel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import mcp.types as types
from mcp import McpError
from mcp.server.session import ServerSession

from agent_sdk.capability import RequestContext
from agent_sdk.errors import InputRequiredError, RequestError, with_code

INPUT_REQUIRED = "input_required"
"""The code in the text of a tool error for a call whose provider asked for input that the MCP
client cannot be asked for (it declared no form elicitation)."""
INPUT_DECLINED = "input_declined"
"""The code in the text of a tool error for a call whose elicitation was declined or cancelled."""

_FORM_TYPES = frozenset({"string", "number", "integer", "boolean"})


class InputDeclined(Exception):
    """The MCP client declined or cancelled the elicitation of a provider's ask, or answered it
    with an error; `answer` says which, in words."""

    def __init__(self, answer: str) -> None:
        super().__init__(f"the MCP client answered the elicitation {answer}")


def elicits(session: ServerSession) -> bool:
    """Whether the client of `session` declared form elicitation (an `elicitation` capability
    with no mode named is form mode, as MCP 2025-06-18 had it)."""
    params = session.client_params
    elicitation = params.capabilities.elicitation if params is not None else None
    if elicitation is None:
        return False
    return elicitation.form is not None or elicitation.url is None


def elicitation_form(asked: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The message and requested schema of the form that asks what `asked` (an `input_required`
    object) asks."""
    question = asked.get("question")
    message = question if isinstance(question, str) else json.dumps(asked, ensure_ascii=False)
    schema = asked.get("schema")
    if isinstance(schema, dict) and _is_form(schema):
        return message, schema
    answer: dict[str, Any] = {"type": "string"}
    choices = asked.get("choices")
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        answer["enum"] = choices
    return message, {"type": "object", "properties": {"answer": answer}, "required": ["answer"]}


def _is_form(schema: dict[str, Any]) -> bool:
    """Whether `schema` is a schema MCP lets a form request: an object of primitive fields."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        return False
    return all(
        isinstance(field, dict) and field.get("type") in _FORM_TYPES
        for field in properties.values()
    )


def elicitor(
    session: ServerSession, request_id: types.RequestId, timeout: float
) -> Any:  # an agent_sdk.turns.OnInput
    """The `on_input` of a tool call `request_id` on `session`: each ask becomes a form
    elicitation related to that call, its accepted content the INPUT. Raises `InputDeclined`
    when the client declines or cancels, `TimeoutError` past `timeout` seconds from now (the
    call's deadline: past it the answer would come too late)."""
    deadline = asyncio.get_running_loop().time() + timeout

    async def on_input(asked: dict[str, Any]) -> dict[str, Any]:
        message, schema = elicitation_form(asked)
        try:
            async with asyncio.timeout_at(deadline):
                result = await session.elicit_form(message, schema, related_request_id=request_id)
        except McpError as exc:  # a client that refuses the form: no answer is coming
            raise InputDeclined(f"with the error {exc.error.message!r}") from None
        if result.action != "accept":
            raise InputDeclined(repr(result.action))
        return dict(result.content or {})

    return on_input


def unanswered_ask(
    request: asyncio.Future[Any], agent_id: str, capability: str
) -> types.CallToolResult | None:
    """The tool error of a finished call whose provider asked for input that did not come (the
    client cannot be asked, declined, or did not answer in time); None for any other end."""
    exc = request.exception()
    if isinstance(exc, InputRequiredError):
        asked = json.dumps(exc.asked, ensure_ascii=False)
        return _tool_error(
            INPUT_REQUIRED,
            f"capability {capability!r} on agent {agent_id!r} asks for input ({asked}), and this "
            "MCP client cannot be asked: it declared no form elicitation; the call is cancelled",
        )
    if isinstance(exc, InputDeclined):
        return _tool_error(
            INPUT_DECLINED,
            f"capability {capability!r} on agent {agent_id!r} asked for input and {exc}; the "
            "call is cancelled",
        )
    if isinstance(exc, TimeoutError) and not isinstance(exc, RequestError):
        return _tool_error(
            "timeout",
            f"capability {capability!r} on agent {agent_id!r} asked for input and the MCP "
            "client did not answer before the call's deadline; the call is cancelled",
        )
    return None


def _tool_error(code: str, error: str) -> types.CallToolResult:
    """As `bridges.mcp.tool_error`."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=with_code(code, error))], isError=True
    )


class Elicitations:
    """`lobby bridge mcp`'s tool calls in flight, to hand a server's elicitation to the lobby
    requester of the call it belongs to. `calling(ctx)` around each call; `elicit` is the
    client session's `elicitation_callback`."""

    def __init__(self) -> None:
        self._calls: dict[int, tuple[RequestContext, asyncio.Event]] = {}
        self._next = 0

    @contextlib.asynccontextmanager
    async def calling(self, ctx: RequestContext) -> AsyncIterator[None]:
        key, self._next = self._next, self._next + 1
        ended = asyncio.Event()
        self._calls[key] = (ctx, ended)
        try:
            yield
        finally:
            ended.set()
            del self._calls[key]

    async def elicit(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        if not isinstance(params, types.ElicitRequestFormParams):
            return types.ErrorData(
                code=types.INVALID_PARAMS,
                message="the lobby bridge asks its requesters in form mode only, not by URL",
            )
        if len(self._calls) != 1:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"the lobby bridge has {len(self._calls)} tool calls in flight, not one, "
                "and cannot tell whose requester to ask",
            )
        [(ctx, ended)] = self._calls.values()
        asked = {"question": params.message, "schema": params.requestedSchema}
        ask = asyncio.ensure_future(ctx.ask(asked))
        end = asyncio.ensure_future(ended.wait())
        try:
            await asyncio.wait({ask, end}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            end.cancel()
            if not ask.done():
                ask.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ask
        if ask.cancelled() or ask.exception() is not None:
            return types.ElicitResult(action="cancel")
        return form_answer(ask.result())


def form_answer(payload: dict[str, Any]) -> types.ElicitResult | types.ErrorData:
    """The elicitation's answer that an INPUT `payload` gives: `accept` with it as the content,
    if each value is one a form holds (a string, number, boolean, list of strings or null)."""
    for name, value in payload.items():
        if not (
            value is None
            or isinstance(value, str | int | float | bool)
            or (isinstance(value, list) and all(isinstance(item, str) for item in value))
        ):
            return types.ErrorData(
                code=types.INVALID_PARAMS,
                message=f"the requester's answer holds {name!r}, which is no form value "
                "(a string, number, boolean or list of strings)",
            )
    return types.ElicitResult(action="accept", content=payload)
