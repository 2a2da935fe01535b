"""An MCP server whose tools change while it runs: `unlock` replaces itself with `secret` and
says so with notifications/tools/list_changed (for `lobby bridge mcp` following the tool list)."""

from mcp.server.fastmcp import Context, FastMCP

server = FastMCP("vault", log_level="WARNING")


async def secret() -> str:
    """Tells the secret."""
    return "forty-two"


@server.tool()
async def unlock(ctx: Context) -> str:  # type: ignore[type-arg]
    """Offers `secret` in place of itself."""
    server.add_tool(secret)
    server.remove_tool("unlock")
    await ctx.session.send_tool_list_changed()
    return "unlocked"


if __name__ == "__main__":
    server.run()  # stdio
