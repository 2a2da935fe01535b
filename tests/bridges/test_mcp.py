"""The MCP bridges, with the official `mcp` SDK's own client and server, against a real lobby:
`lobby mcp` over stdio and streamable HTTP, `lobby bridge mcp` in front of a FastMCP script."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.session import RequestResponder
from pydantic import BaseModel

from agent_sdk import (
    Agent,
    InvalidInputError,
    RemoteError,
    RequestContext,
    UnauthorizedError,
    capability,
)
from bridges.mcp import LobbyTools, lobby_target, tool_name
from examples.mcp import run as mcp_example
from lobby import cli
from lobby.server import LobbyServer
from protocol.payloads import Capability
from tests.conftest import make_lobby
from tests.natskit import free_port
from tests.nodejs import ROOT, node, npm_installed

LOBBY = [sys.executable, "-m", "lobby"]
NODE_DIR = ROOT / "tests" / "bridges" / "mcp_node"


class Text(BaseModel):
    text: str


class Measured(BaseModel):
    text: str
    length: int


class Echo(Agent):
    agent_id = "echo"

    @capability("echo", description="Returns the text with its length.")
    async def echo(self, request: Text, ctx: RequestContext) -> Measured:
        await ctx.progress({"step": "measuring"})
        return Measured(text=request.text, length=len(request.text))

    @capability("peek", authorized=["someone_else"])
    async def peek(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"secret": 42}


class Later(Agent):
    agent_id = "late-comer"

    @capability("greet.v1")
    async def greet(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"hello": "world"}


class Sleeper(Agent):
    agent_id = "sleeper"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.called = asyncio.Event()

    @capability("nap")
    async def nap(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.called.set()
        await asyncio.Event().wait()  # never answers: the agent goes offline first
        return {}


@pytest.fixture
async def lobby(tmp_path: Path) -> AsyncIterator[LobbyServer]:
    """One lobby, not one per transport: what crosses a bridge is an SDK agent's traffic."""
    server = make_lobby(tmp_path / "lobby-data")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# -- tool names ----------------------------------------------------------------------------


def test_tool_names_escape_what_mcp_refuses_and_read_back() -> None:
    assert tool_name("echo", "echo") == "echo.echo"
    assert tool_name("price_hunter_A2", "find_v2") == "price_hunter_A2.find_v2"
    assert tool_name("late-comer", "greet.v1") == "late--comer.greet-2ev1"
    assert tool_name("a@b:c", "é") == "a-40b-3ac.-c3-a9"
    for agent_id, name in [("late-comer", "greet.v1"), ("a@b:c", "é"), ("x", "-.-")]:
        tool = tool_name(agent_id, name)
        assert tool is not None
        assert lobby_target(tool) == (agent_id, name)
    assert tool_name("a" * 100, "b" * 28) is None  # 129 characters
    for bad in ["echo", ".echo", "echo.", "a-zz.b", "a-2E.b", "a.b.c", "a-2d.b", "a-ff.b"]:
        assert lobby_target(bad) is None, bad


# -- lobby agents as MCP tools -------------------------------------------------------------


class ListChanged:
    """A client session's message handler that notes each tools/list_changed."""

    def __init__(self) -> None:
        self.seen = asyncio.Event()

    async def __call__(
        self,
        message: RequestResponder[types.ServerRequest, types.ClientResult]
        | types.ServerNotification
        | Exception,
    ) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        ):
            self.seen.set()


def error_text(result: types.CallToolResult) -> str:
    """The one text block of a tool error."""
    assert result.isError
    (text,) = result.content
    assert isinstance(text, types.TextContent)
    return text.text


