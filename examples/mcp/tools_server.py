"""A small MCP server (the official SDK's FastMCP) that `lobby bridge mcp` joins to the lobby,
over stdio (the bridge starts it; name the venv's python, the bridge does not activate it):

    .venv/bin/lobby bridge mcp --agent-id calculator --authorize my_client -- \
        .venv/bin/python -m examples.mcp.tools_server

or over streamable HTTP, started on its own:

    .venv/bin/python -m examples.mcp.tools_server --http 9000   # http://127.0.0.1:9000/mcp
    .venv/bin/lobby bridge mcp --agent-id calculator --url http://127.0.0.1:9000/mcp
"""

import argparse
import sys

from mcp.server.fastmcp import Context, FastMCP

from bridges.mcp_quiet import quiet_disconnects

server = FastMCP("calculator", log_level="WARNING")  # its stderr is the bridge's


@server.tool()
async def add(a: float, b: float) -> float:
    """Adds two numbers."""
    return a + b


@server.tool()
async def count(n: int, ctx: Context) -> str:  # type: ignore[type-arg]
    """Counts to n, reporting each step as progress."""
    for step in range(1, n + 1):
        await ctx.report_progress(step, n, f"step {step}")
    return f"counted to {n}"


@server.tool()
async def divide(a: float, b: float) -> float:
    """Divides a by b."""
    if b == 0:
        raise ValueError("cannot divide by zero")
    return a / b


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The calculator MCP server (stdio by default).")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP instead")
    port = parser.parse_args().http
    if port is None:
        server.run()  # stdio: stdout is the protocol's, so nothing is printed
    else:
        server.settings.port = port
        quiet_disconnects()  # a client that leaves is no ERROR with a traceback
        print(f"calculator MCP server: http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
        server.run("streamable-http")
