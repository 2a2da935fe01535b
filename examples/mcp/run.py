"""Both MCP bridges against one lobby: an MCP server's tools joined as agent `calculator`
(`lobby bridge mcp`), called by an SDK agent and then, through `lobby mcp`, by an MCP client.

    .venv/bin/python -m examples.mcp.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator

from agent_sdk import Agent

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
except ModuleNotFoundError as missing:  # the bridges extra, which `make run` leaves out
    package = (missing.name or "a package").split(".")[0]
    raise SystemExit(
        f"examples.mcp needs the bridges extra ({package} is not installed): "
        "make run EXTRAS=bridges, or .venv/bin/pip install -e '.[bridges]'"
    ) from None

LOBBY = [sys.executable, "-m", "lobby"]
TOOLS_SERVER = [sys.executable, "-m", "examples.mcp.tools_server"]


@contextlib.asynccontextmanager
async def calculator(lobby_url: str) -> AsyncIterator[None]:
    """`lobby bridge mcp` running the tools server as agent `calculator` (my_client only)."""
    bridge = await asyncio.create_subprocess_exec(
        *LOBBY,
        *("bridge", "mcp", "--agent-id", "calculator", "--authorize", "my_client"),
        *("--lobby", lobby_url, "--", *TOOLS_SERVER),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert bridge.stderr is not None
        ready = await asyncio.wait_for(bridge.stderr.readline(), 30)  # registered: it says so
        print(ready.decode().strip())
        yield
    finally:
        bridge.terminate()
        await bridge.wait()


async def main(lobby_url: str) -> list[str]:
    lines: list[str] = []
    async with calculator(lobby_url), Agent("my_client", lobby_url=lobby_url) as me:
        total = await me.request("calculator", "add", {"a": 2, "b": 3}, timeout=10)
        lines.append(f"SDK agent: calculator.add(2, 3) = {total['result']}")
        # The same tool from an MCP client, through `lobby mcp` as agent my_client.
        await me.stop()  # `lobby mcp` connects as my_client itself
        server = StdioServerParameters(
            command=LOBBY[0],
            args=[*LOBBY[1:], "mcp", "--agent-id", "my_client", "--lobby", lobby_url],
            env=dict(os.environ),
        )
        async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            # Every online agent my_client may call is a tool: a shared lobby has others.
            tools = [tool.name for tool in (await mcp.list_tools()).tools]
            mine = sorted(tool for tool in tools if tool.startswith("calculator."))
            lines.append(f"MCP client sees: {', '.join(mine)}")
            result = await mcp.call_tool("calculator.add", {"a": 4, "b": 5})
            assert result.structuredContent is not None
            lines.append(f"MCP client: calculator.add(4, 5) = {result.structuredContent['result']}")
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
