"""The A2A bridges against a real lobby, with the official a2a-sdk's own client and server on
127.0.0.1: an A2A client calls lobby capabilities through the gateway, and an SDK agent calls an
A2A agent joined with `lobby a2a join`. A generic client of another SDK (@a2a-js/sdk, in
tests/bridges/a2a_node) resolves the gateway from its origin and calls without naming a skill."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers import get_data_parts
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskNotFoundError,
    TaskState,
)
from google.protobuf.struct_pb2 import Struct

from agent_sdk import Agent, RemoteError, RequestContext, UnauthorizedError, capability
from bridges.a2a import Gateway, base_url, bind, hashed_tokens, serve_http, serving
from bridges.a2a_card import etag_matches
from bridges.a2a_parts import data_parts, named_capability
from examples.a2a import run as a2a_example
from examples.a2a import shouter
from examples.echo.echo_agent import EchoAgent
from lobby.server import LobbyServer
from tests.conftest import LobbyProcess, make_lobby
from tests.nodejs import ROOT, node, npm_installed

TOKENS = {"friend-token": "my_client", "stranger-token": "stranger"}
A2A_NODE = ROOT / "tests" / "bridges" / "a2a_node"


class TwoSkills(Agent):
    """An agent with two capabilities: a message that names neither has no default."""

    agent_id = "two_skills"

    @capability("upper")
    async def upper(self, payload: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"text": str(payload.get("text", "")).upper()}

    @capability("lower")
    async def lower(self, payload: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"text": str(payload.get("text", "")).lower()}


@pytest.fixture
async def gateway(lobby: LobbyServer) -> AsyncIterator[str]:
    """The echo agent (the gateway's default agent) and two_skills, and a gateway in front of
    the lobby: its base URL."""
    sock = bind("127.0.0.1", 0)
    bridge = Gateway(
        "a2a_gateway", tokens=hashed_tokens(TOKENS), default_agent="echo", lobby_url=lobby.url
    )
    async with (
        EchoAgent(lobby_url=lobby.url),
        TwoSkills(lobby_url=lobby.url),
        serving(bridge, sock),
    ):
        yield base_url(sock)


async def send(
    url: str, token: str, payload: dict[str, Any], *, streaming: bool
) -> list[StreamResponse]:
    """Every event an A2A client (the SDK's) receives for one message to the echo agent."""
    metadata = Struct()
    metadata.update({"skill": "echo"})
    message = Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=data_parts(payload),
        metadata=metadata,
    )
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers) as http:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        client: Client = await create_client(f"{url}/agents/echo", config)
        return [event async for event in client.send_message(SendMessageRequest(message=message))]


async def test_the_card_lists_the_agents_capabilities_as_skills(gateway: str) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(f"{gateway}/agents/echo/.well-known/agent-card.json")).json()
        missing = await http.get(f"{gateway}/agents/nobody/.well-known/agent-card.json")
    assert [skill["id"] for skill in card["skills"]] == ["echo"]
    assert card["supportedInterfaces"][0]["url"] == f"{gateway}/agents/echo/"
    assert card["capabilities"]["streaming"] is True
    assert missing.status_code == 404


async def test_an_a2a_client_streams_a_capability_its_progress_as_status_updates(
    gateway: str,
) -> None:
    events = await send(gateway, "friend-token", {"text": "hi"}, streaming=True)
    updates = [
        get_data_parts(e.status_update.status.message.parts)
        for e in events
        if e.HasField("status_update") and e.status_update.status.message.parts
    ]
    assert [{"step": "measuring"}] in updates
    artifacts = [
        get_data_parts(e.artifact_update.artifact.parts)
        for e in events
        if e.HasField("artifact_update")
    ]
    assert artifacts == [[{"text": "hi", "length": 2.0}]]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_message_send_answers_a_completed_task_with_the_result(gateway: str) -> None:
    (event,) = await send(gateway, "friend-token", {"text": "hey"}, streaming=False)
    assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_data_parts(event.task.artifacts[0].parts) == [{"text": "hey", "length": 3.0}]


