"""Lobby agents as MCP tools: `lobby mcp --agent-id ID` (an MCP server that is an SDK agent).

The server connects to the lobby as agent ID (its token kept as any SDK agent keeps it,
`agent_sdk.identity`) and offers every capability that agent may call (public, or listing it in
`authorized_requester_ids`) on an agent that is online as one MCP tool:

    tool name      `<agent id>.<capability name>`, each part escaped (`tool_name()`)
    description    the capability's description; `title`: "<capability> on <agent id>"
    inputSchema    its `input_schema` (`{"type": "object"}` when it declares none)
    outputSchema   its `output_schema` when that describes an object and compiles, else none

A tool call is a REQUEST from agent ID; each `in_progress` RESPONSE becomes a progress
notification (when the client asked for progress), the final one the tool's result (the
payload without `status`, as `structuredContent` and as JSON text). A refusal or failure is a
tool error (`isError`) whose one text block is "<code>: <sentence>" (`unauthorized`,
`capability_not_found`, `invalid_input`: the lobby checks the arguments, not the bridge), with
no `structuredContent`, which MCP clients check against the tool's output schema. An answer
that does not fit the output schema (the lobby does not check answers) is the tool error
`invalid_output: ...`, not a result the client would refuse.
A provider's ask for input mid-call (`input_required`) is an elicitation to the client, its
answer the INPUT (`bridges.mcp_input`).

Offline agents' tools are not listed: a REQUEST to them would be held until they connect, and
a client (or a model) has no use for a tool that cannot answer now. A call to one is answered
at once with the tool error `agent_offline: ...`, no REQUEST sent; a call waiting for an agent
that a reading finds offline meanwhile ends with the same code, and its REQUEST is cancelled
(CANCEL: the lobby drops the copy it holds). Every REQUEST carries a deadline (`timeout_ms`,
`--call-timeout`, 30 s by default: an MCP request carries no timeout of its own), so a call to
an agent gone offline since the last reading ends at its deadline at the latest, with the tool
error `timeout: ...`. A client's `notifications/cancelled` for a tool call cancels its REQUEST
the same way: the provider is told to stop (CANCEL).

The tools follow the registry: the server rereads it (DISCOVER_SERVICES, which says who is
online) every `refresh` seconds, on every `tools/list` and before calling a tool it does not
list, and sends `notifications/tools/list_changed` to each client session when the list
changed.

Escaping (MCP tool names are `[A-Za-z0-9_.-]`, at most 128 characters): letters, digits and
`_` stay; `-` becomes `--`; any other character becomes `-` and the two lowercase hex digits of
each of its UTF-8 bytes (`.` is `-2e`); the two parts are joined by `.`. So `price-hunter` /
`find.cheapest` is `price--hunter.find-2echeapest`. A capability whose tool name would pass 128
characters is not offered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import socket
import string
import sys
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jsonschema_rs
import mcp.types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.session import ServerSession

from agent_sdk.agent import Agent
from agent_sdk.caller import Progress
from agent_sdk.errors import (
    AgentSDKError,
    RemoteError,
    RequestError,
    RequestRefusedError,
    RequestTimeoutError,
    UnknownReceiverError,
    with_code,
)
from agent_sdk.turns import OnInput
from bridges.mcp_input import elicitor, elicits, unanswered_ask
from protocol.models import ErrorCode
from protocol.payloads import Capability

MAX_TOOL_NAME = 128
"""MCP's longest tool name."""

AGENT_OFFLINE = "agent_offline"
"""The code in the text of a tool error for a call to an agent that is not connected."""
INVALID_OUTPUT = "invalid_output"
"""The code in the text of a tool error for an answer that does not fit the output schema."""
BACKTRACK_LIMIT = 10_000
"""Backtracking steps an output schema's pattern may take on one value (as the lobby's limit
for input schemas)."""

DEFAULT_CALL_TIMEOUT = 30.0
"""Seconds a tool call waits for its agent's answer (the REQUEST's deadline at the lobby)."""

LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""Hosts whose HTTP server refuses requests for other host names (DNS rebinding)."""

_KEPT = frozenset(string.ascii_letters + string.digits + "_")
_HEX = frozenset("0123456789abcdef")


def tool_name(agent_id: str, capability: str) -> str | None:
    """The MCP tool name of `capability` on `agent_id`; None if it would be too long."""
    name = f"{_escape(agent_id)}.{_escape(capability)}"
    return name if len(name) <= MAX_TOOL_NAME else None


def lobby_target(name: str) -> tuple[str, str] | None:
    """The (agent id, capability name) a tool name stands for; None if it is not one."""
    agent, dot, capability = name.partition(".")
    if not dot:
        return None
    try:
        target = _unescape(agent), _unescape(capability)
    except ValueError:
        return None
    if not all(target) or tool_name(*target) != name:
        return None  # only the one spelling `tool_name()` makes
    return target


def _escape(part: str) -> str:
    out: list[str] = []
    for char in part:
        if char in _KEPT:
            out.append(char)
        elif char == "-":
            out.append("--")
        else:
            out.extend(f"-{byte:02x}" for byte in char.encode())
    return "".join(out)


def _unescape(part: str) -> str:
    out = bytearray()
    i = 0
    while i < len(part):
        char = part[i]
        if char in _KEPT:
            out += char.encode()
            i += 1
        elif part[i : i + 2] == "--":
            out += b"-"
            i += 2
        elif char == "-" and len(part) >= i + 3 and set(part[i + 1 : i + 3]) <= _HEX:
            out.append(int(part[i + 1 : i + 3], 16))
            i += 3
        else:
            raise ValueError(f"{part!r} is not an escaped name")
    return out.decode()  # UnicodeDecodeError is a ValueError


def may_call(capability: Capability, agent_id: str) -> bool:
    """Whether the lobby lets `agent_id` call `capability` (`null` or `[]`: everyone)."""
    allowed = capability.authorized_requester_ids
    return not allowed or agent_id in allowed


def as_tool(name: str, agent_id: str, capability: Capability) -> types.Tool:
    """The MCP tool offering `capability` of `agent_id` under `name`."""
    output = capability.output_schema
    return types.Tool(
        name=name,
        title=f"{capability.name} on {agent_id}",
        description=capability.description or None,
        inputSchema={**capability.input_schema, "type": "object"},
        outputSchema=output if output_check(output) is not None else None,
    )


def output_check(schema: dict[str, Any]) -> jsonschema_rs.Validator | None:
    """The compiled `output_schema` of a capability, if its tool offers it: one describing an
    object (a payload is one) that compiles. The lobby does not check output schemas, and a
    client checks each result against the tool's (the TypeScript SDK compiles it first)."""
    if schema.get("type") != "object":
        return None
    return _compiled(json.dumps(schema, sort_keys=True))


@functools.lru_cache(maxsize=1024)  # many agents of one kind declare the same schema
def _compiled(schema: str) -> jsonschema_rs.Validator | None:
    try:  # offline: an agent's schema must not make the bridge open URLs or files
        return jsonschema_rs.validator_for(
            schema,
            offline=True,
            pattern_options=jsonschema_rs.FancyRegexOptions(backtrack_limit=BACKTRACK_LIMIT),
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError):
        return None