async def uses_the_lobby_tools(mcp: ClientSession, changed: ListChanged, lobby_url: str) -> None:
    """What an MCP client sees through `lobby mcp --agent-id mcp_user`, with `echo` up."""
    tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    assert set(tools) == {"echo.echo"}  # not echo.peek: mcp_user may not call it
    echo = tools["echo.echo"]
    assert echo.description == "Returns the text with its length."
    assert echo.inputSchema["properties"] == {"text": {"title": "Text", "type": "string"}}
    assert echo.outputSchema is not None
    assert echo.outputSchema["required"] == ["text", "length"]

    updates: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(message)

    result = await mcp.call_tool("echo.echo", {"text": "hi"}, progress_callback=on_progress)
    assert not result.isError
    assert result.structuredContent == {"text": "hi", "length": 2}
    assert updates == ['{"step": "measuring"}']

    refused = await mcp.call_tool("echo.peek", {})
    assert refused.isError
    assert refused.structuredContent is None  # it would have to match the output schema
    # The code once, though the lobby's sentence opens with it in words.
    assert error_text(refused).startswith("unauthorized: Agent 'mcp_user' is not authorized")

    bad = await mcp.call_tool("echo.echo", {"text": 5})
    assert (bad.isError, bad.structuredContent) == (True, None)
    assert error_text(bad).startswith("invalid_input: ")
    gone = await mcp.call_tool("nobody.echo", {})
    assert error_text(gone).startswith("unknown_receiver: ")

    async with Later(lobby_url=lobby_url):
        await asyncio.wait_for(changed.seen.wait(), 20)
        names = {tool.name for tool in (await mcp.list_tools()).tools}
        assert names == {"echo.echo", "late--comer.greet-2ev1"}
        hello = await mcp.call_tool("late--comer.greet-2ev1", {})
        assert hello.structuredContent == {"hello": "world"}


async def test_an_mcp_client_over_stdio_lists_and_calls_lobby_capabilities(
    lobby: LobbyServer,
) -> None:
    server = StdioServerParameters(
        command=LOBBY[0],
        args=[*LOBBY[1:], "mcp", "--agent-id", "mcp_user", "--lobby", lobby.url],
        env={**os.environ, "LOBBY_URL": lobby.url},
    )
    server.args += ["--refresh", "0.2"]
    changed = ListChanged()
    async with (
        Echo(lobby_url=lobby.url),
        stdio_client(server) as (read, write),
        ClientSession(read, write, message_handler=changed) as mcp,
    ):
        await mcp.initialize()
        await uses_the_lobby_tools(mcp, changed, lobby.url)


async def test_offline_agents_tools_are_hidden_and_calls_to_them_end_at_once(
    lobby: LobbyServer,
) -> None:
    changes: list[list[str]] = []
    async with Agent("mcp_user", lobby_url=lobby.url) as me:

        async def changed() -> None:
            changes.append([tool.name for tool in tools.tools])

        tools = LobbyTools(me, on_change=changed)
        async with Sleeper(lobby_url=lobby.url) as sleeper:
            await tools.refresh()
            assert changes == [["sleeper.nap"]]
            waiting = asyncio.create_task(tools.call("sleeper.nap", {}))
            await asyncio.wait_for(sleeper.called.wait(), 10)
        # Registered, not connected: the REQUEST is held for it, and the call waits.
        async with asyncio.timeout(10):
            while not await tools.refresh():
                assert not waiting.done()
        assert changes == [["sleeper.nap"], []]
        assert error_text(await waiting) == (  # ended by the reading that found it offline
            "agent_offline: agent 'sleeper' went offline before answering; its REQUEST is cancelled"
        )
        offline = (
            "agent_offline: agent 'sleeper' is offline (not connected to the lobby); its tools "
            "are listed again when it connects"
        )
        held = len(lobby.router.registry.agents["sleeper"].mailbox)  # the first call's CANCEL
        assert error_text(await tools.call("sleeper.nap", {})) == offline
        unread = LobbyTools(me)  # a name it never listed: it reads the registry first
        assert error_text(await unread.call("sleeper.nap", {})) == offline
        assert unread.tools == []
        # No REQUEST went out for either: nothing for the call to wait for.
        assert len(lobby.router.registry.agents["sleeper"].mailbox) == held