async def test_the_gateway_keeps_at_most_max_tasks(lobby: LobbyServer) -> None:
    sock = bind("127.0.0.1", 0)
    bridge = Gateway("a2a_gateway", tokens=hashed_tokens(TOKENS), lobby_url=lobby.url, max_tasks=1)
    async with EchoAgent(lobby_url=lobby.url), serving(bridge, sock):
        url = base_url(sock)
        (first,) = await send(url, "friend-token", {"text": "a"}, streaming=False)
        (second,) = await send(url, "friend-token", {"text": "b"}, streaming=False)
        headers = {"Authorization": "Bearer friend-token"}
        async with httpx.AsyncClient(headers=headers) as http:
            client = await create_client(f"{url}/agents/echo", ClientConfig(httpx_client=http))
            kept = await client.get_task(GetTaskRequest(id=second.task.id))
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=first.task.id))
    assert kept.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_caller_the_capability_does_not_authorize_gets_the_lobbys_error(
    gateway: str,
) -> None:
    (event,) = await send(gateway, "stranger-token", {"text": "hi"}, streaming=False)
    assert event.task.status.state == TaskState.TASK_STATE_FAILED
    (error,) = get_data_parts(event.task.status.message.parts)
    assert error["code"] == "unauthorized"
    assert "stranger" in error["error"]


async def test_bad_input_fails_the_task_with_invalid_input(gateway: str) -> None:
    (event,) = await send(gateway, "friend-token", {"txt": "hi"}, streaming=False)
    assert event.task.status.state == TaskState.TASK_STATE_FAILED
    assert get_data_parts(event.task.status.message.parts)[0]["code"] == "invalid_input"


def v03_request(method: str) -> dict[str, Any]:
    """A JSON-RPC request in A2A 0.3's words (what older A2A clients send)."""
    message = {
        "kind": "message",
        "messageId": uuid.uuid4().hex,
        "role": "user",
        "parts": [{"kind": "data", "data": {"text": "hi"}}],
        "metadata": {"skill": "echo"},
    }
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": message}}


async def test_a2a_0_3_message_send_and_message_stream_are_answered(gateway: str) -> None:
    headers = {"Authorization": "Bearer friend-token"}
    async with httpx.AsyncClient(headers=headers) as http:
        sent = (await http.post(f"{gateway}/agents/echo/", json=v03_request("message/send"))).json()
        streamed = await http.post(f"{gateway}/agents/echo/", json=v03_request("message/stream"))
    assert sent["result"]["status"]["state"] == "completed"
    assert sent["result"]["artifacts"][0]["parts"][0]["data"] == {"text": "hi", "length": 2.0}
    events = [
        orjson.loads(line.removeprefix("data: "))["result"]
        for line in streamed.text.splitlines()
        if line.startswith("data: ")
    ]
    progress = [e for e in events if e["kind"] == "status-update" and "message" in e["status"]]
    assert progress[0]["status"]["message"]["parts"][0]["data"] == {"step": "measuring"}
    assert events[-1]["status"]["state"] == "completed"


async def test_a_text_part_carries_a_json_payload_naming_its_capability(gateway: str) -> None:
    message = Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=[Part(text='{"capability_name": "upper", "text": "yo"}')],
    )
    headers = {"Authorization": "Bearer friend-token"}
    async with httpx.AsyncClient(headers=headers) as http:
        config = ClientConfig(httpx_client=http, streaming=False)
        client = await create_client(f"{gateway}/agents/two_skills", config)
        (event,) = [e async for e in client.send_message(SendMessageRequest(message=message))]
    assert get_data_parts(event.task.artifacts[0].parts) == [{"text": "YO"}]


def plain(text: str) -> Message:
    """A message as a generic A2A client sends it: one text part, no skill named."""
    return Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)])


def test_a_message_names_its_capability_in_metadata_or_its_payload() -> None:
    metadata = Struct()
    metadata.update({"skill": "echo"})
    by_skill = Message(parts=data_parts({"capability_name": "other"}), metadata=metadata)
    assert named_capability(by_skill) == "echo"
    assert named_capability(Message(parts=data_parts({"capability_name": "upper"}))) == "upper"
    assert named_capability(Message(parts=[Part(text='{"capability_name": "lower"}')])) == "lower"
    assert named_capability(plain("hi")) is None
    assert named_capability(Message(parts=data_parts({"capability_name": 3}))) is None


async def test_a_message_naming_no_skill_calls_the_agents_sole_capability(gateway: str) -> None:
    headers = {"Authorization": "Bearer friend-token"}
    async with httpx.AsyncClient(headers=headers) as http:
        config = ClientConfig(httpx_client=http, streaming=False)
        client = await create_client(f"{gateway}/agents/echo", config)
        (event,) = [e async for e in client.send_message(SendMessageRequest(message=plain("yo")))]
    assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_data_parts(event.task.artifacts[0].parts) == [{"text": "yo", "length": 2.0}]


