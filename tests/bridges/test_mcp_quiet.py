"""`lobby mcp --http` keeps quiet when its clients leave (bridges/mcp_quiet.py): an official MCP
client that ends its session, and a raw HTTP client that drops its connection in the middle
of a stream, leave nothing on stderr but the line saying where it serves; the SDK's ERROR with
an `anyio.ClosedResourceError` traceback is gone."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import anyio
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bridges.mcp_quiet import SERVER_LOGGER, Disconnects
from tests.conftest import start_lobby_process

ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


async def leave_with_the_sdk_client(url: str) -> None:
    async with (
        streamable_http_client(url) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.list_tools()
    # Leaving ended the session (DELETE) while its stream for server messages was open.


async def drop_a_stream(url: str) -> None:
    async with httpx.AsyncClient(timeout=10) as web:
        started = await web.post(url, headers=ACCEPT, json=INITIALIZE)
        session = {**ACCEPT, "mcp-session-id": started.headers["mcp-session-id"]}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await web.post(url, headers=session, json=initialized)
        async with web.stream("GET", url, headers=session) as stream:
            assert stream.status_code == 200
    # The client closed: the connection went with the stream open, no DELETE.


async def test_clients_that_leave_or_drop_their_stream_print_nothing(tmp_path: Path) -> None:
    lobby = start_lobby_process(tmp_path / "data")
    try:
        server = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "lobby", "mcp", "--agent-id", "watcher"),
            *("--lobby", lobby.url, "--http", "0"),
            stderr=asyncio.subprocess.PIPE,
        )
        assert server.stderr is not None
        line = (await asyncio.wait_for(server.stderr.readline(), 30)).decode()
        assert line.startswith("lobby mcp: serving MCP on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        for _ in range(2):
            await leave_with_the_sdk_client(url)
            await drop_a_stream(url)
        await leave_with_the_sdk_client(url)  # and it still serves
        server.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(server.communicate(), 30)
        assert server.returncode == 0
        assert err.decode() == "", err.decode()
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(10)


def test_a_client_gone_is_one_debug_line_and_other_errors_stay() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(SERVER_LOGGER)
    keep = Keep()
    logger.addHandler(keep)
    logger.addFilter(quiet := Disconnects())
    try:
        for level in (logging.WARNING, logging.DEBUG):
            logger.setLevel(level)
            for error in (anyio.ClosedResourceError(), ExceptionGroup("g", [anyio.EndOfStream()])):
                try:
                    raise error
                except Exception:
                    logger.exception("Error in standalone SSE writer")
            try:
                raise ValueError("a real problem")
            except ValueError:
                logger.exception("Error handling POST request")
    finally:
        logger.removeFilter(quiet)
        logger.removeHandler(keep)
        logger.setLevel(logging.NOTSET)
    seen = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in records]
    gone = "Error in standalone SSE writer: the client went away"
    assert seen == [
        ("ERROR", "Error handling POST request", True),
        ("DEBUG", f"{gone} (ClosedResourceError)", False),
        ("DEBUG", f"{gone} (ExceptionGroup)", False),
        ("ERROR", "Error handling POST request", True),
    ]
