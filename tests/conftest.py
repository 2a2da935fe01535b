"""Shared fixtures: a real lobby on 127.0.0.1 (free port), in this process or in a child one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import orjson
import pytest

from lobby.config import Settings
from lobby.server import LobbyServer

# Every test agent connects from 127.0.0.1: the per-address registration limit is off here and
# tested on its own (tests/test_limits.py).
SETTINGS = Settings(host="127.0.0.1", port=0, log_level="warning", registration_rate=0)


TRANSPORTS = ["websockets", "picows"]


@pytest.fixture(autouse=True)
def agent_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's agents keep their tokens in the test's own directory (never the real
    home), and child processes inherit it."""
    state = tmp_path / "agent-state"
    monkeypatch.setenv("AGENT_LOBBY_STATE_DIR", str(state))
    return state


@pytest.fixture(params=TRANSPORTS)
async def lobby(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[LobbyServer]:
    """A lobby in the test's own event loop, on a free port, with its sqlite store in a
    fresh directory (the default store, as `lobby serve` runs it); every test that uses it
    runs once on each transport."""
    server = LobbyServer(
        replace(SETTINGS, data_dir=tmp_path / "lobby-data", transport=request.param)
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def lobby_settings() -> Settings:
    return SETTINGS


def make_lobby(data_dir: Path, **overrides: object) -> LobbyServer:
    """A lobby with its store in `data_dir` and some settings changed; the caller starts and
    stops it."""
    return LobbyServer(replace(SETTINGS, data_dir=data_dir, **overrides))  # type: ignore[arg-type]


@dataclass
class LobbyProcess:
    """`lobby serve` in a child process, as an operator runs it. Its log goes to `log_path`."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def events(self) -> list[dict[str, object]]:
        """The JSON log lines written so far."""
        out = []
        for line in self.log_path.read_bytes().splitlines():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        return out


def start_lobby_process(
    data_dir: Path, *extra: str, port: int = 0, timeout: float = 15.0
) -> LobbyProcess:
    """Start `python -m lobby serve` and wait until it logs the port it bound."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"lobby-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "lobby", "serve"),
                *("--port", str(port), "--data-dir", str(data_dir)),
                *extra,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LOBBY_HOST": "127.0.0.1"},
        )
    proc = LobbyProcess(process, 0, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in proc.events():
            if event.get("event") == "LOBBY_LISTENING":
                proc.port = int(event["port"])  # type: ignore[call-overload]
                return proc
        if process.poll() is not None:
            break
        time.sleep(0.02)
    process.kill()
    raise RuntimeError(f"lobby did not start: {log_path.read_text()[-2000:]}")


@pytest.fixture
def lobby_process(tmp_path: Path) -> Iterator[LobbyProcess]:
    proc = start_lobby_process(tmp_path / "data")
    try:
        yield proc
    finally:
        if proc.process.poll() is None:
            proc.signal(signal.SIGKILL)
        proc.process.wait(5)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Tests run in random order (pytest-randomly): say which order, so a failure that
    depends on it can be replayed with the same seed."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        terminalreporter.write_line(f"random order: replay it with --randomly-seed={seed}")
