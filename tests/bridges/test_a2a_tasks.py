"""A2A tasks over several turns through the gateway (bridges/a2a_tasks.py), with the official
a2a-sdk client against a real lobby on 127.0.0.1: a lobby agent's ask parks the task in
input-required, a message with the task's id answers it, and tasks/get, tasks/resubscribe and
tasks/cancel see the task as it is."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers import get_data_parts
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)

from agent_sdk import Agent, RequestContext, capability
from bridges.a2a import Gateway, base_url, bind, hashed_tokens, serving
from bridges.a2a_join import A2AAgent, fetch_card
from bridges.a2a_parts import data_parts
from lobby.server import LobbyServer
from tests.nodejs import ROOT, node, npm_installed

TOKENS = {"friend-token": "my_client"}
A2A_NODE = ROOT / "tests" / "bridges" / "a2a_node"
INPUT_REQUIRED = TaskState.TASK_STATE_INPUT_REQUIRED
COMPLETED = TaskState.TASK_STATE_COMPLETED


class Tailor(Agent):
    """Asks for a size, then answers with it; `stopped` is set when the lobby cancels a call."""

    agent_id = "tailor"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stopped = asyncio.Event()

    @capability("order")
    async def order(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        await ctx.progress({"stage": "measuring"})
        try:
            answer = await ctx.ask({"question": "Which size?"})
        finally:
            if ctx.cancelled.is_set():
                self.stopped.set()
        await ctx.progress({"stage": "cutting"})
        return {"item": request.get("item"), "size": answer.get("size")}


@asynccontextmanager
async def client(lobby: LobbyServer) -> AsyncIterator[tuple[Client, Client, Tailor]]:
    """A gateway in front of the lobby with the tailor behind it: a blocking and a streaming
    client of the tailor's A2A endpoint, and the tailor."""
    sock = bind("127.0.0.1", 0)
    bridge = Gateway("a2a_gateway", tokens=hashed_tokens(TOKENS), lobby_url=lobby.url)
    tailor = Tailor(lobby_url=lobby.url)
    headers = {"Authorization": "Bearer friend-token"}
    async with tailor, serving(bridge, sock), httpx.AsyncClient(headers=headers) as http:
        url = f"{base_url(sock)}/agents/tailor"
        blocking = await create_client(url, ClientConfig(httpx_client=http, streaming=False))
        streaming = await create_client(url, ClientConfig(httpx_client=http, streaming=True))
        yield blocking, streaming, tailor


def message(payload: dict[str, Any], task: Task | None = None) -> SendMessageRequest:
    msg = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=data_parts(payload))
    if task is not None:
        msg.task_id = task.id
        msg.context_id = task.context_id
    return SendMessageRequest(message=msg)


async def the_task(client: Client, request: SendMessageRequest) -> Task:
    (event,) = [e async for e in client.send_message(request)]
    assert event.HasField("task")
    return event.task


def states(events: list[StreamResponse]) -> list[int]:
    return [e.status_update.status.state for e in events if e.HasField("status_update")]


async def test_an_ask_parks_the_task_in_input_required_and_a_message_answers_it(
    lobby: LobbyServer,
) -> None:
    async with client(lobby) as (blocking, _, _):
        task = await the_task(blocking, message({"item": "shirt"}))
        assert task.status.state == INPUT_REQUIRED
        assert get_data_parts(task.status.message.parts) == [{"question": "Which size?"}]
        got = await blocking.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == INPUT_REQUIRED
        done = await the_task(blocking, message({"size": "M"}, task))
        assert (done.id, done.status.state) == (task.id, COMPLETED)
        assert get_data_parts(done.artifacts[0].parts) == [{"item": "shirt", "size": "M"}]
        assert (await blocking.get_task(GetTaskRequest(id=task.id))).status.state == COMPLETED
        assert lobby.router.conversations == {}


