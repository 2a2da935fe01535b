"""Lobby agents as A2A agents: a gateway (`lobby a2a serve`) that serves an agent card per lobby
agent and turns A2A messages into REQUESTs.

    GET  /agents/<id>/.well-known/agent-card.json   the card: one skill per capability
    POST /agents/<id>/                              JSON-RPC: SendMessage, SendStreamingMessage
                                                    (and A2A 0.3's message/send, message/stream)

A message becomes a REQUEST to agent <id> (`a2a_parts` says which capability and payload); each
`in_progress` RESPONSE becomes a task status update (state working, a data part), the final
RESPONSE a completed task with the result as a data artifact, an error a failed task whose
status message carries `{"code": ..., "error": ...}` (the lobby's code). A caller authenticates
with `Authorization: Bearer <token>`; the tokens file maps each token to a lobby agent id, and
the gateway calls the lobby as that agent (one SDK connection each), so the lobby's own
authorization decides. A missing or unknown token is answered 401 before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import uvicorn
from a2a.auth.user import User
from a2a.helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskState,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent_sdk.agent import Agent
from agent_sdk.bridges.a2a_parts import data_parts, payload_of, skill_of
from agent_sdk.errors import (
    AgentSDKError,
    RemoteError,
    RequestError,
    RequestRefusedError,
    UnknownReceiverError,
)
from protocol.models import ErrorCode, ResponseStatus
from protocol.payloads import Capability

CARD_PATH = ".well-known/agent-card.json"
_CALLER = "lobby_caller"
_TARGET = "lobby_target"


class TokensFileError(AgentSDKError, ValueError):
    """The tokens file cannot be read or is not a JSON object of token -> agent id."""


def load_tokens(path: Path) -> dict[str, str]:
    """The tokens file (`{"<bearer token>": "<lobby agent id>", ...}`) as SHA-256 of each token
    -> agent id (`hashed_tokens`): the gateway keeps no token in clear."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TokensFileError(f"cannot read --tokens {path}: {exc}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in raw.items()
    ):
        raise TokensFileError(
            f"--tokens {path} must be a JSON object of bearer token -> lobby agent id"
        )
    return hashed_tokens(raw)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def agent_card(agent_id: str, capabilities: list[Capability], url: str) -> AgentCard:
    """The A2A card of lobby agent `agent_id`, served at `url`: a skill per capability."""
    return AgentCard(
        name=agent_id,
        description=f"Lobby agent {agent_id}, through the Agent Lobby's A2A gateway.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer")
            )
        },
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        skills=[
            AgentSkill(
                id=capability.name,
                name=capability.name,
                description=capability.description or capability.name,
                tags=list(capability.keywords) or [capability.name],
            )
            for capability in capabilities
        ],
    )


class _Caller(User):
    """The lobby agent a bearer token maps to: A2A tasks are kept apart per caller."""

    def __init__(self, agent_id: str) -> None:
        self._agent_id = agent_id

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._agent_id


class _ContextBuilder(DefaultServerCallContextBuilder):
    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[_CALLER] = request.scope[_CALLER]
        context.state[_TARGET] = request.path_params["agent_id"]
        return context

    def build_user(self, request: Request) -> User:
        caller: Agent = request.scope[_CALLER]
        return _Caller(caller.agent_id)


