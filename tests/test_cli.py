"""`lobby serve` and `lobby schema` as an operator runs them: real processes, real signals."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import websocket

from lobby.cli import schema_file_bytes
from protocol.models import MessageType
from protocol.schema import all_schemas
from tests.conftest import LobbyProcess, start_lobby_process
from tests.waiting import BOUND, wait_until

SCHEMA_DIR = Path(__file__).parent.parent / "protocol" / "schema"


def close_code(ws: websocket.WebSocket) -> int:
    """Read until the lobby's close frame; return its code."""
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            ws.send_close()  # complete the closing handshake, as a well-behaved client does
            return int.from_bytes(frame.data[:2], "big")


def register(ws: websocket.WebSocket, agent_id: str) -> dict[str, object]:
    ws.send(
        orjson.dumps(
            {
                "sender_id": agent_id,
                "receiver_id": "global_lobby",
                "message_type": "REGISTER",
                "payload": {},
            }
        ).decode()
    )
    reply: dict[str, object] = orjson.loads(ws.recv())
    return reply


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_lobby_cleanly(tmp_path: Path, signum: int) -> None:
    """Each agent is told 1001, then the lobby logs its stop and exits 0 by itself."""
    proc = start_lobby_process(tmp_path / "data")
    ws = websocket.create_connection(proc.url, timeout=BOUND)
    try:
        assert register(ws, "watcher")["message_type"] == "REGISTER_ACK"
        proc.signal(signum)
        assert close_code(ws) == 1001
        assert proc.wait(BOUND) == 0
        assert [e["event"] for e in proc.events()][-1] == "LOBBY_STOPPED"
    finally:
        ws.shutdown()  # type: ignore[no-untyped-call]
        if proc.process.poll() is None:
            proc.process.kill()


def test_settings_come_from_lobby_env_vars(tmp_path: Path) -> None:
    os.environ["LOBBY_MAX_MESSAGE_BYTES"] = "500"
    try:
        proc = start_lobby_process(tmp_path / "data")
    finally:
        del os.environ["LOBBY_MAX_MESSAGE_BYTES"]
    ws = websocket.create_connection(proc.url, timeout=5)
    try:
        ws.send("x" * 1000)
        assert close_code(ws) == 1009
    finally:
        ws.shutdown()  # type: ignore[no-untyped-call]
        proc.signal(signal.SIGTERM)
        proc.wait(5)


def test_lobby_schema_prints_every_message() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lobby", "schema"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    schemas = orjson.loads(done.stdout)
    for message_type in MessageType:
        assert schemas[f"{message_type.value}.json"]["title"] == message_type.value


def test_committed_schemas_match_the_models() -> None:
    expected = {name: schema_file_bytes(schema) for name, schema in all_schemas().items()}
    committed = {path.name: path.read_bytes() for path in SCHEMA_DIR.glob("*.json")}
    assert sorted(committed) == sorted(expected), "run `make schema` and commit the result"
    for name, content in expected.items():
        assert committed[name] == content, f"{name} is stale: run `make schema`"