async def test_streaming_turns_end_in_input_required_then_in_completed(
    lobby: LobbyServer,
) -> None:
    async with client(lobby) as (_, streaming, _):
        first = [e async for e in streaming.send_message(message({"item": "coat"}))]
        assert states(first)[-1] == INPUT_REQUIRED
        task = next(e.task for e in first if e.HasField("task"))
        second = [e async for e in streaming.send_message(message({"size": "L"}, task))]
        updates = [
            get_data_parts(e.status_update.status.message.parts)
            for e in second
            if e.HasField("status_update") and e.status_update.status.message.parts
        ]
        assert [{"stage": "cutting"}] in updates
        assert states(second)[-1] == COMPLETED
        (artifact,) = [e.artifact_update.artifact for e in second if e.HasField("artifact_update")]
        assert get_data_parts(artifact.parts) == [{"item": "coat", "size": "L"}]


async def test_a_resubscribed_client_sees_every_event_after_the_answer(
    lobby: LobbyServer,
) -> None:
    async with client(lobby) as (blocking, streaming, _):
        task = await the_task(blocking, message({"item": "hat"}))
        assert task.status.state == INPUT_REQUIRED
        watcher = streaming.subscribe(SubscribeToTaskRequest(id=task.id))
        first = await anext(watcher)  # the task as it is now: the stream is open
        assert first.task.status.state == INPUT_REQUIRED
        answered = asyncio.ensure_future(the_task(blocking, message({"size": "S"}, task)))
        seen = [first] + [e async for e in watcher]
        assert (await answered).status.state == COMPLETED
        assert states(seen)[-1] == COMPLETED
        assert TaskState.TASK_STATE_WORKING in states(seen)
        (artifact,) = [e.artifact_update.artifact for e in seen if e.HasField("artifact_update")]
        assert get_data_parts(artifact.parts) == [{"item": "hat", "size": "S"}]