@pytest.mark.parametrize("method", ["SendMessage", "SendStreamingMessage", "message/send"])
async def test_no_skill_and_no_sole_capability_is_a_json_rpc_error(
    gateway: str, method: str
) -> None:
    headers = {"Authorization": "Bearer friend-token"}
    if method == "message/send":  # A2A 0.3's words
        message: dict[str, Any] = {"kind": "message", "parts": [{"kind": "text", "text": "x"}]}
        message |= {"messageId": "m1", "role": "user"}
    else:
        message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "x"}]}
        headers["A2A-Version"] = "1.0"
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": message}}
    async with httpx.AsyncClient(headers=headers) as http:
        answer = await http.post(f"{gateway}/agents/two_skills/", json=body)
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert (answer.json()["id"], error["code"]) == (7, -32602)
    assert "names no skill" in error["message"]
    assert "lower, upper" in error["message"]


async def test_messages_naming_no_skill_share_one_read_of_the_registry(tmp_path: Path) -> None:
    # The lobby answers the gateway one DISCOVER now and the next in 100 s: twenty messages at
    # once and a card, each needing echo's capabilities, are all answered from that one read.
    lobby = make_lobby(tmp_path / "data", discover_rate=0.01, discover_burst=1)
    await lobby.start()
    try:
        sock = bind("127.0.0.1", 0)
        bridge = Gateway(
            "a2a_gateway",
            tokens=hashed_tokens(TOKENS),
            default_agent="echo",
            lobby_url=lobby.url,
            registry_ttl=60,  # however slow this machine, no second read
        )
        async with EchoAgent(lobby_url=lobby.url), serving(bridge, sock):
            url = base_url(sock)
            headers = {"Authorization": "Bearer friend-token", "A2A-Version": "1.0"}
            async with httpx.AsyncClient(headers=headers) as http:

                async def send_plain(text: str) -> Any:
                    message = {"messageId": text, "role": "ROLE_USER", "parts": [{"text": text}]}
                    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage"}
                    answer = await http.post(url, json=body | {"params": {"message": message}})
                    return answer.json()["result"]["task"]["status"]["state"]

                states = await asyncio.gather(*(send_plain(f"m{n}") for n in range(20)))
                card = await http.get(f"{url}/.well-known/agent-card.json")
    finally:
        await lobby.stop()
    assert states == ["TASK_STATE_COMPLETED"] * 20
    assert card.status_code == 200


async def test_the_default_agent_is_served_at_the_origin_with_caching_headers(
    gateway: str,
) -> None:
    async with httpx.AsyncClient() as http:
        card = await http.get(f"{gateway}/.well-known/agent-card.json")
        etag = card.headers["etag"]
        again = await http.get(f"{gateway}/.well-known/agent-card.json")
        held = await http.get(
            f"{gateway}/.well-known/agent-card.json", headers={"If-None-Match": f"W/{etag}"}
        )
        other = await http.get(
            f"{gateway}/agents/two_skills/.well-known/agent-card.json",
            headers={"If-None-Match": etag},
        )
        sent = await http.post(
            f"{gateway}/",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hey"}]}
                },
            },
            headers={"Authorization": "Bearer friend-token", "A2A-Version": "1.0"},
        )
    assert card.json()["name"] == "echo"
    assert card.json()["supportedInterfaces"][0]["url"] == f"{gateway}/"
    assert card.headers["cache-control"] == "public, max-age=60"
    assert again.headers["etag"] == etag
    assert (held.status_code, held.content, held.headers["etag"]) == (304, b"", etag)
    assert other.status_code == 200
    assert other.headers["etag"] != etag
    assert sent.json()["result"]["task"]["artifacts"][0]["parts"] == [
        {"data": {"text": "hey", "length": 3.0}}
    ]


def test_if_none_match_compares_weakly_and_takes_lists_and_a_star() -> None:
    assert etag_matches('"a"', '"a"')
    assert etag_matches('W/"a"', '"a"')
    assert etag_matches('"b", W/"a"', '"a"')
    assert etag_matches("*", '"a"')
    assert not etag_matches('"b"', '"a"')
    assert not etag_matches(None, '"a"')


@pytest.mark.parametrize(
    ("method", "path", "status", "says"),
    [
        ("GET", "/agents/nobody/.well-known/agent-card.json", 404, "no lobby agent 'nobody'"),
        ("GET", "/agents/.well-known/agent-card.json", 404, "needs its trailing slash"),
        ("GET", "/agents/echo/", 405, "GET is not served at '/agents/echo/'"),
    ],
)
async def test_every_error_body_is_a_json_rpc_error(
    gateway: str, method: str, path: str, status: int, says: str
) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.request(method, gateway + path, json={})
    assert answer.status_code == status
    body = answer.json()
    assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", None, -32600)
    assert says in body["error"]["message"]


