"""`lobby a2a serve | join`: the A2A bridges' command line, which `lobby` finds through the
`lobby.commands` entry points (`lobby.extra_commands`).

The bridges are SDK agents; they are imported only when one of these commands runs, so
`lobby serve`, which loads this module to build its parser, never loads the SDK or the `a2a`
package.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from lobby.extras import install_hint
from lobby.options import port_number

COMMANDS = frozenset({"a2a"})


def add_commands(commands: argparse._SubParsersAction[Any], parser_class: type[Any]) -> None:
    """Add `a2a serve` and `a2a join` to the `lobby` command's subcommands."""
    a2a = commands.add_parser(
        "a2a", help="bridges to A2A agents (the bridges extra: make run EXTRAS=bridges)"
    )
    bridges = a2a.add_subparsers(dest="a2a_command", required=True, parser_class=parser_class)
    lobby_url = os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/")
    serve = bridges.add_parser("serve", help="serve lobby agents to A2A clients")
    serve.add_argument("--agent-id", required=True, help="the gateway's own lobby agent id")
    serve.add_argument("--lobby", default=lobby_url, metavar="URL", help="(%(default)s)")
    serve.add_argument("--host", default="127.0.0.1", help="(%(default)s)")
    serve.add_argument("--port", type=port_number, required=True, help="HTTP port (0: a free one)")
    serve.add_argument(
        "--tokens", type=Path, metavar="FILE", help='JSON {"<bearer token>": "<lobby agent id>"}'
    )
    serve.add_argument(
        "--anonymous",
        metavar="ID",
        help="the lobby agent a caller without an Authorization header acts as (default: 401)",
    )
    serve.add_argument(
        "--default-agent",
        metavar="ID",
        help="the lobby agent also served at the origin (/.well-known/agent-card.json, POST /)",
    )
    join = bridges.add_parser("join", help="join an A2A agent to the lobby as a lobby agent")
    join.add_argument("--agent-id", required=True, help="its lobby agent id")
    join.add_argument("--card", required=True, metavar="URL", help="its agent card's URL")
    join.add_argument("--lobby", default=lobby_url, metavar="URL", help="(%(default)s)")
    join.add_argument(
        "--authorize", nargs="+", metavar="ID", help="who may call its skills (default: anyone)"
    )


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the `lobby a2a` command `args` asks for; its exit status (a missing `bridges` extra
    is one line on stderr and exit status 1)."""
    try:
        from bridges import a2a_cli  # the `bridges` extra, loaded only here
    except ImportError as missing:
        sys.stderr.write(f"lobby: the A2A bridges need {missing.name}: {install_hint('bridges')}\n")
        return 1
    return a2a_cli.run(args)
