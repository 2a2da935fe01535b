"""The /admin endpoint and `lobby revoke` / `lobby remove`: over real sockets on each socket
transport, through a `lobby serve` process, and on a stopped lobby's data dir."""

from __future__ import annotations

import asyncio
import signal
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest
import websocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from lobby.admin_endpoint import TOKEN_FILE
from lobby.server import LobbyServer
from tests.conftest import TRANSPORTS, start_lobby_process
from tests.test_cli import close_code, lobby_cli, one_line
from tests.test_cli import register as register_sync
from tests.wsclient import CLOSED, frame, register, reply, running, token_of

CAP = {"name": "price", "description": "", "input_schema": {}, "output_schema": {}}


def admin_url(lobby: LobbyServer) -> str:
    return f"ws://127.0.0.1:{lobby.port}/admin"


def admin_token(data_dir: Path) -> str:
    return (data_dir / TOKEN_FILE).read_text().strip()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def register_with(ws: ClientConnection, agent_id: str, token: str) -> dict[str, Any]:
    """REGISTER presenting `token` (a resume)."""
    await ws.send(frame(agent_id, "REGISTER", {}, auth_token=token))
    return await reply(ws)


async def command(ws: ClientConnection, **request: Any) -> dict[str, Any]:
    await ws.send(orjson.dumps(request).decode())
    answer: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
    return answer