async def test_a_body_that_is_not_json_is_content_type_not_supported(gateway: str) -> None:
    headers = {"Authorization": "Bearer friend-token", "Content-Type": "text/plain"}
    async with httpx.AsyncClient(headers=headers) as http:
        answer = await http.post(f"{gateway}/agents/echo/", content=b"{'jsonrpc': '2.0'}")
    assert answer.status_code == 415
    assert answer.json()["error"]["code"] == -32005
    assert "not text/plain" in answer.json()["error"]["message"]


async def test_no_default_agent_leaves_the_origin_unserved(lobby: LobbyServer) -> None:
    sock = bind("127.0.0.1", 0)
    bridge = Gateway("a2a_gateway", tokens=hashed_tokens(TOKENS), lobby_url=lobby.url)
    async with serving(bridge, sock), httpx.AsyncClient() as http:
        answer = await http.get(f"{base_url(sock)}/.well-known/agent-card.json")
    assert answer.status_code == 404
    assert "no default agent" in answer.json()["error"]["message"]


async def test_a_caller_without_a_token_acts_as_the_anonymous_agent(lobby: LobbyServer) -> None:
    sock = bind("127.0.0.1", 0)
    bridge = Gateway(
        "a2a_gateway", tokens=hashed_tokens(TOKENS), anonymous="my_client", lobby_url=lobby.url
    )
    async with EchoAgent(lobby_url=lobby.url), serving(bridge, sock):
        url = base_url(sock)
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{url}/agents/echo/.well-known/agent-card.json")).json()
            config = ClientConfig(httpx_client=http, streaming=False)
            client = await create_client(f"{url}/agents/echo", config)
            (event,) = [
                e async for e in client.send_message(SendMessageRequest(message=plain("a")))
            ]
            wrong = await http.post(
                f"{url}/agents/echo/", json={}, headers={"Authorization": "Bearer wrong"}
            )
    assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "securityRequirements" not in card
    assert wrong.status_code == 401


