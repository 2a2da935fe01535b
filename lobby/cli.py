"""`lobby serve | schema`: the daemon's command line.

Every `serve` flag can also come from an environment variable: `--max-message-bytes` from
`LOBBY_MAX_MESSAGE_BYTES`, and so on; a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args

import orjson

from lobby import admin
from lobby.config import LogFormat, Settings, StoreKind, TransportKind
from lobby.logs import configure
from lobby.server import LobbyServer
from protocol.schema import all_schemas

_HELP = {
    "host": "address to listen on",
    "port": "port to listen on (0: any free port)",
    "data_dir": "directory for the lobby's data (the sqlite store)",
    "store": "sqlite (durable) or memory",
    "transport": "websockets, or picows (pip install 'agent-lobby[picows]')",
    "fsync": "sync every commit to disk",
    "dedupe_horizon": "seconds a sender's message_id is remembered for dedupe",
    "dedupe_max": "most message ids remembered for dedupe",
    "commit_interval": "seconds between the starts of two group commits",
    "compact_interval": "seconds between store checkpoints",
    "dialogue_timeout": "seconds a dialogue may idle before it expires",
    "max_message_bytes": "largest accepted frame; larger ones close the connection with 1009",
    "max_outbound_bytes": "bytes queued for one slow receiver before it is closed with 4002",
    "mailbox_limit": "messages held for one offline agent before senders get mailbox_full",
    "message_rate": "messages per second one agent may send (0: no limit)",
    "message_burst": "messages one agent may send at once",
    "max_capabilities": "capabilities one agent may declare",
    "max_open_requests": "REQUESTs one agent may have waiting for a final RESPONSE (0: no limit)",
    "max_open_dialogues": "open negotiation dialogues one agent may have started (0: no limit)",
    "max_discover_bytes": "bytes of one DISCOVER_SERVICES answer (then fewer results, a cursor)",
    "max_connections": "connections at once (more get HTTP 503)",
    "handshake_timeout": "seconds a connection has to REGISTER (then closed with 1008)",
    "registration_rate": "REGISTER attempts per second per source address (0: no limit)",
    "registration_burst": "REGISTER attempts at once per source address",
    "registration_key": "secret REGISTER payloads must carry as registration_key",
    "tls_cert": "PEM certificate file: serve wss:// (with --tls-key)",
    "tls_key": "PEM private key file for --tls-cert",
    "ping_interval": "seconds between keepalive pings",
    "ping_timeout": "seconds to wait for a pong before dropping the connection",
    "shutdown_timeout": "seconds to close every connection on SIGINT/SIGTERM",
    "log_format": "json (one object a line) or console",
    "log_level": "debug, info, warning or error",
}


_OPTIONAL: dict[str, Callable[[str], Any]] = {
    "registration_key": str,
    "tls_cert": Path,
    "tls_key": Path,
}


def _env_default(name: str, default: Any, convert: Callable[[str], Any]) -> Any:
    raw = os.environ.get(f"LOBBY_{name.upper()}")
    return default if raw is None else convert(raw)


def _flag(raw: str) -> bool:
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lobby", description="The Agent Lobby daemon.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the lobby")
    defaults = Settings()
    for f in fields(Settings):
        default = getattr(defaults, f.name)
        convert: Callable[[str], Any] = _flag if isinstance(default, bool) else type(default)
        if default is None:
            convert = _OPTIONAL[f.name]
        option = "--" + f.name.replace("_", "-")
        shown = " (%(default)s)" if f.name != "registration_key" else ""
        kwargs: dict[str, Any] = {"help": _HELP[f.name] + shown}
        if isinstance(default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = convert
        choices = {"log_format": LogFormat, "store": StoreKind, "transport": TransportKind}
        if f.name in choices:
            kwargs["choices"] = list(get_args(choices[f.name]))
        serve.add_argument(option, default=_env_default(f.name, default, convert), **kwargs)

    schema = commands.add_parser("schema", help="print the JSON Schema of every message")
    schema.add_argument("--write", type=Path, metavar="DIR", help="write one file a message")

    data_dir = _env_default("data_dir", defaults.data_dir, Path)
    for name, help_text in (
        ("agents", "list registered agents, from the store"),
        ("mailbox", "list the messages held for one agent, from the store"),
        ("transactions", "list the ledger, from the store"),
    ):
        admin = commands.add_parser(name, help=help_text)
        if name == "mailbox":
            admin.add_argument("agent_id")
        admin.add_argument("--data-dir", type=Path, default=data_dir, help="(%(default)s)")
        admin.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "schema":
        return _schema(args.write)
    if args.command in ("agents", "mailbox", "transactions"):
        return _admin(args)
    settings = Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})
    configure(log_format=settings.log_format, level=settings.log_level)
    _run(_serve(settings))
    return 0


def _admin(args: argparse.Namespace) -> int:
    try:
        db = admin.open_readonly(args.data_dir)
    except admin.StoreNotFound as exc:
        sys.stderr.write(f"lobby: {exc}\n")
        return 1
    with contextlib.closing(db):
        if args.command == "agents":
            rows = admin.agents(db)
        elif args.command == "mailbox":
            rows = admin.mailbox(db, args.agent_id)
        else:
            rows = admin.transactions(db)
    sys.stdout.write(admin.render(rows, as_json=args.json) + "\n")
    return 0


def _schema(directory: Path | None) -> int:
    schemas = all_schemas()
    if directory is None:
        sys.stdout.write(orjson.dumps(schemas, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas.items():
        (directory / name).write_bytes(schema_file_bytes(schema))
    return 0


def schema_file_bytes(schema: dict[str, Any]) -> bytes:
    """The committed form of one schema file (the sync test compares against this)."""
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


async def _serve(settings: Settings) -> None:
    _raise_open_files_limit()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await LobbyServer(settings).serve_until(stop)


def _raise_open_files_limit() -> None:
    """Each agent is a socket: allow as many as the hard limit permits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (it is by default on Linux), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)