async def closed_with(ws: ClientConnection) -> int | None:
    """Read until the lobby closes the connection; its close code."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    except CLOSED:
        return ws.close_code


async def test_admin_needs_the_token(lobby: LobbyServer) -> None:
    data_dir = Path(lobby.settings.data_dir)
    token_file = data_dir / TOKEN_FILE
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    for headers in ({}, bearer("wrong-token-wrong-token"), {"Authorization": "Basic x"}):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(admin_url(lobby), additional_headers=headers):
                pass
        assert refused.value.response.status_code == 401
        assert orjson.loads(refused.value.response.body)["code"] == "auth_failed"
    async with connect(admin_url(lobby), additional_headers=bearer(admin_token(data_dir))) as ws:
        answer = await command(ws, command="revoke", agent_id="nobody", id=1)
        assert answer["ok"] is False
        assert (answer["code"], answer["id"]) == ("unknown_agent", 1)
        assert answer["error"] == "no agent 'nobody' is registered in this lobby"
        answer = await command(ws, command="shutdown")
        assert answer["code"] == "unknown_command"
        assert "one of revoke, remove" in answer["error"]
        assert (await command(ws, command=["revoke"]))["code"] == "unknown_command"
        assert (await command(ws, command="remove"))["code"] == "malformed"
        await ws.send("[1, 2]")
        assert orjson.loads(await ws.recv())["code"] == "malformed"


async def test_revoke_closes_the_connection_and_a_fresh_register_takes_the_id(
    lobby: LobbyServer,
) -> None:
    token = admin_token(Path(lobby.settings.data_dir))
    async with connect(lobby.url) as agent, connect(lobby.url) as other:
        old_token = await token_of(agent, "seller", capabilities=[CAP])
        other_token = await token_of(other, "buyer")
        async with connect(admin_url(lobby), additional_headers=bearer(token)) as admin:
            answer = await command(admin, command="revoke", agent_id="seller", id="r1")
        assert answer == {
            "ok": True,
            "command": "revoke",
            "agent_id": "seller",
            "was_online": True,
            "id": "r1",
        }
        assert await closed_with(agent) == 4003
        assert agent.close_reason == "token revoked by an operator"
        # Messages to it are still held for whoever takes the id next.
        text = frame(
            "buyer", "TEXT", {"content": "hi"}, receiver_id="seller", auth_token=other_token
        )
        await other.send(text)
    async with connect(lobby.url) as again:
        refused = await register_with(again, "seller", old_token)
        assert refused["payload"]["code"] == "agent_id_taken"
        assert "was revoked by an operator" in refused["payload"]["error"]
    async with connect(lobby.url) as fresh:
        ack = await register(fresh, "seller")
        assert ack["payload"]["status"] == "success_registered_finalized"
        assert ack["payload"]["auth_token"] != old_token
        assert (await reply(fresh))["payload"] == {"content": "hi"}
        assert lobby.router.registry.agents["seller"].capabilities.keys() == {"price"}
        new_token = ack["payload"]["auth_token"]
        await fresh.send(frame("seller", "DISCOVER_SERVICES", {}, auth_token=new_token))
        assert (await reply(fresh))["message_type"] == "SERVICES_AVAILABLE"


async def test_remove_drops_the_agent_and_what_is_held_for_it(lobby: LobbyServer) -> None:
    token = admin_token(Path(lobby.settings.data_dir))
    async with connect(lobby.url) as agent, connect(lobby.url) as sender:
        await token_of(agent, "seller", capabilities=[CAP], acks=True)
        sender_token = await token_of(sender, "buyer")
        text = frame(
            "buyer", "TEXT", {"content": "hi"}, receiver_id="seller", auth_token=sender_token
        )
        await sender.send(text)
        assert (await reply(agent))["payload"] == {"content": "hi"}  # held until acknowledged
        async with connect(admin_url(lobby), additional_headers=bearer(token)) as admin:
            answer = await command(admin, command="remove", agent_id="seller")
        assert (answer["ok"], answer["was_online"]) == (True, True)
        assert await closed_with(agent) == 4003
        await sender.send(text)
        assert (await reply(sender))["payload"]["code"] == "unknown_receiver"
    assert "seller" not in lobby.router.registry.agents
    async with connect(lobby.url) as fresh:
        await token_of(fresh, "seller")  # a new agent: nothing held, no capabilities
        await fresh.send(frame("seller", "DISCOVER_SERVICES", {}, auth_token="x"))
        assert (await reply(fresh))["payload"]["code"] == "auth_failed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_revoke_and_remove_survive_a_restart(tmp_path: Path, transport: str) -> None:
    async with running(tmp_path, transport=transport) as lobby:
        async with connect(lobby.url) as first, connect(lobby.url) as second:
            revoked = await token_of(first, "revoked", acks=True)
            removed = await token_of(second, "removed", acks=True)
            text = frame(
                "removed", "TEXT", {"content": "x"}, receiver_id="revoked", auth_token=removed
            )
            await second.send(text)
            assert (await reply(first))["message_type"] == "TEXT"
            text = frame(
                "revoked", "TEXT", {"content": "y"}, receiver_id="removed", auth_token=revoked
            )
            await first.send(text)
            received = await reply(second)
            if received["message_type"] == "ACCEPTED":  # of its own TEXT, once committed
                received = await reply(second)
            assert received["message_type"] == "TEXT"
        admin = connect(admin_url(lobby), additional_headers=bearer(admin_token(tmp_path)))
        async with admin as ws:
            assert (await command(ws, command="revoke", agent_id="revoked"))["ok"]
            assert (await command(ws, command="remove", agent_id="removed"))["ok"]
    async with running(tmp_path, transport=transport) as lobby:
        assert lobby.router.registry.agents.keys() == {"revoked"}
        async with connect(lobby.url) as ws:
            refused = await register_with(ws, "revoked", revoked)
            assert refused["payload"]["code"] == "agent_id_taken"
            ack = await register(ws, "revoked")
            assert ack["payload"]["status"] == "success_registered_finalized"
            assert (await reply(ws))["payload"] == {"content": "x"}  # still held for the id
        async with connect(lobby.url) as ws:
            # The removed agent's mailbox is gone for good, even under the same id again.
            await token_of(ws, "removed")
            assert not lobby.router.registry.agents["removed"].mailbox
    async with running(tmp_path, transport=transport) as lobby:
        assert not lobby.router.registry.agents["removed"].mailbox


# -- the command line -----------------------------------------------------------------------


def test_lobby_revoke_goes_through_the_running_lobby(tmp_path: Path) -> None:
    lobby = start_lobby_process(tmp_path / "data")
    try:
        agent = websocket.create_connection(lobby.url, timeout=10)
        ack = register_sync(agent, "seller")
        assert ack["payload"]["status"] == "success_registered_finalized"  # type: ignore[index]
        env = {"LOBBY_PORT": str(lobby.port), "LOBBY_HOST": "127.0.0.1"}
        done = lobby_cli("revoke", "seller", "--data-dir", "data", cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "revoked the token of agent 'seller'; its connection was closed\n"
        assert close_code(agent) == 4003
        agent.shutdown()  # type: ignore[no-untyped-call]
        unknown = lobby_cli("remove", "nosuch", "--data-dir", "data", cwd=tmp_path, env=env)
        assert unknown.returncode == 1
        assert one_line(unknown) == "lobby: no agent 'nosuch' is registered in this lobby"
        url = f"ws://127.0.0.1:{lobby.port}/admin"
        wrong = lobby_cli(
            *("remove", "seller", "--url", url, "--admin-token", "not-the-admin-token"),
            cwd=tmp_path,
        )
        assert wrong.returncode == 1
        assert "refused the admin token (401)" in one_line(wrong)
        done = lobby_cli("remove", "seller", "--url", url, cwd=tmp_path, env=env)
        assert done.returncode == 1
        assert one_line(done) == (
            "lobby: no admin token: give --admin-token or LOBBY_ADMIN_TOKEN "
            f"(no readable .lobby/{TOKEN_FILE})"
        )
        token = (tmp_path / "data" / TOKEN_FILE).read_text().strip()
        env["LOBBY_ADMIN_TOKEN"] = token
        done = lobby_cli("remove", "seller", "--url", url, cwd=tmp_path, env=env)
        assert (done.returncode, done.stdout) == (0, "removed agent 'seller'\n")
        # The token is never in the log.
        assert token not in lobby.log_path.read_text()
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(5)


def test_lobby_revoke_and_remove_change_a_stopped_lobby_store(tmp_path: Path) -> None:
    lobby = start_lobby_process(tmp_path / "data")
    agents = {}
    for agent_id in ("kept", "revoked", "removed"):
        ws = websocket.create_connection(lobby.url, timeout=10)
        agents[agent_id] = register_sync(ws, agent_id)["payload"]["auth_token"]  # type: ignore[index]
        ws.close()
    lobby.signal(signal.SIGTERM)
    assert lobby.wait(5) == 0
    done = lobby_cli("revoke", "revoked", "--data-dir", "data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no lobby was running" in done.stdout
    done = lobby_cli("remove", "removed", "--data-dir", "data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    unknown = lobby_cli("revoke", "nosuch", "--data-dir", "data", cwd=tmp_path)
    assert unknown.returncode == 1
    assert one_line(unknown) == (
        "lobby: no agent 'nosuch' is registered in this store (see lobby agents)"
    )
    nowhere = lobby_cli("revoke", "kept", "--data-dir", "elsewhere", cwd=tmp_path)
    assert nowhere.returncode == 1
    assert "no lobby store at elsewhere" in one_line(nowhere)
    assert not (tmp_path / "elsewhere").exists()
    listed = lobby_cli("agents", "--json", "--data-dir", "data", cwd=tmp_path)
    assert [a["agent_id"] for a in orjson.loads(listed.stdout)] == ["kept", "revoked"]
    lobby = start_lobby_process(tmp_path / "data")
    try:
        for agent_id, expected in (("kept", "success_resumed"), ("revoked", "agent_id_taken")):
            ws = websocket.create_connection(lobby.url, timeout=10)
            ws.send(frame(agent_id, "REGISTER", {}, auth_token=agents[agent_id]))
            answer = orjson.loads(ws.recv())
            assert expected in (answer["payload"].get("status"), answer["payload"].get("code"))
            ws.close()
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(5)


async def test_a_memory_lobby_prints_its_generated_token_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    async with running(tmp_path / "unused", store="memory") as lobby:
        printed = capfd.readouterr().err.splitlines()
        (line,) = [line for line in printed if "admin token" in line]
        token = line.rsplit(" ", 1)[1]
        async with connect(admin_url(lobby), additional_headers=bearer(token)) as ws:
            assert (await command(ws, command="remove", agent_id="x"))["code"] == "unknown_agent"
    assert not (tmp_path / "unused").exists()
