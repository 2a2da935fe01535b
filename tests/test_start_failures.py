"""A table of bad set-ups, each as a newcomer meets it: every `lobby` command that cannot start
says so in one line on stderr naming the cause and the fix, prints nothing on stdout first,
leaves nothing behind in the directory it ran in, and exits 2 for a bad flag or value, 1 for a
start that cannot happen. (tests/test_cli.py has `lobby serve`'s own: its settings, a port in
use, a data dir in use, a data dir or host it cannot use, a TLS file that is not PEM.)

A missing extra is a package the command cannot import: `sys.modules[name] = None`, what Python
does for a module it has found missing, before `lobby` runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import LobbyProcess, start_lobby_process

WITHOUT = """\
import runpy, sys
for name in sys.argv.pop(1).split(","):
    sys.modules[name] = None  # not installed
sys.argv[0] = "lobby"
runpy.run_module("lobby", run_name="__main__")
"""


@dataclass(frozen=True)
class BadSetUp:
    args: tuple[str, ...]  # `lobby` ARGS; {busy} a port something listens on, {dead} a free one,
    # {lobby} the running lobby's
    says: str  # in the one line
    status: int = 1
    env: tuple[tuple[str, str], ...] = ()
    without: str = ""  # packages not installed, comma-separated

    def __str__(self) -> str:
        without = f"without {self.without}: " if self.without else ""
        return without + " ".join(self.args) + "".join(f" {k}={v}" for k, v in self.env)


EXTRA = "make run EXTRAS={0}, or .venv/bin/pip install -e '.[{0}]' in the checkout"
TABLE = [
    # Extras not installed: the install hint that works in a fresh clone.
    BadSetUp(
        ("serve", "--transport", "picows"),
        "--transport picows needs the picows package: " + EXTRA.format("picows"),
        without="picows",
    ),
    BadSetUp(
        ("serve", "--cluster", "nats://127.0.0.1:{dead}", "--node-id", "a"),
        "--cluster needs nats-py: " + EXTRA.format("cluster"),
        without="nats",
    ),
    BadSetUp(
        ("serve", "--otel"),
        "needs OpenTelemetry: " + EXTRA.format("otel"),
        status=2,
        without="opentelemetry,opentelemetry.sdk",
    ),
    BadSetUp(("mcp", "--agent-id", "m"), "the MCP bridges need mcp", without="mcp"),
    BadSetUp(
        ("bridge", "mcp", "--agent-id", "b", "--", "true"),
        EXTRA.format("bridges"),
        without="mcp",
    ),
    BadSetUp(
        ("a2a", "serve", "--agent-id", "g", "--port", "0"),
        "the A2A bridges need a2a",
        without="a2a",
    ),
    BadSetUp(
        ("a2a", "join", "--agent-id", "j", "--card", "http://127.0.0.1:{dead}/"),
        "the A2A bridges need a2a",
        without="a2a",
    ),
    # Bad values, as flags and as LOBBY_* variables.
    BadSetUp(("serve", "--delivery-window", "abc"), "--delivery-window: 'abc'", status=2),
    BadSetUp(("serve", "--delivery-window", "0"), "--delivery-window 0: must be above 0", 2),
    BadSetUp(
        ("serve",),
        "LOBBY_DELIVERY_WINDOW='1MB': expected a whole number",
        2,
        env=(("LOBBY_DELIVERY_WINDOW", "1MB"),),
    ),
    BadSetUp(
        ("serve",),
        "LOBBY_DIALOGUE_TIMEOUT='-3': must be above 0",
        2,
        env=(("LOBBY_DIALOGUE_TIMEOUT", "-3"),),
    ),
    BadSetUp(("serve", "--admin-token", "short"), "--admin-token short: too short", 2),
    BadSetUp(("serve", "--tls-cert", "c.pem"), "--tls-cert and --tls-key go together", 2),
    BadSetUp(("serve", "--node-id", "a"), "--node-id a: only with --cluster", 2),
    BadSetUp(("serve", "--cluster-replicas", "3"), "--cluster-replicas 3: only with --cluster", 2),
    BadSetUp(("serve", "--cluster", "nats://127.0.0.1:{dead}"), "needs --node-id", 2),
    BadSetUp(("serve", "--cluster", "localhost:4222", "--node-id", "a"), "is not a NATS URL", 2),
    BadSetUp(("mcp", "--agent-id", "m", "--call-timeout", "abc"), "'abc' is not a number", 2),
    BadSetUp(("mcp", "--agent-id", "m", "--call-timeout", "0"), "0 is not a positive number", 2),
    BadSetUp(("mcp", "--agent-id", "m", "--http", "99999"), "99999 is not a port number", 2),
    BadSetUp(
        ("a2a", "serve", "--agent-id", "g", "--port", "0", "--tokens", "t.json"),
        "cannot read --tokens",
        2,
    ),
    # Starts that cannot happen: what they need is taken, or not there.
    BadSetUp(("serve", "--port", "{busy}"), "port {busy} is in use on 127.0.0.1"),
    BadSetUp(
        ("serve", "--cluster", "nats://127.0.0.1:{dead}", "--node-id", "a"),
        "cannot reach NATS at nats://127.0.0.1:{dead}",
    ),
    BadSetUp(("nats", "--port", "{busy}"), "--port {busy} is in use on 127.0.0.1"),
    BadSetUp(
        ("mcp", "--agent-id", "m", "--http", "{busy}"),
        "port {busy} is in use on 127.0.0.1: stop what holds it, or choose another --http",
    ),
    BadSetUp(
        ("a2a", "serve", "--agent-id", "g", "--port", "{busy}"),
        "port {busy} is in use on 127.0.0.1: stop what holds it, or choose another --port",
    ),
    BadSetUp(
        ("a2a", "join", "--agent-id", "j", "--card", "http://127.0.0.1:{dead}/card.json"),
        "agent card from http://127.0.0.1:{dead}/card.json",
    ),
    BadSetUp(
        ("bridge", "mcp", "--agent-id", "b", "--url", "http://127.0.0.1:{dead}/mcp"),
        "cannot reach the MCP server at http://127.0.0.1:{dead}/mcp",
    ),
    BadSetUp(("bridge", "mcp", "--agent-id", "b", "--", "./no-such-server"), "no-such-server"),
    BadSetUp(
        ("revoke", "someone"), "no lobby store at .lobby/lobby.sqlite3 (is --data-dir right?)"
    ),
    BadSetUp(
        ("revoke", "someone", "--url", "ws://127.0.0.1:{lobby}/admin", "--admin-token", "x" * 20),
        "the lobby at ws://127.0.0.1:{lobby}/admin refused the admin token",
    ),
]


@pytest.fixture(scope="module")
def lobby(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LobbyProcess]:
    """A lobby running, as after `make run`: the bridges' failures come after they connect."""
    process = start_lobby_process(tmp_path_factory.mktemp("lobby"))
    yield process
    process.signal(signal.SIGTERM)
    process.wait(10)


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, str]]:
    """{busy}: a port something listens on; {dead}: a port nothing answers on (bound, so no
    one else takes it, but not listening)."""
    with socket.socket() as busy, socket.socket() as dead:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        dead.bind(("127.0.0.1", 0))
        yield {"busy": str(busy.getsockname()[1]), "dead": str(dead.getsockname()[1])}