class Careless(Agent):
    """Declares output schemas its answers do not keep to, or that do not compile."""

    agent_id = "careless"

    @capability("measure")
    async def measure(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"text": "hi", "length": "two"}

    @capability("odd")
    async def odd(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"anything": True}

    def capability_models(self) -> list[Capability]:
        schemas = {
            "measure": Measured.model_json_schema(),
            "odd": {"type": "object", "properties": {"a": {"type": "no such type"}}},
        }
        return [
            model.model_copy(update={"output_schema": schemas[model.name]})
            for model in super().capability_models()
        ]


async def test_an_answer_that_does_not_fit_the_output_schema_is_a_tool_error(
    lobby: LobbyServer,
) -> None:
    async with Careless(lobby_url=lobby.url), Agent("mcp_user", lobby_url=lobby.url) as me:
        tools = LobbyTools(me)
        await tools.refresh()
        schemas = {tool.name: tool.outputSchema for tool in tools.tools}
        assert schemas == {"careless.measure": Measured.model_json_schema(), "careless.odd": None}
        misfit = await tools.call("careless.measure", {})
        assert misfit.structuredContent is None
        assert error_text(misfit) == (
            "invalid_output: the answer of capability 'measure' on agent 'careless' does not "
            'fit its output_schema at /length: "two" is not of type "integer"'
        )
        odd = await tools.call("careless.odd", {})  # offered without its schema: any answer
        assert (odd.isError, odd.structuredContent) == (False, {"anything": True})


