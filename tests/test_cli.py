"""`lobby serve` and `lobby schema` as an operator runs them: real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import websocket

from lobby.cli import schema_file_bytes
from protocol.models import MessageType
from protocol.schema import all_schemas
from tests.conftest import start_lobby_process

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
def test_a_signal_stops_the_lobby_cleanly_within_two_seconds(tmp_path: Path, signum: int) -> None:
    proc = start_lobby_process(tmp_path / "data")
    ws = websocket.create_connection(proc.url, timeout=5)
    try:
        assert register(ws, "watcher")["message_type"] == "REGISTER_ACK"
        started = time.monotonic()
        proc.signal(signum)
        assert close_code(ws) == 1001
        assert proc.wait(2) == 0
        assert time.monotonic() - started < 2
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