async def test_a_generic_a2a_js_client_calls_without_naming_a_skill(gateway: str) -> None:
    npm_installed(A2A_NODE)
    client = await asyncio.create_subprocess_exec(
        *(node(), str(A2A_NODE / "client.mjs"), gateway, "friend-token", "two_skills"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    out, err = await asyncio.wait_for(client.communicate(), 60)
    assert client.returncode == 0, err.decode()[-2000:]
    seen = orjson.loads(out)
    assert (seen["card"], seen["cardWithSlash"]) == ("echo", "echo")
    assert seen["sent"] == {
        "state": "TASK_STATE_COMPLETED",
        "artifacts": [[{"text": "hi", "length": 2}]],
    }
    streamed = seen["streamed"]
    assert {
        "kind": "statusUpdate",
        "state": "TASK_STATE_WORKING",
        "data": [{"step": "measuring"}],
    } in streamed
    assert {"kind": "artifactUpdate", "data": [{"text": "yo", "length": 2}]} in streamed
    assert streamed[-1]["state"] == "TASK_STATE_COMPLETED"
    assert seen["noDefault"]["code"] == -32602
    assert "offers 2 (lower, upper)" in seen["noDefault"]["message"]
    assert seen["badToken"] == {
        "name": "JsonRpcTransportError",
        "message": "a bearer token of the gateway's tokens file is required",
        "code": -31401,
    }


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", "Basic friend-token"])
async def test_no_or_an_unknown_token_is_401(gateway: str, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}
    async with httpx.AsyncClient(headers=headers) as http:
        answer = await http.post(f"{gateway}/agents/echo/", json=body)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.json()["error"]["code"] == -31401


async def test_an_sdk_agent_calls_an_a2a_agent_joined_with_lobby_a2a_join(
    lobby: LobbyServer,
) -> None:
    sock = bind("127.0.0.1", 0)
    async with serve_http(shouter.app(base_url(sock) + "/"), sock):
        join = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "lobby", "a2a", "join", "--agent-id", "shouter"),
            *("--card", f"{base_url(sock)}/.well-known/agent-card.json", "--lobby", lobby.url),
            *("--authorize", "shout_client"),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert join.stdout is not None
            line = (await join.stdout.readline()).decode()
            assert line == "joined 'shouter' as lobby agent 'shouter': shout\n"
            async with Agent("shout_client", lobby_url=lobby.url) as me:
                progress = [u async for u in me.request_stream("shouter", "shout", {"text": "a"})]
            async with Agent("stranger", lobby_url=lobby.url) as stranger:
                with pytest.raises(UnauthorizedError):
                    await stranger.request("shouter", "shout", {"text": "a"})
        finally:
            join.terminate()
            assert await join.wait() == 0
    assert progress == [{"stage": "shouting", "status": "in_progress"}, {"text": "A"}]


async def test_a_failed_a2a_task_is_an_error_response_with_its_code(lobby: LobbyServer) -> None:
    from agent_sdk.errors import InvalidInputError
    from bridges.a2a_join import A2AAgent, fetch_card

    sock = bind("127.0.0.1", 0)
    async with serve_http(shouter.app(base_url(sock) + "/"), sock), httpx.AsyncClient() as http:
        card = await fetch_card(base_url(sock), http)
        async with (
            A2AAgent("shouter", card, http, lobby_url=lobby.url),
            Agent("caller", lobby_url=lobby.url) as me,
        ):
            with pytest.raises(InvalidInputError, match="shout needs a text"):
                await me.request("shouter", "shout", {"words": 1})


async def test_an_a2a_agent_gone_away_is_an_error_response_saying_so(lobby: LobbyServer) -> None:
    from bridges.a2a_join import UNREACHABLE, A2AAgent, fetch_card

    sock = bind("127.0.0.1", 0)
    url = base_url(sock)
    async with httpx.AsyncClient() as http:
        async with serve_http(shouter.app(url + "/"), sock):
            card = await fetch_card(url, http)
        async with (
            A2AAgent("shouter", card, http, lobby_url=lobby.url),
            Agent("caller", lobby_url=lobby.url) as me,
        ):
            with pytest.raises(RemoteError) as failed:
                await me.request("shouter", "shout", {"text": "hello"})
    assert failed.value.code == UNREACHABLE
    assert failed.value.message.startswith(f"the A2A agent at {url}/ cannot be reached: ")


async def test_the_a2a_example_runs_both_directions(lobby: LobbyServer) -> None:
    assert await a2a_example.call_echo(lobby.url) == [
        "echo is working: {'step': 'measuring'}",
        "echo answered: 'hi' (2 characters)",
    ]
    assert await a2a_example.call_shouter(lobby.url) == {"text": "HI"}


def lobby_a2a(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lobby", "a2a", *argv], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--agent-id", "g", "--port", "x"], "argument --port: 'x' is not a port number"),
        (["serve", "--agent-id", "g"], "--port"),
        (["serve", "--agent-id", "g", "--port", "70000"], "70000 is not a port number (0 to"),
        (["join", "--agent-id", "j"], "--card"),
        (["serve", "--agent-id", "g", "--port", "0", "--tokens", "/nonexistent"], "--tokens"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv: list[str], says: str) -> None:
    done = lobby_a2a(*argv)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_tokens_file_that_is_not_a_map_of_tokens_is_refused(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text('["not", "a", "map"]')
    done = lobby_a2a("serve", "--agent-id", "g", "--port", "0", "--tokens", str(tokens))
    assert (done.returncode, done.stderr.count("\n")) == (2, 1)
    assert "JSON object of bearer token -> lobby agent id" in done.stderr


async def test_lobby_a2a_serve_is_the_gateway(lobby: LobbyServer, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"friend-token": "my_client"}')
    serve = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "lobby", "a2a", "serve", "--agent-id", "a2a_gateway"),
        *("--port", "0", "--lobby", lobby.url, "--tokens", str(tokens)),
        *("--default-agent", "echo", "--anonymous", "my_client"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert serve.stdout is not None
        line = (await serve.stdout.readline()).decode()
        assert line.startswith("A2A gateway: http://127.0.0.1:")
        url = line.split()[2].removesuffix("/agents/<agent")
        assert (await serve.stdout.readline()).decode() == f"A2A gateway of echo: {url}/\n"
        async with EchoAgent(lobby_url=lobby.url), httpx.AsyncClient() as http:
            (event,) = await send(url, "friend-token", {"text": "hi"}, streaming=False)
            # No token: served as my_client (--anonymous), at the origin (--default-agent).
            client = await create_client(url, ClientConfig(httpx_client=http, streaming=False))
            (anonymous,) = [
                e async for e in client.send_message(SendMessageRequest(message=plain("yo")))
            ]
    finally:
        serve.terminate()
        assert await serve.wait() == 0
    assert get_data_parts(event.task.artifacts[0].parts) == [{"text": "hi", "length": 2.0}]
    assert get_data_parts(anonymous.task.artifacts[0].parts) == [{"text": "yo", "length": 2.0}]


def test_the_a2a_example_runs_as_a_script(lobby_process: LobbyProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.a2a.run", "--lobby-url", lobby_process.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "A2A client: echo answered: 'hi' (2 characters)" in done.stdout
    assert "shouter answered: {'text': 'HI'}" in done.stdout
