"""`lobby serve | schema | asyncapi | agents | mailbox | transactions | backup | revoke |
remove | nats | mcp | bridge | a2a`: the daemon's command line (the bridges' commands come
from their own package, through `lobby.extra_commands`).

`serve` takes its settings from flags, `LOBBY_*` variables and a TOML file (`lobby.options`).
A bad setting or a start that cannot happen (the port in use, the data dir held by another
lobby) is one line on stderr and a non-zero exit (2 for a bad setting, 1 otherwise), with no
new data dir left behind; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import gc
import importlib.util
import os
import resource
import shutil
import signal
import socket
import sqlite3
import ssl
import sys
from collections.abc import Coroutine, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

import orjson
import structlog

from lobby import admin, admin_cli, backup, dashboard, extra_commands, reset_cli
from lobby.admin_endpoint import TOKEN_FILE
from lobby.config import SettingError, Settings
from lobby.extras import install_hint
from lobby.logs import configure
from lobby.natsdev import add_nats_parser, run_nats
from lobby.options import add_serve_options, settings_from
from lobby.server import LobbyServer
from lobby.store.base import StoreUnavailable
from lobby.store.sqlite import FILE_NAME, SqliteStore, StoreLocked
from lobby.transport.base import tls_context
from protocol.asyncapi import VIEWS, asyncapi_document
from protocol.schema import all_schemas

log = structlog.get_logger("lobby.cluster")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lobby", description="The Agent Lobby daemon.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = commands.add_parser(
        "serve",
        help="run the lobby",
        description="Run the lobby. Each option can also be set as LOBBY_<OPTION> in the "
        "environment (LOBBY_MAX_MESSAGE_BYTES=1000) or in a --config file; a flag wins.",
    )
    add_serve_options(serve)
    defaults = Settings()

    schema = commands.add_parser("schema", help="print the JSON Schema of every message")
    schema.add_argument("--write", type=Path, metavar="DIR", help="write one file a message")
    asyncapi = commands.add_parser("asyncapi", help="print the AsyncAPI 3.0 document")
    asyncapi.add_argument("--write", type=Path, metavar="PATH", help="write it to this file")
    asyncapi.add_argument(
        "--view",
        choices=VIEWS,
        default="lobby",
        help="whose side it describes: the lobby's (default) or an agent's (for client generators)",
    )
    backup.add_command(commands)
    add_nats_parser(commands)

    data_dir = Path(os.environ.get("LOBBY_DATA_DIR") or defaults.data_dir)
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
    admin_cli.add_commands(commands)
    reset_cli.add_command(commands)
    for extra in extra_commands.installed():
        extra.add_commands(commands, _Parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for extra in extra_commands.installed():
        if args.command in extra.COMMANDS:
            return extra.run(parser, args)
    if args.command == "schema":
        return _schema(args.write)
    if args.command == "asyncapi":
        content = schema_file_bytes(asyncapi_document(args.view))
        if args.write is None:
            sys.stdout.buffer.write(content)
        else:
            args.write.write_bytes(content)
        return 0
    if args.command in ("agents", "mailbox", "transactions"):
        return _admin(args)
    if args.command == "backup":
        return backup.run(args)
    if args.command in admin_cli.COMMANDS:
        try:
            done, refused = admin_cli.run(args)
        except admin_cli.AdminFailed as failed:
            sys.stderr.write(f"lobby: {failed}\n")
            return 1
        sys.stdout.write("".join(f"{line}\n" for line in done))
        sys.stderr.write("".join(f"lobby: {line}\n" for line in refused))
        return 1 if refused else 0
    if args.command == "reset":
        try:
            lines = reset_cli.run(args)
        except reset_cli.ResetRefused as refused:
            sys.stderr.write(f"lobby: {refused}\n")
            return 1
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        return 0
    if args.command == "nats":
        return run_nats(args)
    try:
        settings = settings_from(args, os.environ)
    except SettingError as bad:
        sys.stderr.write(f"lobby: {bad}\n")
        return 2
    configure(log_format=settings.log_format, level=settings.log_level)
    sqlite = settings.store == "sqlite" and settings.cluster is None
    created = _first_missing(settings.data_dir) if sqlite else None
    try:
        _run(_serve(settings))
    except StartFailed as failed:
        if created is not None:  # a failed start leaves nothing behind
            shutil.rmtree(created, ignore_errors=True)
        sys.stderr.write(f"lobby: {failed}\n")
        return 1
    return 0


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (what starting creates)."""
    missing = None
    path = path.absolute()
    while not path.exists():
        missing, path = path, path.parent
    return missing


