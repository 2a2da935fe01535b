"""A lobby's identity (lobby/identity.py) and the tokens agents keep under it
(agent_sdk/identity.py): a token is offered only to the lobby that issued it, even when
another lobby answers later on the same port; refusals name the command that frees the id;
`lobby remove` / `lobby revoke` take several ids; `lobby reset` starts a development lobby
afresh. Real lobbies, real sockets."""

from __future__ import annotations

import argparse
import asyncio
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect

from agent_sdk import Agent, FileTokenStore, MemoryTokenStore, TokenRefusedError
from lobby import admin_cli
from lobby.admin_endpoint import TOKEN_FILE
from lobby.core.session import Session
from lobby.identity import IDENTITY_FILE, PATTERN, IdentityUnreadable, kept_identity
from lobby.server import LobbyServer
from lobby.store.base import StoreUnavailable
from tests.conftest import SETTINGS
from tests.test_cli import lobby_cli, one_line
from tests.wsclient import register


class RecordingLobby(LobbyServer):
    """A real lobby that also notes the auth_token of every REGISTER it receives."""

    def __init__(self, data_dir: Path, port: int = 0) -> None:
        super().__init__(replace(SETTINGS, data_dir=data_dir, port=port))
        self.presented: list[str | None] = []

    def received(self, session: Session, binary: bool, data: bytes) -> None:
        message = orjson.loads(data)
        if message.get("message_type") == "REGISTER":
            self.presented.append(message.get("auth_token"))
        super().received(session, binary, data)


def healthz(lobby: LobbyServer) -> dict[str, object]:
    url = f"http://127.0.0.1:{lobby.port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as answer:
        body: dict[str, object] = orjson.loads(answer.read())
    return body


async def test_the_lobby_announces_its_identity_kept_in_its_data_dir(lobby: LobbyServer) -> None:
    identity = lobby.identity
    assert PATTERN.fullmatch(identity)
    assert (lobby.settings.data_dir / IDENTITY_FILE).read_text().strip() == identity
    async with connect(lobby.url) as ws:
        assert ws.response is not None
        assert ws.response.headers["Agent-Lobby-Id"] == identity
        ack = await register(ws, "announced")
    assert ack["payload"]["lobby_identity"] == identity
    assert ack["payload"]["lobby_id"] == "global_lobby"  # the receiver id, unchanged
    health = await asyncio.to_thread(healthz, lobby)
    assert (health["lobby_id"], health["lobby_identity"]) == ("global_lobby", identity)


def test_the_identity_is_made_once_and_a_damaged_file_is_named(tmp_path: Path) -> None:
    made = kept_identity(tmp_path)
    assert PATTERN.fullmatch(made)
    assert kept_identity(tmp_path) == made
    (tmp_path / IDENTITY_FILE).write_text("")  # a crash while it was written
    remade = kept_identity(tmp_path)
    assert remade != made
    assert PATTERN.fullmatch(remade)
    (tmp_path / IDENTITY_FILE).write_text("not an identity\n")
    with pytest.raises(IdentityUnreadable) as caught:
        kept_identity(tmp_path)
    assert isinstance(caught.value, StoreUnavailable)  # `lobby serve` prints it as one line
    assert str(tmp_path / IDENTITY_FILE) in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_a_token_is_offered_only_to_the_lobby_that_issued_it(
    tmp_path: Path, agent_state_dir: Path
) -> None:
    first = RecordingLobby(tmp_path / "first")
    await first.start()
    port = first.port
    try:
        async with Agent("wanderer", lobby_url=first.url) as agent:
            assert agent.stats.resumes == 0
    finally:
        await first.stop()
    # Another lobby, with its own data dir, on the same port: the first's token stays home.
    second = RecordingLobby(tmp_path / "second", port)
    await second.start()
    try:
        assert second.identity != first.identity
        async with Agent("wanderer", lobby_url=second.url) as agent:
            assert agent.stats.resumes == 0
    finally:
        await second.stop()
    assert second.presented == [None]
    # Back on the first lobby (its data dir, the same port): it resumes with its own token.
    again = RecordingLobby(tmp_path / "first", port)
    await again.start()
    try:
        assert again.identity == first.identity
        async with Agent("wanderer", lobby_url=again.url) as agent:
            assert agent.stats.resumes == 1
    finally:
        await again.stop()
    store = FileTokenStore()
    assert again.presented == [store.load(first.identity, "wanderer")]
    assert store.load(second.identity, "wanderer") not in (None, again.presented[0])
    tokens = sorted(p.name for p in (agent_state_dir / "tokens").iterdir())
    assert tokens == sorted([first.identity, second.identity])  # nothing under host_port


async def until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_a_running_agent_that_reconnects_to_another_lobby_keeps_its_token_home(
    tmp_path: Path,
) -> None:
    first = RecordingLobby(tmp_path / "first")
    await first.start()
    port = first.port
    agent = Agent("roamer", lobby_url=first.url, reconnect_max_delay=0.5)
    lobbies = [first]
    try:
        await agent.__aenter__()
        await first.stop()
        # The agent reconnects on its own to whatever answers on the port now.
        second = RecordingLobby(tmp_path / "second", port)
        lobbies.append(second)
        await second.start()
        await until(lambda: agent.stats.connects == 2)
        assert agent.stats.resumes == 0
        await second.stop()
        again = RecordingLobby(tmp_path / "first", port)
        lobbies.append(again)
        await again.start()
        await until(lambda: agent.stats.connects == 3)
        assert agent.stats.resumes == 1
    finally:
        await agent.stop()
        for lobby in lobbies:
            await lobby.stop()
    assert second.presented == [None]
    assert again.presented == [FileTokenStore().load(first.identity, "roamer")]