class LobbyExecutor(AgentExecutor):
    """Runs one A2A message as a REQUEST through the caller's own lobby connection."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        caller: Agent = context.call_context.state[_CALLER]
        target: str = context.call_context.state[_TARGET]
        message = context.message
        assert message is not None
        assert context.task_id
        assert context.context_id
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(message))
        task = TaskUpdater(event_queue, context.task_id, context.context_id)
        payload = payload_of(list(message.parts))
        capability = skill_of(message) or payload.pop("capability_name", None)
        if not isinstance(capability, str) or not capability:
            error = "name the capability: metadata.skill, or capability_name in the data part"
            await task.failed(task.new_agent_message(_error(ErrorCode.INVALID_INPUT, error)))
            return
        payload.pop("capability_name", None)
        await task.start_work()
        result: dict[str, Any] = {}
        try:
            async for answer in caller.request_stream(target, capability, payload):
                if answer.get("status") == ResponseStatus.IN_PROGRESS:
                    update = {k: v for k, v in answer.items() if k != "status"}
                    await task.update_status(
                        TaskState.TASK_STATE_WORKING, task.new_agent_message(data_parts(update))
                    )
                else:  # the final RESPONSE's payload, its status already taken off
                    result = answer
        except RemoteError as exc:
            await task.failed(task.new_agent_message(_error(exc.code, exc.message)))
            return
        except RequestRefusedError as exc:
            await task.failed(task.new_agent_message(_error(exc.code, exc.message)))
            return
        except UnknownReceiverError as exc:
            await task.failed(task.new_agent_message(_error(ErrorCode.UNKNOWN_RECEIVER, str(exc))))
            return
        except RequestError as exc:
            await task.failed(task.new_agent_message(_error("timeout", str(exc))))
            return
        await task.add_artifact(data_parts(result), name="result")
        await task.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id
        assert context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class BoundedTaskStore(InMemoryTaskStore):
    """The SDK's in-memory task store, holding at most `max_tasks` tasks: past that, the
    oldest is forgotten (a later `tasks/get` of it answers task not found)."""

    def __init__(self, max_tasks: int) -> None:
        super().__init__()
        self.max_tasks = max_tasks
        self._order: OrderedDict[str, ServerCallContext] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        self._order[task.id] = context
        while len(self._order) > self.max_tasks:
            task_id, saved_by = self._order.popitem(last=False)
            await super().delete(task_id, saved_by)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._order.pop(task_id, None)
        await super().delete(task_id, context)


def _error(code: str, error: str) -> list[Any]:
    return data_parts({"code": code, "error": error})


class Gateway:
    """The A2A gateway: `agent_id` is its own lobby agent (it reads the registry for the
    cards); `tokens` (from `load_tokens`) names the lobby agents callers act as; at most
    `max_tasks` A2A tasks are kept for `tasks/get`. Enter it (`async with`) to connect the
    agents, then serve `app`."""

    def __init__(
        self,
        agent_id: str,
        *,
        tokens: Mapping[str, str],
        lobby_url: str | None = None,
        max_tasks: int = 10_000,
    ) -> None:
        self.agent = Agent(agent_id, lobby_url=lobby_url)
        self._tokens = dict(tokens)
        self._callers = {
            caller: Agent(caller, lobby_url=lobby_url) for caller in set(tokens.values())
        }
        # The handler reads one card for what it checks (streaming is on); each agent's own
        # card is built per request from the registry.
        generic = agent_card("lobby", [Capability(name="any")], "/")
        handler = DefaultRequestHandler(LobbyExecutor(), BoundedTaskStore(max_tasks), generic)
        self._dispatcher = JsonRpcDispatcher(
            handler, context_builder=_ContextBuilder(), enable_v0_3_compat=True
        )
        self.app = Starlette(
            routes=[
                Route("/agents/{agent_id}/" + CARD_PATH, self._card, methods=["GET"]),
                Route("/agents/{agent_id}/", self._rpc, methods=["POST"]),
                Route("/agents/{agent_id}", self._rpc, methods=["POST"]),
            ]
        )

    async def __aenter__(self) -> Gateway:
        async with contextlib.AsyncExitStack() as stack:
            for agent in (self.agent, *self._callers.values()):
                await stack.enter_async_context(agent)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _card(self, request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        try:
            services = await self.agent.discover()
        except AgentSDKError as exc:  # the lobby refused the query (rate_limited) or is away
            return JSONResponse({"error": f"cannot read the registry: {exc}"}, status_code=503)
        found = [s for s in services if s.agent_id == agent_id]
        if not found:
            return JSONResponse(
                {"error": f"no lobby agent {agent_id!r} offers a capability"}, status_code=404
            )
        url = f"{str(request.base_url).rstrip('/')}/agents/{agent_id}/"
        card = agent_card(agent_id, list(found[0].relevant_capabilities), url)
        return JSONResponse(agent_card_to_dict(card))

    async def _rpc(self, request: Request) -> Response:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        caller_id = self._tokens.get(_digest(token)) if scheme.lower() == "bearer" else None
        if caller_id is None:
            return JSONResponse(
                {"error": "a bearer token of the gateway's tokens file is required"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        request.scope[_CALLER] = self._callers[caller_id]
        return await self._dispatcher.handle_requests(request)


def hashed_tokens(tokens: Mapping[str, str]) -> dict[str, str]:
    """Bearer token -> agent id, as `Gateway` takes it (what `load_tokens` returns)."""
    return {_digest(token): agent_id for token, agent_id in tokens.items()}


@contextlib.asynccontextmanager
async def serve_http(app: Starlette, sock: socket.socket) -> AsyncIterator[uvicorn.Server]:
    """Serve an ASGI `app` with uvicorn on the bound `sock` until the block ends."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def serving(gateway: Gateway, sock: socket.socket) -> AsyncIterator[Gateway]:
    """Connect `gateway`'s agents, then serve it on the bound `sock` until the block ends."""
    async with gateway, serve_http(gateway.app, sock):
        yield gateway


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (0: a free port); OSError if it cannot be."""
    return socket.create_server((host, port))


def base_url(sock: socket.socket) -> str:
    """`http://host:port` of a socket from `bind`."""
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"