class StartFailed(Exception):
    """The lobby could not start, for a reason one line tells."""


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
            try:
                rows = admin.mailbox(db, args.agent_id)
            except admin.UnknownAgent as exc:
                sys.stderr.write(f"lobby: {exc}\n")
                return 1
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
    """Run the lobby until SIGINT/SIGTERM. With --cluster, a node found fenced (another node
    failed it over while it was cut off or paused, `LobbyServer.fence`) is stopped and started
    again with the same settings, on the same port: its new store claims a new epoch and
    loads what is left of its journal (`lobby.cluster.recovery`). Fenced by a second process
    with its node id, it stays down (503, refusing everyone) until stopped."""
    _raise_open_files_limit()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    server = await _started(settings)
    sys.stderr.write(f"lobby: {where_to_look(server)}\n")
    # What exists once the lobby is up lives as long as the process: the collector need not
    # walk it again. Routing allocates dozens of objects per message, few of them in cycles:
    # a young generation of 20,000 instead of 700 runs the collector far less often.
    gc.freeze()
    gc.set_threshold(20_000, *gc.get_threshold()[1:])
    while True:
        try:
            await _first(stop, server.stepped_down)
        finally:
            if stop.is_set() or not server.stepped_down.is_set():
                if stop.is_set():
                    # The process ends with this stop: what exists now is freed with it, not
                    # walked by the collector (at 20,000 agents, seconds of the stop and exit).
                    gc.freeze()
                await server.stop()
        if stop.is_set():
            return
        if not await _rejoins(server):
            try:
                await stop.wait()  # fenced, refusing everyone, saying why on /readyz
            finally:
                await server.stop()
            return
        rejoined = await _rejoined(server, stop)
        if rejoined is None:
            return
        server = rejoined


def where_to_look(server: LobbyServer) -> str:
    """The one line a person starting the lobby needs next: the dashboard's URL and where the
    admin token that opens it is (never the token itself: a terminal may be recorded)."""
    settings = server.settings
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if settings.tls_cert else "http"
    if settings.admin_token is not None:
        where = "admin token: the one you set"
    elif isinstance(server.store, SqliteStore):
        where = f"admin token in {server.store.path.parent / TOKEN_FILE}"
    else:
        where = "admin token on the line above"
    return f"dashboard at {scheme}://{host}:{server.port}{dashboard.PATH} ({where})"


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _rejoins(fenced: LobbyServer) -> bool:
    """Whether the fenced node should rejoin: yes if another node claimed it (a failover), no
    if a second process started with its node id did (rejoining would fence that one, which
    would rejoin in turn)."""
    cluster = fenced.cluster
    if cluster is None:
        return False
    if fenced.unstored:
        return True  # its own commit failed: its epoch is still its own
    for _ in range(10):  # NATS may be reconnecting
        claimant = await cluster.recovery.claimant()
        if claimant is not None:
            break
        await asyncio.sleep(0.5)
    if claimant == cluster.node_id:
        log.error("CLUSTER_NODE_ID_TAKEN", node_id=cluster.node_id)
        return False
    return True