async def test_a_token_saved_under_host_and_port_moves_to_the_identity_once(
    lobby: LobbyServer,
) -> None:
    memory = MemoryTokenStore()
    async with Agent("veteran", lobby_url=lobby.url, token_store=memory):
        pass
    token = memory.load(lobby.identity, "veteran")
    assert token is not None
    store = FileTokenStore()
    store.save(lobby.url, "veteran", token)  # where an earlier SDK kept it
    async with Agent("veteran", lobby_url=lobby.url) as agent:
        assert agent.stats.resumes == 1
    assert store.load(lobby.identity, "veteran") == token
    assert not store.path(lobby.url, "veteran").exists()
    # One that the lobby does not know is left where it was, for its own lobby.
    store.save(lobby.url, "stranger", "not-a-token-of-this-lobby")
    async with Agent("stranger", lobby_url=lobby.url) as agent:
        assert agent.stats.resumes == 0
    assert store.load(lobby.url, "stranger") == "not-a-token-of-this-lobby"
    assert store.load(lobby.identity, "stranger") not in (None, "not-a-token-of-this-lobby")


def admin_args(command: str, lobby: LobbyServer, *agent_ids: str) -> argparse.Namespace:
    data_dir = lobby.settings.data_dir
    return argparse.Namespace(
        command=command,
        agent_ids=list(agent_ids),
        data_dir=data_dir,
        url=f"ws://127.0.0.1:{lobby.port}/admin",
        admin_token=(data_dir / TOKEN_FILE).read_text().strip(),
    )


async def test_revoke_several_ids_and_a_revoked_token_is_refused_naming_what_to_do(
    lobby: LobbyServer,
) -> None:
    for agent_id in ("r1", "r2"):
        async with Agent(agent_id, lobby_url=lobby.url):
            pass  # registered, token saved, now offline
    args = admin_args("revoke", lobby, "r1", "nosuch", "r2")
    done, refused = await asyncio.to_thread(admin_cli.run, args)
    assert done == ["revoked the token of agent 'r1'", "revoked the token of agent 'r2'"]
    assert refused == ["no agent 'nosuch' is registered in this lobby"]
    store = FileTokenStore()
    with pytest.raises(TokenRefusedError) as caught:
        async with Agent("r1", lobby_url=lobby.url):
            pass
    assert "revoked" in str(caught.value)
    assert str(store.path(lobby.identity, "r1")) in str(caught.value)
    store.delete(lobby.identity, "r1")  # as the error says: a new token follows
    async with Agent("r1", lobby_url=lobby.url) as agent:
        assert agent.stats.resumes == 0


async def test_lobby_remove_takes_several_ids(tmp_path: Path) -> None:
    lobby = RecordingLobby(tmp_path / "data")
    await lobby.start()
    try:
        for agent_id in ("a", "b", "c", "kept"):
            async with Agent(agent_id, lobby_url=lobby.url):
                pass
    finally:
        await lobby.stop()
    done = await asyncio.to_thread(
        lobby_cli, "remove", "a", "b", "nosuch", "c", "--data-dir", "data", cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"removed agent {x!r} (no lobby was running: changed in the store)" for x in "abc"
    ]
    assert (
        one_line(done) == "lobby: no agent 'nosuch' is registered in this store (see lobby agents)"
    )
    listed = await asyncio.to_thread(
        lobby_cli, "agents", "--json", "--data-dir", "data", cwd=tmp_path
    )
    assert [a["agent_id"] for a in orjson.loads(listed.stdout)] == ["kept"]


async def test_lobby_reset_deletes_the_state_and_its_tokens_but_not_while_running(
    tmp_path: Path, agent_state_dir: Path
) -> None:
    data = tmp_path / "data"
    lobby = RecordingLobby(data)
    await lobby.start()
    identity = lobby.identity
    (tmp_path / "other").mkdir()
    try:
        async with Agent("dev", lobby_url=lobby.url):
            pass
        running = await asyncio.to_thread(lobby_cli, "reset", "--data-dir", "data", cwd=tmp_path)
        assert running.returncode == 1
        assert "is running on data" in one_line(running)
        assert "nothing was deleted" in one_line(running)
    finally:
        await lobby.stop()
    tokens = agent_state_dir / "tokens"
    FileTokenStore().save("some-other-lobby", "dev", "kept")
    assert (tokens / identity / "dev.token").exists()
    dry = await asyncio.to_thread(
        lobby_cli, "reset", "--data-dir", "data", "--dry-run", cwd=tmp_path
    )
    assert dry.returncode == 0, dry.stderr
    assert f"would delete {tokens / identity}" in dry.stdout.splitlines()
    assert (data / IDENTITY_FILE).exists()
    done = await asyncio.to_thread(lobby_cli, "reset", "--data-dir", "data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if not line.endswith(("-wal", "-shm"))] == [
        "deleted data/lobby.sqlite3",
        "deleted data/admin.token",
        "deleted data/lobby.id",
        f"deleted {tokens / identity}",
    ]
    assert not data.exists()
    assert sorted(p.name for p in tokens.iterdir()) == ["some-other-lobby"]
    nothing = await asyncio.to_thread(lobby_cli, "reset", "--data-dir", "other", cwd=tmp_path)
    assert one_line(nothing) == "lobby: no lobby state in other (is --data-dir right?)"
