"""A small MCP server (the official SDK's FastMCP) that `lobby bridge mcp` joins to the lobby.

    lobby bridge mcp --agent-id calculator --authorize my_client -- \
        python -m examples.mcp.tools_server
"""

from mcp.server.fastmcp import Context, FastMCP

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
    server.run()  # stdio