def test_the_table_holds_every_kind_of_start_up_failure() -> None:
    assert len(TABLE) >= 15
    assert len({str(row) for row in TABLE}) == len(TABLE)
    commands = {row.args[0] for row in TABLE}
    assert commands >= {"serve", "mcp", "bridge", "a2a", "nats", "revoke"}


@pytest.mark.parametrize("row", TABLE, ids=str)
def test_a_start_that_cannot_happen_is_one_line_naming_cause_and_fix(
    row: BadSetUp, lobby: LobbyProcess, ports: dict[str, str], tmp_path: Path
) -> None:
    cwd = tmp_path / "clone"
    cwd.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LOBBY_", "PYTEST"))},
        "LOBBY_URL": lobby.url,
        "LOBBY_PORT": str(lobby.port),
        "AGENT_LOBBY_STATE_DIR": str(tmp_path / "state"),
        **dict(row.env),
    }
    ports = {**ports, "lobby": str(lobby.port)}
    args = [arg.format(**ports) for arg in row.args]
    if row.args[0] == "serve" and "--port" not in row.args:
        args += ["--port", "0"]
    blocker = ["-c", WITHOUT, row.without] if row.without else ["-m", "lobby"]
    done = subprocess.run(
        [sys.executable, *blocker, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("lobby"), lines[0]
    assert row.says.format(**ports) in lines[0]
    assert done.returncode == row.status, lines[0]
    assert done.stdout == ""
    assert list(cwd.iterdir()) == []