def lobby_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lobby", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("lobby"), lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--port", "99999"], {}, "--port 99999"),
        ([], {"LOBBY_PORT": "abc"}, "LOBBY_PORT='abc'"),
        ([], {"LOBBY_STORE": "bogus"}, "LOBBY_STORE='bogus'"),
        ([], {"LOBBY_FSYNC": "maybe"}, "LOBBY_FSYNC='maybe'"),
        ([], {"LOBBY_LOG_FORMAT": "xml"}, "LOBBY_LOG_FORMAT='xml'"),
        ([], {"LOBBY_MAX_MESSAGE_BYTES": "-5"}, "LOBBY_MAX_MESSAGE_BYTES='-5'"),
        (["--log-level", "verbose"], {}, "--log-level"),
        (["--data-dir", "a_file"], {}, "--data-dir a_file"),
        (["--tls-cert", "nope.pem", "--tls-key", "nope.pem"], {}, "--tls-cert nope.pem"),
        (["--config", "nope.toml"], {}, "nope.toml"),
    ],
)
def test_a_bad_setting_is_one_line_exit_2_and_creates_nothing(
    tmp_path: Path, args: list[str], env: dict[str, str], names: str
) -> None:
    (tmp_path / "a_file").write_text("")
    done = lobby_cli("serve", "--data-dir", "data", *args, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert names in one_line(done)
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


def test_a_port_in_use_is_one_line_and_leaves_no_data_dir(tmp_path: Path) -> None:
    first = start_lobby_process(tmp_path / "first")
    try:
        port = str(first.port)
        done = lobby_cli("serve", "--port", port, "--data-dir", "second/data", cwd=tmp_path)
        assert done.returncode == 1
        assert f"port {port} is in use" in one_line(done)
        assert done.stdout == ""  # said before the store is opened: no log line first
        assert not (tmp_path / "second").exists()
    finally:
        first.signal(signal.SIGTERM)
        first.wait(5)


def test_a_second_lobby_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    first = start_lobby_process(tmp_path / "data")
    try:
        done = lobby_cli("serve", "--port", "0", "--data-dir", "data", cwd=tmp_path)
        assert done.returncode == 1
        line = one_line(done)
        assert f"another lobby (pid {first.process.pid}) is running on data dir 'data'" in line
        assert first.process.poll() is None
    finally:
        first.signal(signal.SIGTERM)
        first.wait(5)
    # Once the first has stopped, the data dir is free again.
    second = start_lobby_process(tmp_path / "data")
    second.signal(signal.SIGTERM)
    assert second.wait(5) == 0


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--data-dir", "/proc/nope/data"], "cannot use --data-dir '/proc/nope/data'"),
        (["--host", "10.255.255.254"], "cannot listen on --host '10.255.255.254'"),
        (["--host", "no-such-host.invalid"], "cannot listen on --host 'no-such-host.invalid'"),
    ],
)
def test_a_start_that_cannot_happen_is_one_line_before_anything_else(
    tmp_path: Path, args: list[str], names: str
) -> None:
    done = lobby_cli("serve", "--port", "0", "--data-dir", "data", *args, cwd=tmp_path)
    assert done.returncode == 1
    assert names in one_line(done)
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_tls_cert_that_is_not_pem_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    done = lobby_cli(
        *("serve", "--port", "0", "--data-dir", "data"),
        *("--tls-cert", "cert.pem", "--tls-key", "cert.pem"),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "cannot load --tls-cert cert.pem" in one_line(done)
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()


def test_mailbox_of_an_unknown_agent_fails_with_a_sentence(tmp_path: Path) -> None:
    lobby = start_lobby_process(tmp_path / "data")
    lobby.signal(signal.SIGTERM)
    lobby.wait(5)
    done = lobby_cli("mailbox", "nosuch", "--data-dir", "data", cwd=tmp_path)
    assert done.returncode == 1
    assert "no agent 'nosuch' is registered" in one_line(done)


def test_version_and_help_show_readable_defaults(tmp_path: Path) -> None:
    version = lobby_cli("--version", cwd=tmp_path)
    assert version.returncode == 0
    assert version.stdout.startswith("lobby 0.")
    helped = lobby_cli("serve", "--help", cwd=tmp_path).stdout
    assert "(default: sqlite)" in helped
    assert "(None)" not in helped


def test_console_logs_written_to_a_file_carry_no_colour_codes(tmp_path: Path) -> None:
    log_path = tmp_path / "lobby.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "lobby", "serve", "--port", "0", "--log-format", "console"],
            cwd=tmp_path,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "LOBBY_LISTENING" in log_path.read_text(), "LOBBY_LISTENING")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(5) == 0
    text = log_path.read_text()
    assert "LOBBY_STOPPED" in text
    assert "\x1b[" not in text


def test_a_terminal_gets_console_logs_and_where_the_dashboard_is(tmp_path: Path) -> None:
    """`make run` in a terminal: console lines, not JSON, and one line naming the dashboard's
    URL and the admin token's file (never the token)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "lobby", "serve", "--port", "0", "--data-dir", "data"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        env={key: value for key, value in os.environ.items() if key != "LOBBY_LOG_FORMAT"},
    )
    os.close(terminal)
    seen = b""
    try:
        while b"dashboard at" not in seen or not seen.endswith(b"\n"):
            ready, _, _ = select.select([controller], [], [], 15)
            assert ready, f"nothing more from the lobby after {seen!r}"
            seen += os.read(controller, 65536)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(5) == 0
        os.close(controller)
    text = seen.decode()
    assert "LOBBY_LISTENING" in text
    assert '"event"' not in text  # not JSON
    token_file = tmp_path / "data" / "admin.token"
    [line] = [line for line in text.splitlines() if "dashboard at" in line]
    assert re.fullmatch(
        r"lobby: dashboard at http://127\.0\.0\.1:\d+/dashboard "
        r"\(admin token in data/admin\.token\)",
        line.strip(),
    )
    assert token_file.read_text().strip() not in text


def test_a_pipe_gets_json_logs(lobby_process: LobbyProcess) -> None:
    assert any(event.get("event") == "LOBBY_LISTENING" for event in lobby_process.events())
