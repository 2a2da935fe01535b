"""MCP servers as lobby agents: `lobby bridge mcp --agent-id ID -- COMMAND ...` (or `--url`).

The bridge starts the MCP server (stdio) or connects to it (streamable HTTP), lists its tools
and registers them as the capabilities of one lobby agent, ID:

    capability name      the tool's name
    description          the tool's description
    input_schema         its inputSchema (the lobby checks REQUESTs against it)
    output_schema        its outputSchema, or `{}`
    authorized_requester_ids   the `--authorize` ids (none: anyone may call)

A REQUEST becomes a `tools/call` with the REQUEST's arguments; the server's progress
notifications become `in_progress` RESPONSEs `{"progress": ..., "total": ..., "message": ...}`;
the result becomes a `success` RESPONSE: the tool's `structuredContent` as the payload when it
gives one, else `{"content": [...]}` (its content blocks as MCP writes them). A tool error
(`isError`, or the server refusing the call) is an `error` RESPONSE with code `tool_error` and
the tool's text as `error`; refusals before the tool runs are the lobby's own
(`unauthorized`, `invalid_input`, ...).

A REQUEST's deadline bounds its `tools/call` (the SDK stops the handler); a REQUEST cancelled
(CANCEL from the lobby: its requester cancelled it, or its deadline passed) or stopped at its
deadline sends the server `notifications/cancelled` for that call.

The capabilities follow the server's tools: on its `notifications/tools/list_changed` the bridge
lists them again and sends UPDATE_CAPABILITIES, so a tool added, changed or removed by the server
is offered, changed or withdrawn in the lobby a moment later.

The server's elicitation during a call (`elicitation/create`) is the provider's ask for input
(`input_required`) to the call's requester, whose INPUT answers it (`bridges.mcp_input`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import mcp.types as types
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.session import MessageHandlerFnT
from mcp.shared.session import RequestResponder

from agent_sdk.agent import Agent
from agent_sdk.capability import CapabilitySpec, Handler, RequestContext
from agent_sdk.errors import AgentSDKError, CapabilityError
from bridges.mcp_input import Elicitations
from protocol.payloads import Capability

TOOL_ERROR = "tool_error"
"""The RESPONSE error code of a tool that failed."""


def tool_capability(tool: types.Tool, authorized: Sequence[str] | None) -> Capability:
    """The capability registered for MCP `tool`."""
    return Capability(
        name=tool.name,
        description=tool.description or "",
        input_schema=tool.inputSchema,
        output_schema=tool.outputSchema or {},
        authorized_requester_ids=list(authorized) if authorized else None,
    )


def tool_output(result: types.CallToolResult) -> dict[str, Any]:
    """The success payload (without `status`) of a tool's result; `CapabilityError` with code
    `tool_error` if the tool failed."""
    if result.isError:
        text = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
        raise CapabilityError(text or "the tool failed", code=TOOL_ERROR)
    if result.structuredContent is not None:
        return result.structuredContent
    return {"content": [b.model_dump(mode="json", exclude_none=True) for b in result.content]}


class McpToolAgent(Agent):
    """A lobby agent whose capabilities are the tools of the MCP server behind `session`
    (initialized; its tools listed in `tools`). Run it as any agent."""

    def __init__(
        self,
        agent_id: str,
        session: ClientSession,
        tools: Sequence[types.Tool],
        *,
        authorized: Sequence[str] | None = None,
        elicitations: Elicitations | None = None,
        **options: Any,
    ) -> None:
        super().__init__(agent_id, **options)
        self._session = session
        self._elicitations = elicitations or Elicitations()
        self._tools: dict[str, types.Tool] = {}
        self._authorized = tuple(authorized) if authorized else None
        self.ready = asyncio.Event()
        """Set once the lobby has registered the tools."""
        self.offer(tools)

    def offer(self, tools: Sequence[types.Tool]) -> None:
        """Make `tools` this agent's capabilities, in place of those it had; the lobby learns of
        them at the next registration, or now with `update_capabilities()`."""
        self._tools = {tool.name: tool for tool in tools}
        self.capabilities.clear()
        for tool in tools:
            self.capabilities[tool.name] = CapabilitySpec(
                name=tool.name,
                description=tool.description or "",
                keywords=(),
                authorized=self._authorized,
                timeout=None,
                handler=self._handler(tool.name),
                rate_limit=None,
                input_type=None,
                output_type=None,
            )

    async def on_connected(self) -> None:
        self.ready.set()

    def capability_models(self) -> list[Capability]:
        return [tool_capability(tool, self._authorized) for tool in self._tools.values()]

    def _handler(self, name: str) -> Handler:
        async def call(_: Agent, arguments: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            async def report(progress: float, total: float | None, message: str | None) -> None:
                update = {"progress": progress, "total": total, "message": message}
                await ctx.progress({k: v for k, v in update.items() if v is not None})

            session = self._session
            # The id `call_tool` is about to give its request (nothing runs in between): the
            # session keeps no other handle on a call in flight.
            request_id = session._request_id
            try:
                async with self._elicitations.calling(ctx):
                    result = await session.call_tool(name, arguments, progress_callback=report)
            except McpError as exc:
                raise CapabilityError(exc.error.message, code=TOOL_ERROR) from None
            except asyncio.CancelledError:
                reason = "cancelled in the lobby" if ctx.cancelled.is_set() else "deadline"
                await _cancel_call(session, request_id, reason)
                raise
            return tool_output(result)

        return call


async def _cancel_call(session: ClientSession, request_id: int, reason: str) -> None:
    """Tell the server to stop the call `request_id` (`notifications/cancelled`)."""
    params = types.CancelledNotificationParams(requestId=request_id, reason=reason)
    notice = types.ClientNotification(types.CancelledNotification(params=params))
    with contextlib.suppress(Exception):  # a server gone meanwhile: nothing to stop
        await session.send_notification(notice)


async def list_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool of the server behind `session`, following its pages."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.nextCursor
        if cursor is None:
            return tools


def tools_changed_handler(changed: asyncio.Event) -> MessageHandlerFnT:
    """A client session's message handler that sets `changed` on each tools/list_changed."""

    async def handle(
        message: RequestResponder[types.ServerRequest, types.ClientResult]
        | types.ServerNotification
        | Exception,
    ) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        ):
            changed.set()

    return handle