async def test_a_task_waiting_for_input_is_cancelled_at_the_lobby_too(lobby: LobbyServer) -> None:
    async with client(lobby) as (blocking, _, tailor):
        task = await the_task(blocking, message({"item": "scarf"}))
        assert len(lobby.router.conversations) == 1
        cancelled = await blocking.cancel_task(CancelTaskRequest(id=task.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        await asyncio.wait_for(tailor.stopped.wait(), 5)  # the lobby's CANCEL reached it
        assert lobby.router.conversations == {}
        got = await blocking.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(Exception, match="terminal"):
            await the_task(blocking, message({"size": "M"}, task))


async def test_a_generic_a2a_js_client_answers_input_required(lobby: LobbyServer) -> None:
    npm_installed(A2A_NODE)
    sock = bind("127.0.0.1", 0)
    bridge = Gateway("a2a_gateway", tokens=hashed_tokens(TOKENS), lobby_url=lobby.url)
    async with Tailor(lobby_url=lobby.url), serving(bridge, sock):
        client = await asyncio.create_subprocess_exec(
            *(node(), str(A2A_NODE / "multiturn.mjs"), f"{base_url(sock)}/agents/tailor/"),
            "friend-token",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
        out, err = await asyncio.wait_for(client.communicate(), 60)
    assert client.returncode == 0, err.decode()[-2000:]
    seen = orjson.loads(out)
    assert seen["asked"] == {
        "state": "TASK_STATE_INPUT_REQUIRED",
        "question": [{"question": "Which size?"}],
    }
    assert seen["got"] == "TASK_STATE_INPUT_REQUIRED"
    assert seen["answered"] == {
        "sameTask": True,
        "state": "TASK_STATE_COMPLETED",
        "artifacts": [[{"item": "shirt", "size": "M"}]],
    }
    assert seen["streamedTurns"] == ["TASK_STATE_INPUT_REQUIRED", "TASK_STATE_COMPLETED"]
    assert seen["cancelled"] == "TASK_STATE_CANCELED"


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def v03_message(data: dict[str, Any], task: dict[str, Any] | None = None) -> dict[str, Any]:
    """message/send's params in A2A 0.3's words, continuing `task` if given."""
    message: dict[str, Any] = {
        "kind": "message",
        "messageId": uuid.uuid4().hex,
        "role": "user",
        "parts": [{"kind": "data", "data": data}],
    }
    if task is not None:
        message |= {"taskId": task["id"], "contextId": task["contextId"]}
    return {"message": message}


async def test_a2a_0_3_tasks_get_resubscribe_and_cancel(lobby: LobbyServer) -> None:
    sock = bind("127.0.0.1", 0)
    bridge = Gateway("a2a_gateway", tokens=hashed_tokens(TOKENS), lobby_url=lobby.url)
    headers = {"Authorization": "Bearer friend-token"}
    async with (
        Tailor(lobby_url=lobby.url),
        serving(bridge, sock),
        httpx.AsyncClient(headers=headers, timeout=10) as http,
    ):
        url = f"{base_url(sock)}/agents/tailor/"

        async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
            answer = await http.post(url, json=rpc(method, params))
            result: dict[str, Any] = answer.json()["result"]
            return result

        task = await call("message/send", v03_message({"item": "shirt"}))
        assert task["status"]["state"] == "input-required"
        assert task["status"]["message"]["parts"][0]["data"] == {"question": "Which size?"}
        assert (await call("tasks/get", {"id": task["id"]}))["status"]["state"] == "input-required"
        events: list[dict[str, Any]] = []
        async with http.stream(
            "POST", url, json=rpc("tasks/resubscribe", {"id": task["id"]})
        ) as sse:
            lines = sse.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    events.append(orjson.loads(line.removeprefix("data: "))["result"])
                    break  # subscribed: the task as it is now
            answered = asyncio.ensure_future(call("message/send", v03_message({"size": "M"}, task)))
            async for line in lines:
                if line.startswith("data: "):
                    events.append(orjson.loads(line.removeprefix("data: "))["result"])
        assert (await answered)["status"]["state"] == "completed"
        assert events[0]["status"]["state"] == "input-required"
        states = [e["status"]["state"] for e in events if e["kind"] == "status-update"]
        assert (states[0], states[-1]) == ("working", "completed")
        (artifact,) = [e["artifact"] for e in events if e["kind"] == "artifact-update"]
        assert artifact["parts"][0]["data"] == {"item": "shirt", "size": "M"}
        waiting = await call("message/send", v03_message({"item": "hat"}))
        assert (await call("tasks/cancel", {"id": waiting["id"]}))["status"]["state"] == "canceled"


async def test_a_joined_a2a_agent_that_asks_for_input_asks_the_lobby_requester(
    lobby: LobbyServer,
) -> None:
    """Lobby -> `lobby a2a join` -> the gateway -> the lobby's tailor, and the question back the
    same way: the joined agent's task stops in input-required, so it asks its requester."""
    sock = bind("127.0.0.1", 0)
    bridge = Gateway("a2a_gateway", tokens=hashed_tokens(TOKENS), lobby_url=lobby.url)
    headers = {"Authorization": "Bearer friend-token"}
    asked: list[dict[str, Any]] = []

    def answer(question: dict[str, Any]) -> dict[str, Any]:
        asked.append(question)
        return {"size": "XL"}

    async with (
        Tailor(lobby_url=lobby.url),
        serving(bridge, sock),
        httpx.AsyncClient(headers=headers) as http,
    ):
        card = await fetch_card(f"{base_url(sock)}/agents/tailor/", http)
        async with (
            A2AAgent("tailor_via_a2a", card, http, lobby_url=lobby.url),
            Agent("buyer", lobby_url=lobby.url) as me,
        ):
            result = await me.request("tailor_via_a2a", "order", {"item": "cape"}, on_input=answer)
    assert asked == [{"question": "Which size?"}]
    assert result == {"item": "cape", "size": "XL"}
