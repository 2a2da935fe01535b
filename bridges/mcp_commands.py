"""`lobby mcp` and `lobby bridge mcp`: the MCP bridges' command line, which `lobby` finds
through the `lobby.commands` entry points (`lobby.extra_commands`).

The bridges are SDK agents; they are imported only when one of these commands runs, so
`lobby serve`, which loads this module to build its parser, never loads the SDK or the `mcp`
package.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import sys
from typing import Any

from lobby.options import port_number, positive_seconds

BRIDGES_EXTRA = "make run EXTRAS=bridges, or .venv/bin/pip install -e '.[bridges]' in the checkout"
COMMANDS = frozenset({"mcp", "bridge"})


def add_commands(commands: argparse._SubParsersAction[Any], parser_class: type[Any]) -> None:
    """Add `mcp` and `bridge mcp` to the `lobby` command's subcommands."""
    serve = commands.add_parser(
        "mcp",
        help="serve the capabilities an agent may call as MCP tools",
        description="An MCP server (stdio, or streamable HTTP with --http) that connects to "
        "the lobby as agent --agent-id and offers each capability that agent may call as a "
        "tool named <agent id>.<capability>.",
    )
    serve.add_argument("--agent-id", required=True, help="the lobby agent the tools call as")
    serve.add_argument(
        "--lobby", metavar="URL", help="the lobby (default: $LOBBY_URL, else ws://127.0.0.1:8765/)"
    )
    serve.add_argument(
        "--http",
        type=port_number,
        metavar="PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp (0: any free port)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the --http address (%(default)s)")
    serve.add_argument(
        "--refresh",
        type=positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often to reread the registry for new tools (%(default)s)",
    )
    serve.add_argument(
        "--call-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long a tool call waits for its agent: its REQUEST's deadline (%(default)s)",
    )

    bridge = commands.add_parser("bridge", help="join another protocol's agent to the lobby")
    kinds = bridge.add_subparsers(dest="bridge", required=True, parser_class=parser_class)
    mcp = kinds.add_parser(
        "mcp",
        help="register an MCP server's tools as one agent's capabilities",
        description="Start the MCP server COMMAND (stdio), or connect to --url (streamable "
        "HTTP), and register its tools as the capabilities of agent --agent-id.",
    )
    mcp.add_argument("--agent-id", required=True, help="the lobby agent the tools become")
    mcp.add_argument(
        "--authorize",
        nargs="+",
        action="extend",
        metavar="ID",
        help="agents allowed to call the tools (default: anyone)",
    )
    mcp.add_argument(
        "--lobby", metavar="URL", help="the lobby (default: $LOBBY_URL, else ws://127.0.0.1:8765/)"
    )
    mcp.add_argument("--url", help="the MCP server's streamable HTTP endpoint")
    mcp.add_argument(
        "command_line",
        nargs="*",
        metavar="COMMAND",
        help="after --: the command starting the server, with its arguments",
    )


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the command; a failure is one line on stderr and exit status 1. A `bridge mcp`
    given both or neither of --url and a command is refused (exit 2)."""
    if args.command == "bridge" and bool(args.url) == bool(args.command_line):
        parser.error("bridge mcp needs either --url or -- COMMAND ..., not both")
    try:
        from agent_sdk.errors import AgentSDKError
        from bridges import mcp, mcp_agent
    except ImportError as missing:
        sys.stderr.write(f"lobby: the MCP bridges need {missing.name}: {BRIDGES_EXTRA}\n")
        return 1
    try:
        if args.command == "mcp":
            asyncio.run(
                mcp.serve(
                    args.agent_id,
                    lobby_url=args.lobby,
                    http=args.http,
                    host=args.host,
                    refresh=args.refresh,
                    call_timeout=args.call_timeout,
                )
            )
        else:
            asyncio.run(
                mcp_agent.bridge(
                    args.agent_id,
                    command=args.command_line,
                    url=args.url,
                    authorized=args.authorize,
                    lobby_url=args.lobby,
                )
            )
    except KeyboardInterrupt:
        return 0
    except (AgentSDKError, OSError) as exc:
        sys.stderr.write(f"lobby: {_described(exc, args)}\n")
        return 1
    except BaseExceptionGroup as group:  # anyio's task groups wrap what failed inside them
        sys.stderr.write(f"lobby: {_described(_first(group), args)}\n")
        return 1
    return 0


def _described(error: BaseException, args: argparse.Namespace) -> str:
    """The error's sentence, naming the MCP server's URL when reaching it is what failed (the
    HTTP client's own words name nothing: "All connection attempts failed"), and the flag to
    change when the port to serve on is taken."""
    if args.command == "bridge" and args.url and type(error).__module__.startswith("http"):
        return f"cannot reach the MCP server at {args.url}: {error}"
    if args.command == "mcp" and isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return (
            f"port {args.http} is in use on {args.host}: "
            "stop what holds it, or choose another --http"
        )
    return str(error)


def _first(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
