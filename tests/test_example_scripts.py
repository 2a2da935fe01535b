"""The examples that need more than the SDK, run as the examples page says: the Node.js agent
with its counterparts (twice), the servers the bridges' examples call started on their own, and
a one-line hint when the bridges extra is missing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import LobbyProcess
from tests.nodejs import ROOT, npm_installed

HINT = (
    "examples.{name} needs the bridges extra ({name} is not installed): "
    "make run EXTRAS=bridges, or .venv/bin/pip install -e '.[bridges]'\n"
)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts, stopped at its end."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.terminate()
        process.communicate(timeout=10)  # and close its pipes


def test_the_js_example_runs_twice(lobby_process: LobbyProcess) -> None:
    npm_installed(ROOT / "examples" / "js")
    env = dict(os.environ)  # the agent's token goes under this test's AGENT_LOBBY_STATE_DIR
    statuses = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "examples.js.run", "--lobby-url", lobby_process.url],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        statuses.append(json.loads(lines[0])["status"])
        assert '{"step":"done"}' in lines
        assert lines[-2:] == [
            "js_caller called reverse: {'text': 'ybbol olleh', 'length': 11}",
            "s sold {'r': 1} to js_agent at 15.00",
        ]
    assert statuses == ["success_registered_finalized", "success_resumed"]


@pytest.mark.parametrize("name", ["mcp", "a2a"])
def test_a_bridge_example_without_the_bridges_extra_says_how_to_install_it(name: str) -> None:
    hide = f"import runpy, sys; sys.modules[{name!r}] = None; "  # as if not installed
    done = subprocess.run(
        [sys.executable, "-c", hide + f"runpy.run_module('examples.{name}.run')"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr == HINT.format(name=name)


def test_the_shouter_serves_its_card_where_the_a2a_page_says(
    started: list[subprocess.Popen[str]],
) -> None:
    port = free_port()
    shouter = subprocess.Popen(
        [sys.executable, "-m", "examples.a2a.shouter", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    started.append(shouter)
    assert shouter.stdout is not None
    card_url = f"http://127.0.0.1:{port}/.well-known/agent-card.json"
    assert shouter.stdout.readline() == f"shouter (A2A agent): card at {card_url}\n"
    with urllib.request.urlopen(card_url, timeout=10) as answer:
        card = json.load(answer)
    assert card["name"] == "shouter"
    assert [skill["id"] for skill in card["skills"]] == ["shout"]


def test_the_tools_server_over_http_is_joined_by_the_bridge(
    lobby_process: LobbyProcess, started: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "examples.mcp.tools_server", "--http", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    started.append(server)
    assert server.stderr is not None
    url = f"http://127.0.0.1:{port}/mcp"
    assert server.stderr.readline() == f"calculator MCP server: {url}\n"
    bridge = subprocess.Popen(
        [
            *(sys.executable, "-m", "lobby", "bridge", "mcp", "--agent-id", "calculator"),
            *("--lobby", lobby_process.url, "--url", url),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    started.append(bridge)
    assert bridge.stderr is not None
    assert bridge.stderr.readline() == (
        "lobby bridge mcp: agent 'calculator' offers add, count, divide\n"
    )


def test_the_echo_agent_says_when_it_is_up_and_the_a2a_example_calls_it_as_it_runs(
    lobby_process: LobbyProcess, started: list[subprocess.Popen[str]]
) -> None:
    """The A2A page starts the echo agent; the A2A example then calls that one rather than
    starting its own, which would take the running agent's id over."""
    echo = subprocess.Popen(
        [sys.executable, "-m", "examples.echo.echo_agent"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LOBBY_URL": lobby_process.url},
    )
    started.append(echo)
    assert echo.stdout is not None
    assert echo.stdout.readline() == "echo is up: serving echo until Ctrl-C\n"
    registered = [e for e in lobby_process.events() if e.get("event") == "AGENT_REGISTERED"]
    assert [e["agent_id"] for e in registered] == ["echo"]
    done = subprocess.run(
        [sys.executable, "-m", "examples.a2a.run", "--lobby-url", lobby_process.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "A2A client: echo answered: 'hi' (2 characters)" in done.stdout
    assert echo.poll() is None  # still serving: not replaced
    echo_joined = [
        e["event"]
        for e in lobby_process.events()
        if e.get("agent_id") == "echo" and e.get("event") in ("AGENT_REGISTERED", "AGENT_RESUMED")
    ]
    assert echo_joined == ["AGENT_REGISTERED"]
