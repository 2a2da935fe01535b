"""An agent script as its user runs it (`python FILE`, a real lobby): how it ends when the lobby
refuses it, and what it prints."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from agent_sdk import Agent
from lobby.server import LobbyServer

ROOT = Path(__file__).resolve().parent.parent

SERVER = """
from agent_sdk import Agent

Agent("taken").run_forever()
"""


async def run_script(source: str, tmp_path: Path, url: str) -> tuple[int, str, str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    env = {
        **os.environ,
        "LOBBY_URL": url,
        "AGENT_LOBBY_STATE_DIR": str(tmp_path / "script-state"),
        "PYTHONPATH": str(ROOT),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_run_forever_refused_by_the_lobby_ends_in_one_line_naming_the_cause(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    async with Agent("taken", lobby_url=lobby.url):  # holds the id under its own token
        code, stdout, stderr = await run_script(SERVER, tmp_path, lobby.url)
    assert code == 1
    assert stdout == ""
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "agent_id_taken" in lines[0]
    assert "'taken'" in lines[0]


UP = "echo is up: serving echo until Ctrl-C\n"
"""What the echo agent prints once the lobby has it."""


async def test_an_example_prints_only_what_it_prints_and_log_level_shows_the_sdk_log(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    example = (ROOT / "examples/echo/run.py").read_text()
    code, stdout, stderr = await run_script(example, tmp_path, lobby.url)
    assert code == 0, stderr
    assert stdout == UP + "the echo agent is online: True\necho answered: 'hi' (2 characters)\n"
    assert stderr == ""
    # Asked for, the SDK's own lines go to stderr; stdout stays the program's.
    verbose = example.replace('Agent("my_client", ', 'Agent("my_client", log_level="INFO", ')
    assert verbose != example
    code, stdout, stderr = await run_script(verbose, tmp_path, lobby.url)
    assert code == 0, stderr
    assert stdout == UP + "the echo agent is online: True\necho answered: 'hi' (2 characters)\n"
    assert "INFO agent_sdk AGENT_CONNECTED agent_id=my_client" in stderr
