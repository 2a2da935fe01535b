"""Multi-turn calls across the MCP bridges (bridges/mcp_input.py), with the official `mcp` SDK's
client and server and a real lobby: `lobby mcp` turns a provider's `input_required` into an
elicitation and its answer into INPUT (over stdio, and in process on the SDK's memory
transport); `lobby bridge mcp` turns its MCP server's elicitation into `input_required` to the
lobby requester."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from pydantic import BaseModel

from agent_sdk import Agent, RequestContext, capability
from bridges.mcp import LobbyTools, Sessions, mcp_server
from bridges.mcp_agent import McpToolAgent, list_tools
from bridges.mcp_input import Elicitations, elicitation_form, form_answer
from lobby.server import LobbyServer
from tests.bridges.test_mcp import NODE_DIR, lobby_mcp_http
from tests.conftest import make_lobby
from tests.nodejs import node, npm_installed
from tests.waiting import until

ASK = {"question": "Which size?", "choices": ["S", "M", "L"]}
SIZE_FORM = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["S", "M", "L"]}},
    "required": ["answer"],
}


class Tailor(Agent):
    agent_id = "tailor"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.contexts: list[RequestContext] = []

    @capability("fit", description="Asks for a size, then fits it.")
    async def fit(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.contexts.append(ctx)
        answer = await ctx.ask(ASK)
        again = await ctx.ask({"question": "Sleeves?", "schema": SLEEVES})
        return {"size": answer["answer"], "sleeves": again["sleeves"]}


SLEEVES = {"type": "object", "properties": {"sleeves": {"type": "boolean"}}}


@pytest.fixture
async def lobby(tmp_path: Path) -> AsyncIterator[LobbyServer]:
    server = make_lobby(tmp_path / "lobby-data")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def test_an_ask_becomes_a_form_mcp_allows() -> None:
    assert elicitation_form(ASK) == ("Which size?", SIZE_FORM)
    assert elicitation_form({"question": "Sleeves?", "schema": SLEEVES}) == ("Sleeves?", SLEEVES)
    nested = {"type": "object", "properties": {"who": {"type": "object"}}}
    message, schema = elicitation_form({"need": "a name", "schema": nested})
    assert (
        message == '{"need": "a name", "schema": {"type": "object", "properties": {"who": '
        '{"type": "object"}}}}'
    )
    assert schema["properties"] == {"answer": {"type": "string"}}  # not a form: one answer


def test_an_input_is_a_forms_answer_when_its_values_are_form_values() -> None:
    accepted = form_answer({"size": "M", "n": 2, "ok": True, "tags": ["a"], "none": None})
    assert isinstance(accepted, types.ElicitResult)
    assert accepted.action == "accept"
    assert accepted.content == {"size": "M", "n": 2, "ok": True, "tags": ["a"], "none": None}
    refused = form_answer({"size": {"eu": 40}})
    assert isinstance(refused, types.ErrorData)
    assert "'size'" in refused.message


class Form:
    """An MCP client's elicitation callback answering from `answers`, noting what it is asked."""

    def __init__(self, *answers: types.ElicitResult | types.ErrorData) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append((params.message, params.requestedSchema))
        return self.answers.pop(0)


def accept(content: dict[str, Any]) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content=content)


async def test_an_mcp_client_over_stdio_answers_a_providers_asks(lobby: LobbyServer) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "lobby", "mcp", "--agent-id", "mcp_user", "--lobby", lobby.url],
        env={**os.environ, "LOBBY_URL": lobby.url},
    )
    form = Form(accept({"answer": "M"}), accept({"sleeves": False}))
    async with (
        Tailor(lobby_url=lobby.url),
        stdio_client(server) as (read, write),
        ClientSession(read, write, elicitation_callback=form) as mcp,
    ):
        await mcp.initialize()
        result = await mcp.call_tool("tailor.fit", {})
    assert not result.isError, result.content
    assert result.structuredContent == {"size": "M", "sleeves": False}
    assert form.asked == [("Which size?", SIZE_FORM), ("Sleeves?", SLEEVES)]


async def call_in_process(
    lobby: LobbyServer, form: Form | None
) -> tuple[types.CallToolResult, Tailor]:
    """Call tailor.fit through `lobby mcp`'s server in process, answering with `form`."""
    async with Tailor(lobby_url=lobby.url) as tailor, Agent("mcp_user", lobby_url=lobby.url) as me:
        tools = LobbyTools(me)
        await tools.refresh()
        async with create_connected_server_and_client_session(
            mcp_server(tools, Sessions()), elicitation_callback=form
        ) as client:
            result = await client.call_tool("tailor.fit", {})
        # The REQUEST left waiting for input is cancelled: the provider is told to stop.
        await until(lambda: lobby.router.conversations == {})
        return result, tailor


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (types.ElicitResult(action="decline"), "'decline'"),
        (types.ElicitResult(action="cancel"), "'cancel'"),
        (types.ErrorData(code=-32600, message="no forms"), "with the error 'no forms'"),
    ],
)
async def test_a_declined_elicitation_cancels_the_call(
    lobby: LobbyServer, answer: types.ElicitResult | types.ErrorData, said: str
) -> None:
    result, tailor = await call_in_process(lobby, Form(answer))
    assert result.isError
    (text,) = result.content
    assert isinstance(text, types.TextContent)
    assert text.text == (
        "input_declined: capability 'fit' on agent 'tailor' asked for input and the MCP client "
        f"answered the elicitation {said}; the call is cancelled"
    )
    assert tailor.contexts[0].cancelled.is_set()


