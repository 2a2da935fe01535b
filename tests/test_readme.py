"""README.md runs as written: every Python block is a whole program, run as a new user runs it
(a file of its own, `python FILE`, `LOBBY_URL` pointing at a `lobby serve` process), twice in a
row against the same durable lobby, with each agent's saved token kept between the runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.conftest import LobbyProcess, start_lobby_process

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_programs() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_shows_the_echo_example_as_it_is() -> None:
    programs = readme_programs()
    assert programs[0] == (ROOT / "examples/echo/echo_agent.py").read_text()


def registered(lobby: LobbyProcess, agent_id: str, after: int) -> bool:
    events = lobby.events()[after:]
    return any(
        e.get("event") in ("AGENT_REGISTERED", "AGENT_RESUMED") and e.get("agent_id") == agent_id
        for e in events
    )


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
    programs = readme_programs()
    assert len(programs) >= 3
    files = []
    for number, program in enumerate(programs):
        path = tmp_path / f"readme_{number}.py"
        path.write_text(program)
        files.append(path)
    servers = [f for f, p in zip(files, programs, strict=True) if "run_forever()" in p]
    clients = [f for f in files if f not in servers]
    data_dir = tmp_path / "data"
    lobby = start_lobby_process(data_dir)
    env = {
        **os.environ,
        "LOBBY_URL": lobby.url,
        "AGENT_LOBBY_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(ROOT),
    }
    try:
        for _ in range(2):
            seen = len(lobby.events())
            running = [
                subprocess.Popen([sys.executable, str(f)], env=env, cwd=tmp_path, text=True)
                for f in servers
            ]
            try:
                deadline = time.monotonic() + 20
                while not registered(lobby, "echo", seen):
                    assert time.monotonic() < deadline, "the echo agent never registered"
                    assert all(p.poll() is None for p in running), "an agent program exited"
                    time.sleep(0.05)
                outputs = [
                    subprocess.run(
                        [sys.executable, str(f)],
                        env=env,
                        cwd=tmp_path,
                        capture_output=True,
                        text=True,
                        timeout=60,
                    )
                    for f in clients
                ]
            finally:
                for process in running:
                    process.send_signal(signal.SIGINT)
                codes = [process.wait(10) for process in running]
            for done in outputs:
                assert done.returncode == 0, done.stderr
                assert "Traceback" not in done.stderr, done.stderr
            assert codes == [0] * len(running)
            assert "text='hi' length=2" in outputs[0].stdout
            # Only what the program prints: the SDK logs nothing on stdout.
            assert outputs[1].stdout == "offered at 12.00\nbought {'apples': 3} at 11.00\n"
        # Each agent registered on the first run and resumed on the second.
        for agent_id in ("echo", "my_client", "apple_seller", "apple_buyer"):
            assert arrivals(lobby, agent_id) == ["AGENT_REGISTERED", "AGENT_RESUMED"], agent_id
        # A caller that exits leaves nothing behind.
        assert mailbox(data_dir, "my_client") == []
        # Tokens are kept in the state dir and in no log.
        tokens = [path.read_text() for path in (tmp_path / "state").rglob("*.token")]
        assert len(tokens) == 4
        logged = lobby.log_path.read_text() + "".join(out.stdout + out.stderr for out in outputs)
        assert not any(token in logged for token in tokens)
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(10)
