"""README.md runs as written: every Python block is a whole program, run as a new user runs it
(a file of its own, `python FILE`, `LOBBY_URL` pointing at a `lobby serve` process), twice in a
row against the same durable lobby, with each agent's saved token kept between the runs, and
prints the output the README shows (tests/docblocks.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson

from tests.conftest import LobbyProcess, start_lobby_process
from tests.docblocks import (
    ROOT,
    program_env,
    programs,
    python_blocks,
    run_once,
    serves,
    someone_else,
)

README = ROOT / "README.md"


def test_the_readme_shows_the_echo_example_as_it_is() -> None:
    assert programs(README)[0].code == (ROOT / "examples/echo/echo_agent.py").read_text()


def test_the_readme_shows_what_its_caller_prints() -> None:
    callers = [p for p in programs(README) if not serves(p)]
    assert callers
    assert all(p.output for p in callers)
    assert "text='hi' length=2" in (callers[0].output or "")


def test_every_python_block_of_the_readme_is_a_program() -> None:
    assert all(whole for whole, _, _ in python_blocks(README))
    assert "```py\n" not in README.read_text()


def arrivals(lobby: LobbyProcess, agent_id: str) -> list[object]:
    return [
        e.get("event")
        for e in lobby.events()
        if e.get("event") in ("AGENT_REGISTERED", "AGENT_RESUMED") and e.get("agent_id") == agent_id
    ]


def mailbox(data_dir: Path, agent_id: str) -> list[object]:
    done = subprocess.run(
        [sys.executable, "-m", "lobby", "mailbox", agent_id, "--json", "--data-dir", str(data_dir)],
        capture_output=True,
        check=True,
        timeout=30,
    )
    held: list[object] = orjson.loads(done.stdout)
    return held


def test_every_readme_program_runs_twice_against_one_durable_lobby(tmp_path: Path) -> None:
    readme = programs(README)
    assert len(readme) >= 2
    data_dir = tmp_path / "data"
    lobby = start_lobby_process(data_dir)
    env = program_env(lobby, tmp_path / "state")
    try:
        with someone_else(lobby, tmp_path, env):  # a lobby that already holds other agents
            outputs = [run for _ in range(2) for run in run_once(lobby, readme, tmp_path, env)]
        # Each agent registered on the first run and resumed on the second.
        for agent_id in ("echo", "my_client"):
            assert arrivals(lobby, agent_id) == ["AGENT_REGISTERED", "AGENT_RESUMED"], agent_id
        # A caller that exits leaves nothing behind.
        assert mailbox(data_dir, "my_client") == []
        # Tokens are kept in the state dir and in no log.
        tokens = [path.read_text() for path in (tmp_path / "state").rglob("*.token")]
        assert len(tokens) == 3  # echo, my_client, and the agent that was there before them
        logged = lobby.log_path.read_text() + "".join(out.stdout + out.stderr for out in outputs)
        assert not any(token in logged for token in tokens)
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(10)