async def test_a_client_without_elicitation_is_told_the_call_needs_input(
    lobby: LobbyServer,
) -> None:
    result, tailor = await call_in_process(lobby, None)
    assert result.isError
    (text,) = result.content
    assert isinstance(text, types.TextContent)
    assert text.text.startswith(
        "input_required: capability 'fit' on agent 'tailor' asks for input "
        '({"question": "Which size?", "choices": ["S", "M", "L"]}), and this MCP client '
        "cannot be asked"
    )
    assert tailor.contexts[0].cancelled.is_set()


class Size(BaseModel):
    size: str


def asking_server() -> FastMCP:
    """An MCP server whose tool `order` asks its client for a size (`ctx.elicit`)."""
    server = FastMCP("shop", log_level="WARNING")

    @server.tool()
    async def order(item: str, ctx: Context[Any, Any, Any]) -> dict[str, Any]:
        """Orders `item` in the size the client gives."""
        answer = await ctx.elicit(f"Which size of {item}?", schema=Size)
        if answer.action != "accept":
            return {"ordered": None, "because": answer.action}
        return {"ordered": item, "size": answer.data.size}

    return server


async def test_the_bridge_asks_the_lobby_requester_for_its_servers_elicitation(
    lobby: LobbyServer,
) -> None:
    elicitations = Elicitations()
    async with create_connected_server_and_client_session(
        asking_server(), elicitation_callback=elicitations.elicit
    ) as session:
        tools = await list_tools(session)
        agent = McpToolAgent("shop", session, tools, elicitations=elicitations, lobby_url=lobby.url)
        asked: list[dict[str, Any]] = []

        def answer(question: dict[str, Any]) -> dict[str, Any]:
            asked.append(question)
            return {"size": "M"}

        async with agent, Agent("buyer", lobby_url=lobby.url) as me:
            result = await me.request("shop", "order", {"item": "shirt"}, on_input=answer)
    assert result == {"ordered": "shirt", "size": "M"}
    [question] = asked
    assert question["question"] == "Which size of shirt?"
    assert question["schema"]["properties"]["size"]["type"] == "string"


async def test_an_elicitation_whose_call_is_cancelled_is_answered_cancel(
    lobby: LobbyServer,
) -> None:
    elicitations = Elicitations()
    async with create_connected_server_and_client_session(
        asking_server(), elicitation_callback=elicitations.elicit
    ) as session:
        tools = await list_tools(session)
        agent = McpToolAgent("shop", session, tools, elicitations=elicitations, lobby_url=lobby.url)
        async with agent, Agent("buyer", lobby_url=lobby.url) as me:
            conversation = await me.converse("shop", "order", {"item": "hat"})
            async for update in conversation:
                assert update["input_required"]["question"] == "Which size of hat?"
                break
            await conversation.cancel("changed my mind")
            await until(lambda: lobby.router.conversations == {})
            # The session reads again: the elicitation was answered (cancel) and the next
            # call gets through.
            result = await me.request(
                "shop", "order", {"item": "cap"}, on_input=lambda _: {"size": "S"}
            )
    assert result == {"ordered": "cap", "size": "S"}


async def test_the_typescript_sdk_client_answers_a_providers_asks(lobby: LobbyServer) -> None:
    """Over streamable HTTP, each elicitation goes on the tool call's own response stream
    (`related_request_id`)."""
    answers = [{"action": "accept", "content": {"answer": "L"}}]
    answers.append({"action": "accept", "content": {"sleeves": True}})
    async with Tailor(lobby_url=lobby.url), lobby_mcp_http(lobby.url, "node_user") as url:
        process = await asyncio.create_subprocess_exec(
            node(),
            str(npm_installed(NODE_DIR) / "elicit_client.mjs"),
            *(url, "tailor.fit", *map(json.dumps, answers)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["result"]["structuredContent"] == {"size": "L", "sleeves": True}
    assert report["asked"] == [
        {"message": "Which size?", "schema": SIZE_FORM},
        {"message": "Sleeves?", "schema": SLEEVES},
    ]


async def test_the_bridge_refuses_an_elicitation_it_cannot_place() -> None:
    """Outside any call (or during several) nobody can be asked; nor by URL."""
    form = types.ElicitRequestFormParams(message="Size?", requestedSchema=SLEEVES)
    refused = await Elicitations().elicit(None, form)
    assert isinstance(refused, types.ErrorData)
    assert refused.message == (
        "the lobby bridge has 0 tool calls in flight, not one, and cannot tell whose requester "
        "to ask"
    )
    by_url = types.ElicitRequestURLParams(message="Pay", url="https://x.test/", elicitationId="e")
    refused = await Elicitations().elicit(None, by_url)
    assert isinstance(refused, types.ErrorData)
    assert "form mode only" in refused.message