async def _rejoined(fenced: LobbyServer, stop: asyncio.Event) -> LobbyServer | None:
    """Stop the fenced `fenced` and start its successor (None if a signal came first); a start
    that fails (NATS away) is tried again every second."""
    settings = dataclasses.replace(fenced.settings, port=fenced.port)
    await fenced.stop()
    while not stop.is_set():
        try:
            server = await _started(settings)
        except StartFailed as failed:
            log.warning("CLUSTER_REJOIN_FAILED", node_id=settings.node_id, error=str(failed))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            continue
        epoch = getattr(server.store, "epoch", None)
        log.info("CLUSTER_REJOINED", node_id=settings.node_id, epoch=epoch)
        if stop.is_set():
            await server.stop()
            return None
        return server
    return None


async def _started(settings: Settings) -> LobbyServer:
    """A started LobbyServer (raises StartFailed with the one line to print). A data dir this
    start made is removed again when it fails."""
    made = not settings.data_dir.exists()
    try:
        _preflight(settings)
        return await _starting(settings)
    except StartFailed:
        if made:
            shutil.rmtree(settings.data_dir, ignore_errors=True)
        raise


def _preflight(settings: Settings) -> None:
    """What can be checked before the store is opened (and logs its first line): the
    transport's package, the TLS files, and that the address can be listened on."""
    if settings.transport == "picows" and importlib.util.find_spec("picows") is None:
        raise StartFailed(f"--transport picows needs the picows package: {install_hint('picows')}")
    try:
        tls_context(settings.tls_cert, settings.tls_key)
    except ssl.SSLError as exc:  # before OSError, of which it is a kind
        raise StartFailed(_tls_failure(settings, exc)) from None
    except OSError as exc:
        raise StartFailed(f"cannot read --tls-cert or --tls-key: {exc}") from None
    try:
        # A bind as the server will make (SO_REUSEADDR), closed at once: a port in use or an
        # address not of this machine is said before anything else is done.
        socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)
        with socket.create_server((settings.host, settings.port)):
            pass
    except OSError as exc:
        raise StartFailed(_listen_failure(settings, exc)) from None
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartFailed(
            f"cannot use --data-dir {str(settings.data_dir)!r}: {exc.strerror or exc}"
        ) from None


def _tls_failure(settings: Settings, exc: ssl.SSLError) -> str:
    return (
        f"cannot load --tls-cert {settings.tls_cert} with --tls-key {settings.tls_key}: "
        f"not a PEM certificate chain and its private key ({exc.reason or exc})"
    )


async def _starting(settings: Settings) -> LobbyServer:
    if settings.cluster is not None and settings.node_id is not None:
        try:
            from lobby.cluster.recovery import wait_for_recovery  # nats-py: the cluster extra
        except ImportError:
            pass  # open_store says what is missing
        else:
            await wait_for_recovery(settings.cluster_urls(), settings.node_id)
    try:
        server = LobbyServer(settings)
    except (StoreLocked, StoreUnavailable) as locked:
        raise StartFailed(str(locked)) from None
    except sqlite3.DatabaseError as exc:
        path = settings.data_dir / FILE_NAME
        raise StartFailed(f"cannot open the store {str(path)!r}: {exc}") from None
    try:
        await server.start()
    except ssl.SSLError as exc:  # before OSError, of which it is a kind
        raise StartFailed(_tls_failure(settings, exc)) from None
    except OSError as exc:
        raise StartFailed(_listen_failure(settings, exc)) from None
    except StoreUnavailable as exc:  # --cluster: the shared registry
        raise StartFailed(str(exc)) from None
    return server


def _listen_failure(settings: Settings, exc: OSError) -> str:
    where = f"{settings.host}:{settings.port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {settings.port} is in use on {settings.host} (another lobby?): stop it, "
            "or choose another --port"
        )
    if exc.errno == errno.EACCES:
        return (
            f"not allowed to listen on {where} (ports below 1024 need privileges): "
            "choose another --port"
        )
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(exc, socket.gaierror):
        return f"cannot listen on --host {settings.host!r}: not an address of this machine"
    return f"cannot listen on {where}: {exc.strerror or exc}"


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


def _version() -> str:
    try:
        return metadata.version("agent-lobby")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"