@contextlib.asynccontextmanager
async def lobby_mcp_http(lobby_url: str, agent_id: str = "mcp_user") -> AsyncIterator[str]:
    """`lobby mcp --http 0` as `agent_id`; yields its MCP endpoint's URL."""
    process = await asyncio.create_subprocess_exec(
        *LOBBY,
        *("mcp", "--agent-id", agent_id, "--lobby", lobby_url, "--http", "0"),
        *("--refresh", "0.2"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
        assert line.startswith("lobby mcp: serving MCP on http://127.0.0.1:"), line
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        process.terminate()
        assert await process.wait() == 0


async def test_an_mcp_client_over_streamable_http_lists_and_calls_lobby_capabilities(
    lobby: LobbyServer,
) -> None:
    changed = ListChanged()
    async with (
        Echo(lobby_url=lobby.url),
        lobby_mcp_http(lobby.url) as url,
        streamable_http_client(url) as (read, write, _),
        ClientSession(read, write, message_handler=changed) as mcp,
    ):
        await mcp.initialize()
        await uses_the_lobby_tools(mcp, changed, lobby.url)
        async with httpx.AsyncClient() as web:  # a page on another host name (DNS rebinding)
            foreign = await web.post(url, headers={"Host": "evil.example"}, json={})
        assert foreign.status_code == 421


async def typescript_client_session(lobby: LobbyServer, *transport: str) -> list[dict[str, Any]]:
    """Run tests/bridges/mcp_node/client.mjs (the TypeScript SDK's client) over `transport`,
    `late-comer` offline, then online once the client has read: its two reports."""
    held = len(lobby.router.registry.agents["late-comer"].mailbox)
    process = await asyncio.create_subprocess_exec(
        node(),
        str(npm_installed(NODE_DIR) / "client.mjs"),
        *transport,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        reports = [json.loads(await asyncio.wait_for(process.stdout.readline(), 30))]
        # The call to the offline late-comer sent no REQUEST: it had nothing to wait for.
        assert len(lobby.router.registry.agents["late-comer"].mailbox) == held
        async with Later(lobby_url=lobby.url):
            reports.append(json.loads(await asyncio.wait_for(process.stdout.readline(), 30)))
        _, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
    assert process.returncode == 0, err.decode()
    return reports


async def test_the_typescript_sdk_client_lists_and_calls_lobby_tools(lobby: LobbyServer) -> None:
    """The official TypeScript SDK checks a result's structuredContent against the tool's output
    schema and throws -32602 when it does not match: a tool error must not carry any."""
    stdio = ("stdio", *LOBBY, "mcp", "--agent-id", "node_stdio", "--lobby", lobby.url)
    async with Echo(lobby_url=lobby.url):
        async with Later(lobby_url=lobby.url):
            pass  # registered, and offline from now on
        sessions = [await typescript_client_session(lobby, *stdio, "--refresh", "0.2")]
        async with lobby_mcp_http(lobby.url, "node_http") as url:
            sessions.append(await typescript_client_session(lobby, "http", url))
    for first, second in sessions:
        assert first["tools"] == ["echo.echo"]
        assert first["echo"]["result"]["structuredContent"] == {"text": "hi", "length": 2}
        assert "thrown" not in first["bad"], first["bad"]
        bad = first["bad"]["result"]
        assert bad["isError"] is True
        assert "structuredContent" not in bad
        assert bad["content"][0]["text"].startswith("invalid_input: ")
        offline = first["offline"]
        assert offline["result"]["content"][0]["text"].startswith(
            "agent_offline: agent 'late-comer' is offline"
        )
        assert second["tools"] == ["echo.echo", "late--comer.greet-2ev1"]
        assert second["online"]["result"]["structuredContent"] == {"hello": "world"}


# -- MCP servers as lobby agents -----------------------------------------------------------


@contextlib.asynccontextmanager
async def bridged_calculator(lobby_url: str) -> AsyncIterator[None]:
    """`lobby bridge mcp` in front of examples/mcp/tools_server.py, as agent calculator."""
    process = await asyncio.create_subprocess_exec(
        *LOBBY,
        *("bridge", "mcp", "--agent-id", "calculator", "--authorize", "my_client"),
        *("--lobby", lobby_url, "--", sys.executable, "-m", "examples.mcp.tools_server"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        ready = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
        assert ready == "lobby bridge mcp: agent 'calculator' offers add, count, divide\n"
        yield
    finally:
        process.terminate()
        assert await process.wait() == 0


async def test_an_sdk_agent_calls_an_mcp_server_through_the_bridge(lobby: LobbyServer) -> None:
    async with (
        bridged_calculator(lobby.url),
        Agent("my_client", lobby_url=lobby.url) as me,
        Agent("intruder", lobby_url=lobby.url) as intruder,
    ):
        (service,) = await me.discover("add")
        add = service.relevant_capabilities[0]
        assert (service.agent_id, add.description) == ("calculator", "Adds two numbers.")
        assert add.input_schema["required"] == ["a", "b"]
        assert add.authorized_requester_ids == ["my_client"]

        assert await me.request("calculator", "add", {"a": 2, "b": 3}) == {"result": 5.0}
        steps = [step async for step in me.request_stream("calculator", "count", {"n": 2})]
        assert steps == [
            {"status": "in_progress", "progress": 1.0, "total": 2.0, "message": "step 1"},
            {"status": "in_progress", "progress": 2.0, "total": 2.0, "message": "step 2"},
            {"result": "counted to 2"},
        ]
        with pytest.raises(RemoteError) as failed:
            await me.request("calculator", "divide", {"a": 1, "b": 0})
        assert failed.value.code == "tool_error"
        assert "cannot divide by zero" in failed.value.message
        with pytest.raises(InvalidInputError):  # the lobby checks the tool's inputSchema
            await me.request("calculator", "add", {"a": "two", "b": 3})
        with pytest.raises(UnauthorizedError) as refused:
            await intruder.request("calculator", "add", {"a": 2, "b": 3})
        assert refused.value.message == (
            "Unauthorized: Agent 'intruder' is not authorized to call capability 'add' on "
            "agent 'calculator'."
        )


async def test_the_example_runs_both_bridges(lobby: LobbyServer) -> None:
    assert await mcp_example.main(lobby.url) == [
        "SDK agent: calculator.add(2, 3) = 5.0",
        "MCP client sees: calculator.add, calculator.count, calculator.divide",
        "MCP client: calculator.add(4, 5) = 9.0",
    ]


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["mcp"], "the following arguments are required: --agent-id"),
        (["mcp", "--agent-id", "a", "--http", "x"], "'x' is not a port number"),
        (["mcp", "--agent-id", "a", "--refresh", "0"], "0 is not a positive number"),
        (["bridge", "mcp", "--agent-id", "a"], "needs either --url or -- COMMAND"),
        (["bridge", "mcp", "--agent-id", "a", "--url", "u", "--", "x"], "not both"),
        (["bridge", "smtp"], "invalid choice: 'smtp'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1
    assert says in stderr


def test_a_bridge_to_a_server_that_cannot_start_fails_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bridge", "mcp", "--agent-id", "a", "--", "/nonexistent/mcp-server"]
    assert cli.main(argv) == 1
    stderr = capsys.readouterr().err
    assert stderr.startswith("lobby: ")
    assert stderr.count("\n") == 1


def test_lobby_serve_never_imports_mcp_or_the_sdk() -> None:
    code = (
        "import lobby.cli, sys; "
        "print(sorted(m for m in sys.modules if m.startswith(('mcp', 'agent_sdk'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"


def test_the_documented_configuration_runs_lobby_mcp() -> None:
    """The JSON docs/mcp.md gives to paste into an MCP client names valid `lobby` arguments."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    block = readme.split('```json\n{\n  "mcpServers"', 1)[1].split("```", 1)[0]
    entry = json.loads('{"mcpServers"' + block)["mcpServers"]["agent-lobby"]
    assert entry["command"].endswith("/.venv/bin/lobby")
    args = cli.build_parser().parse_args(entry["args"])
    assert (args.command, args.agent_id, args.http) == ("mcp", "my_client", None)


@pytest.mark.parametrize("server", ["python-stdio", "typescript-http"])
async def test_the_bridge_follows_the_servers_tool_list(lobby: LobbyServer, server: str) -> None:
    """The same changing server on the Python SDK (stdio) and the TypeScript SDK (HTTP)."""
    async with contextlib.AsyncExitStack() as stack:
        target = ["--", sys.executable, "-m", "tests.bridges.changing_server"]
        if server == "typescript-http":
            script = str(npm_installed(NODE_DIR) / "changing_server.mjs")
            http = await asyncio.create_subprocess_exec(
                node(), script, stdout=asyncio.subprocess.PIPE
            )
            stack.push_async_callback(http.wait)
            stack.callback(http.terminate)
            assert http.stdout is not None
            url = await asyncio.wait_for(http.stdout.readline(), 30)
            target = ["--url", url.decode().strip()]
        process = await asyncio.create_subprocess_exec(
            *LOBBY,
            *("bridge", "mcp", "--agent-id", "vault", "--lobby", lobby.url, *target),
            stderr=asyncio.subprocess.PIPE,
        )
        await follows_the_tool_list(lobby, process)


async def follows_the_tool_list(lobby: LobbyServer, process: asyncio.subprocess.Process) -> None:
    """`process`, a bridge to the changing server as agent vault, follows its tools."""
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(process.stderr.readline(), 30)
        assert line == b"lobby bridge mcp: agent 'vault' offers unlock\n"
        async with Agent("visitor", lobby_url=lobby.url) as me:
            assert await me.request("vault", "unlock", {}) == {"result": "unlocked"}
            line = await asyncio.wait_for(process.stderr.readline(), 30)
            assert line == b"lobby bridge mcp: agent 'vault' now offers secret\n"
            async with asyncio.timeout(30):  # the UPDATE_CAPABILITIES is on its way
                while not await me.discover("secret"):
                    await asyncio.sleep(0.05)
            assert await me.discover("unlock") == []
            assert await me.request("vault", "secret", {}) == {"result": "forty-two"}
    finally:
        process.terminate()
        assert await process.wait() == 0


def test_a_bridge_to_an_mcp_server_that_does_not_answer_names_its_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "lobby", "bridge", "mcp", "--agent-id", "calc", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"lobby: cannot reach the MCP server at {url}: All connection attempts failed"
    ]