def tool_error(code: str, error: str) -> types.CallToolResult:
    """An MCP tool error carrying the lobby's error `code` and sentence as its text. No
    `structuredContent`: it would have to match the tool's output schema, and clients that
    check it (the TypeScript SDK) would throw instead of showing the error."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=with_code(code, error))], isError=True
    )


def offline_error(agent_id: str) -> types.CallToolResult:
    """The tool error of a call to an agent that is offline: answered without a REQUEST,
    which the lobby would hold until the agent connects."""
    return tool_error(
        AGENT_OFFLINE,
        f"agent {agent_id!r} is offline (not connected to the lobby); its tools are listed "
        "again when it connects",
    )


class LobbyTools:
    """The capabilities `agent` may call on agents that are online, as MCP tools. Call
    `refresh()` to reread them from the lobby (`on_change` is awaited when they changed),
    `call()` to run one."""

    def __init__(
        self,
        agent: Agent,
        *,
        on_change: Callable[[], Awaitable[None]] | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self._agent = agent
        self._on_change = on_change
        self.call_timeout = call_timeout
        """Each call's deadline (its REQUEST's `timeout_ms`), in seconds."""
        self.tools: list[types.Tool] = []
        self._targets: dict[str, tuple[str, str]] = {}
        self._outputs: dict[str, jsonschema_rs.Validator] = {}
        self._offline: frozenset[str] = frozenset()
        # Per agent, the calls waiting for its answer: set when a reading finds it offline.
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}

    async def refresh(self) -> bool:
        """Reread the registry; True when the tool list changed."""
        tools: list[types.Tool] = []
        targets: dict[str, tuple[str, str]] = {}
        outputs: dict[str, jsonschema_rs.Validator] = {}
        offline: set[str] = set()
        for service in await self._agent.discover():
            if not service.online:
                offline.add(service.agent_id)
                continue
            for capability in service.relevant_capabilities:
                name = tool_name(service.agent_id, capability.name)
                if name is None or not may_call(capability, self._agent.agent_id):
                    continue
                tools.append(as_tool(name, service.agent_id, capability))
                targets[name] = (service.agent_id, capability.name)
                output = output_check(capability.output_schema)
                if output is not None:
                    outputs[name] = output
        changed = tools != self.tools
        self.tools, self._targets, self._outputs = tools, targets, outputs
        self._offline = frozenset(offline)
        for agent_id in offline & self._waiting.keys():
            for gone in self._waiting[agent_id]:
                if not gone.done():
                    gone.set_result(None)
        if changed and self._on_change is not None:
            await self._on_change()
        return changed

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        on_progress: Progress | None = None,
        on_input: OnInput | None = None,
    ) -> types.CallToolResult:
        """Send tool `name`'s REQUEST with `arguments`; its answer as a tool result. A name not
        listed is looked up again first (the agent may have come or gone since the last
        reading); one of an agent still unknown is tried: the lobby's answer says why it fails.
        A call to an agent offline, or found offline while the call waits, fails at once; one
        cancelled (the client's `notifications/cancelled`) cancels its REQUEST (CANCEL), as
        does an ask for input that `on_input` does not answer (`bridges.mcp_input`)."""
        target = self._targets.get(name)
        if target is None:
            target = lobby_target(name)
            if target is None:
                return tool_error(
                    ErrorCode.CAPABILITY_NOT_FOUND.value,
                    f"{name!r} is not a tool name of this lobby (<agent id>.<capability name>)",
                )
            with contextlib.suppress(AgentSDKError):  # the REQUEST below meets the same fault
                await self.refresh()
        agent_id, capability = target
        if agent_id in self._offline:
            return offline_error(agent_id)
        gone = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(agent_id, set())
        waiting.add(gone)
        conversation_id = uuid.uuid4().hex  # to cancel a call left waiting for input
        request = asyncio.ensure_future(
            self._agent.request(
                agent_id,
                capability,
                arguments,
                on_progress=on_progress,
                timeout=self.call_timeout,
                conversation_id=conversation_id,
                on_input=on_input,
            )
        )
        try:
            await asyncio.wait({request, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.discard(gone)
            if not waiting:
                del self._waiting[agent_id]
            if not request.done():
                request.cancel()  # the request sends CANCEL: the lobby drops its REQUEST
                with contextlib.suppress(asyncio.CancelledError):
                    await request
        if request.cancelled():  # the agent went offline while the call waited
            return tool_error(
                AGENT_OFFLINE,
                f"agent {agent_id!r} went offline before answering; its REQUEST is cancelled",
            )
        if (unanswered := unanswered_ask(request, agent_id, capability)) is not None:
            with contextlib.suppress(AgentSDKError):  # offline: its deadline ends it
                await self._agent.cancel(conversation_id, "the MCP client gave no input")
            return unanswered
        return _answer(request, self._outputs.get(name), agent_id, capability)


def _answer(
    request: asyncio.Future[Any],
    output: jsonschema_rs.Validator | None,
    agent_id: str,
    capability: str,
) -> types.CallToolResult:
    """The tool result of a finished `Agent.request()` to `capability` on `agent_id`, whose
    answer must fit `output` (its tool's output schema) if there is one."""
    try:
        result = request.result()
    except (RemoteError, RequestRefusedError) as exc:
        return tool_error(exc.code, exc.message)
    except UnknownReceiverError as exc:
        code = ErrorCode.UNKNOWN_RECEIVER.value
        return tool_error(code, str(exc).removeprefix(f"{code}: "))
    except RequestTimeoutError as exc:
        return tool_error("timeout", str(exc))
    except RequestError as exc:
        return tool_error(ErrorCode.INTERNAL.value, str(exc))
    misfit = next(output.iter_errors(result), None) if output is not None else None
    if misfit is not None:  # a client would refuse the result itself (TypeScript: -32602)
        where = "".join(f"/{part}" for part in misfit.instance_path) or "the top level"
        problem = misfit.message if len(misfit.message) <= 200 else misfit.message[:197] + "..."
        return tool_error(
            INVALID_OUTPUT,
            f"the answer of capability {capability!r} on agent {agent_id!r} does not fit its "
            f"output_schema at {where}: {problem}",  # the message quotes the value: clipped
        )
    text = json.dumps(result, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=result
    )


class Sessions:
    """The client sessions that asked something, to tell each when the tool list changed."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakSet[ServerSession] = weakref.WeakSet()

    def add(self, session: ServerSession) -> None:
        self._sessions.add(session)

    async def tools_changed(self) -> None:
        for session in list(self._sessions):
            try:
                await session.send_tool_list_changed()
            except Exception:  # a session that closed meanwhile: forget it
                self._sessions.discard(session)


def mcp_server(tools: LobbyTools, sessions: Sessions) -> Server[Any, Any]:
    """The MCP server offering `tools`; it remembers its client sessions in `sessions`."""
    server: Server[Any, Any] = Server("agent-lobby")

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        sessions.add(server.request_context.session)
        await tools.refresh()
        return tools.tools

    # The lobby checks the arguments against the capability's schema: one rule, one place.
    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        context = server.request_context
        sessions.add(context.session)
        token = context.meta.progressToken if context.meta is not None else None
        on_input = None
        if elicits(context.session):
            on_input = elicitor(context.session, context.request_id, tools.call_timeout)
        if token is None:
            return await tools.call(name, arguments, on_input=on_input)
        updates = 0

        async def progress(update: dict[str, Any]) -> None:
            nonlocal updates
            updates += 1
            data = {k: v for k, v in update.items() if k != "status"}
            await context.session.send_progress_notification(
                token,
                updates,
                message=json.dumps(data, ensure_ascii=False),
                related_request_id=str(context.request_id),
            )

        return await tools.call(name, arguments, on_progress=progress, on_input=on_input)

    return server


async def _follow_registry(tools: LobbyTools, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(AgentSDKError):  # a lobby away for a while: try again later
            await tools.refresh()


async def serve(
    agent_id: str,
    *,
    lobby_url: str | None = None,
    http: int | None = None,
    host: str = "127.0.0.1",
    refresh: float = 2.0,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
) -> None:
    """Run `lobby mcp`: on stdio until the client closes it, or (`http`: a port, 0 for any)
    over streamable HTTP at `http://HOST:PORT/mcp` until SIGINT or SIGTERM."""
    agent = Agent(agent_id, lobby_url=lobby_url)
    sessions = Sessions()
    tools = LobbyTools(agent, on_change=sessions.tools_changed, call_timeout=call_timeout)
    server = mcp_server(tools, sessions)
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with agent:
        await tools.refresh()
        follow = asyncio.create_task(_follow_registry(tools, refresh))
        try:
            if http is None:
                from mcp.server.stdio import stdio_server

                async with stdio_server() as (read, write):
                    await server.run(read, write, options)
            else:
                await _serve_http(server, host, http)
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow


async def _serve_http(server: Server[Any, Any], host: str, port: int) -> None:
    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.routing import Route
    from starlette.types import Receive, Scope, Send

    from bridges.mcp_quiet import quiet_disconnects

    quiet_disconnects()  # a client that leaves is no ERROR with a traceback
    security = None
    if host in LOOPBACK:  # a web page must not reach the tools through DNS rebinding
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    manager = StreamableHTTPSessionManager(app=server, security_settings=security)

    class Endpoint:  # an ASGI app, not a request handler: the manager writes the response
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await manager.handle_request(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(routes=[Route("/mcp", endpoint=Endpoint())], lifespan=lifespan)
    listener = socket.create_server((host, port))
    bound = listener.getsockname()[1]
    sys.stderr.write(f"lobby mcp: serving MCP on http://{host}:{bound}/mcp\n")
    sys.stderr.flush()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    # uvicorn stops on SIGINT/SIGTERM, then raises the signal again to the handler it found:
    # let that be a no-op, so that the agent still leaves the lobby cleanly and we exit 0.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    await uvicorn.Server(config).serve(sockets=[listener])