@contextlib.asynccontextmanager
async def mcp_session(
    command: Sequence[str],
    url: str | None,
    *,
    tools_changed: asyncio.Event | None = None,
    elicitations: Elicitations | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized client session with the MCP server `command` starts (stdio), or the one
    at `url` (streamable HTTP); `tools_changed` is set whenever the server's tools change; the
    session answers elicitation through `elicitations` (declared only then)."""
    handler = tools_changed_handler(tools_changed) if tools_changed is not None else None
    async with contextlib.AsyncExitStack() as stack:
        if url is not None:
            from mcp.client.streamable_http import streamable_http_client

            read, write, _ = await stack.enter_async_context(streamable_http_client(url))
        else:
            from mcp.client.stdio import stdio_client

            server = StdioServerParameters(command=command[0], args=list(command[1:]))
            read, write = await stack.enter_async_context(stdio_client(server))
        session = await stack.enter_async_context(
            ClientSession(
                read,
                write,
                message_handler=handler,
                elicitation_callback=elicitations.elicit if elicitations is not None else None,
            )
        )
        await session.initialize()
        yield session


async def bridge(
    agent_id: str,
    *,
    command: Sequence[str] = (),
    url: str | None = None,
    authorized: Sequence[str] | None = None,
    lobby_url: str | None = None,
) -> None:
    """Run `lobby bridge mcp` until SIGINT or SIGTERM (or the lobby unregisters the agent);
    once registered, say so in one line on stderr: "lobby bridge mcp: agent 'ID' offers ..."."""
    tools_changed = asyncio.Event()
    elicitations = Elicitations()
    async with mcp_session(
        command, url, tools_changed=tools_changed, elicitations=elicitations
    ) as session:
        tools = await list_tools(session)
        agent = McpToolAgent(
            agent_id,
            session,
            tools,
            authorized=authorized,
            elicitations=elicitations,
            lobby_url=lobby_url,
        )
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping.set)
        runner = asyncio.create_task(agent.run())
        stopper = asyncio.create_task(stopping.wait())
        ready = asyncio.create_task(agent.ready.wait())
        follower = asyncio.create_task(_follow_tools(agent, session, tools_changed))
        try:
            await asyncio.wait({runner, stopper, ready}, return_when=asyncio.FIRST_COMPLETED)
            if ready.done():
                _say_offers(agent_id, tools)
                await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stopper, ready, follower):
                task.cancel()
            await asyncio.gather(stopper, ready, follower, return_exceptions=True)
            await agent.stop()
        runner.result()  # re-raise what ended it (e.g. RegistrationError)


def _say_offers(agent_id: str, tools: Sequence[types.Tool], now: str = "") -> None:
    names = ", ".join(tool.name for tool in tools) or "no tools"
    sys.stderr.write(f"lobby bridge mcp: agent {agent_id!r} {now}offers {names}\n")
    sys.stderr.flush()


async def _follow_tools(
    agent: McpToolAgent, session: ClientSession, changed: asyncio.Event
) -> None:
    """Offer the server's tools again each time it says they changed (several notices while one
    listing runs make one more listing)."""
    await agent.ready.wait()
    while True:
        await changed.wait()
        changed.clear()
        tools = await list_tools(session)
        agent.offer(tools)
        with contextlib.suppress(AgentSDKError):  # offline: the next registration carries them
            await agent.update_capabilities()
        _say_offers(agent.agent_id, tools, now="now ")
