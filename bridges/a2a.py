"""Lobby agents as A2A agents: a gateway (`lobby a2a serve`) that serves an agent card per lobby
agent and turns A2A messages into REQUESTs.

    GET  /agents/<id>/.well-known/agent-card.json   the card: one skill per capability
    POST /agents/<id>/  (or /agents/<id>)           JSON-RPC: SendMessage, SendStreamingMessage
                                                    (and A2A 0.3's message/send, message/stream)
    GET  /.well-known/agent-card.json, POST /       the same for the default agent, if one is set

A message becomes a REQUEST to agent <id> (`a2a_parts` says which capability and payload; a
message naming none calls the agent's sole capability, and an agent with several answers a
JSON-RPC Invalid params error naming them); each `in_progress` RESPONSE becomes a task status
update (state working, a data part), the final RESPONSE a completed task with the result as a
data artifact, an error a failed task whose status message carries `{"code": ..., "error": ...}`
(the lobby's code). A RESPONSE asking for input (`input_required`) leaves the task in
`input-required`, and a message naming the task (`taskId`) answers it with INPUT
(`a2a_tasks`); `tasks/get`, `tasks/resubscribe` and `tasks/cancel` act on tasks as A2A says.
A caller authenticates with `Authorization: Bearer <token>`; the tokens file maps each token
to a lobby agent id, and the gateway calls the lobby as that agent (one SDK connection each),
so the lobby's own authorization decides. A missing or unknown token is answered 401 before
anything is sent, unless the gateway names an agent for callers without a token
(`anonymous`). Every error the gateway answers itself is a JSON-RPC error object
(`a2a_card.rpc_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import uvicorn
from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import Message, SendMessageRequest, Task
from a2a.utils.errors import InternalError, InvalidParamsError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_sdk.agent import Agent
from agent_sdk.errors import (
    AgentSDKError,
)
from bridges.a2a_card import (
    CARD_PATH,
    CONTENT_TYPE_NOT_SUPPORTED,
    UNAUTHENTICATED,
    agent_card,
    card_response,
    is_json,
    rpc_error,
)
from bridges.a2a_parts import named_capability
from bridges.a2a_tasks import CALLER, CAPABILITY, DEFAULT_TASK_TIMEOUT, TARGET, LobbyExecutor
from protocol.payloads import Capability


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
        context.state[CALLER] = request.scope[CALLER]
        context.state[TARGET] = request.scope[TARGET]
        return context

    def build_user(self, request: Request) -> User:
        caller: Agent = request.scope[CALLER]
        return _Caller(caller.agent_id)


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


class _LobbyRequestHandler(DefaultRequestHandler):
    """The SDK's request handler, which first settles the capability a message calls (see
    `Gateway.capability_for`), so a message that names none and has no default is refused as
    a JSON-RPC error before a task exists."""

    def __init__(self, gateway: Gateway, max_tasks: int, task_timeout: float) -> None:
        # The handler reads one card for what it checks (streaming is on); each agent's own
        # card is built per request from the registry.
        generic = agent_card("lobby", [Capability(name="any")], "/")
        executor = LobbyExecutor(task_timeout=task_timeout, max_waiting=max_tasks)
        super().__init__(executor, BoundedTaskStore(max_tasks), generic)
        self._gateway = gateway

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        await self._name_capability(params, context)
        answer: Task | Message = await super().on_message_send(params, context)
        return answer

    async def on_message_send_stream(  # type: ignore[override]
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncIterator[Any]:
        await self._name_capability(params, context)
        async for event in super().on_message_send_stream(params, context):
            yield event

    async def _name_capability(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> None:
        context.state[CAPABILITY] = await self._gateway.capability_for(
            context.state[TARGET], params.message
        )


class Gateway:
    """The A2A gateway: `agent_id` is its own lobby agent (it reads the registry for the
    cards); `tokens` (from `load_tokens`) names the lobby agents callers act as; `anonymous`
    (if any) the one a caller without an Authorization header acts as (else such a caller is
    refused 401); `default_agent` (if any) is served at the origin too (its card at
    `/.well-known/agent-card.json`, JSON-RPC at `/`); at most `max_tasks` A2A tasks are kept
    for `tasks/get`; a task fails with `timeout` after `task_timeout` seconds, its turns
    included; what the registry says is read again after `registry_ttl` seconds. Enter
    it (`async with`) to connect the agents, then serve `app`."""

    def __init__(
        self,
        agent_id: str,
        *,
        tokens: Mapping[str, str],
        anonymous: str | None = None,
        default_agent: str | None = None,
        lobby_url: str | None = None,
        max_tasks: int = 10_000,
        registry_ttl: float = 1.0,
        task_timeout: float = DEFAULT_TASK_TIMEOUT,
    ) -> None:
        self.agent = Agent(agent_id, lobby_url=lobby_url)
        # Cards and messages naming no skill read the registry: a DISCOVER reads every agent's
        # capabilities and the lobby rate-limits them (50/s), so one read serves all requests
        # of the next `registry_ttl` seconds, and concurrent requests share one read.
        self.registry_ttl = registry_ttl
        self._registry: dict[str, list[Capability]] = {}
        self._registry_read_at = -float("inf")
        self._registry_lock = asyncio.Lock()
        self._tokens = dict(tokens)
        self._anonymous = anonymous
        self._default_agent = default_agent
        callers = set(tokens.values()) | ({anonymous} if anonymous else set())
        self._callers = {caller: Agent(caller, lobby_url=lobby_url) for caller in callers}
        self._dispatcher = JsonRpcDispatcher(
            _LobbyRequestHandler(self, max_tasks, task_timeout),
            context_builder=_ContextBuilder(),
            enable_v0_3_compat=True,
        )
        self.app = Starlette(
            routes=[
                Route("/" + CARD_PATH, self._card, methods=["GET"]),
                Route("/", self._rpc, methods=["POST"]),
                Route("/agents/{agent_id}/" + CARD_PATH, self._card, methods=["GET"]),
                Route("/agents/{agent_id}/", self._rpc, methods=["POST"]),
                Route("/agents/{agent_id}", self._rpc, methods=["POST"]),
            ],
            exception_handlers={HTTPException: _http_error},
        )

    async def __aenter__(self) -> Gateway:
        async with contextlib.AsyncExitStack() as stack:
            for agent in (self.agent, *self._callers.values()):
                await stack.enter_async_context(agent)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def capabilities_of(self, agent_id: str) -> list[Capability]:
        """What lobby agent `agent_id` offers (none: not there, or it offers nothing), as the
        registry said at most `registry_ttl` seconds ago. AgentSDKError if the lobby refused
        the query (rate_limited) or is away."""
        async with self._registry_lock:
            if time.monotonic() - self._registry_read_at >= self.registry_ttl:
                services = await self.agent.discover()
                self._registry = {s.agent_id: list(s.relevant_capabilities) for s in services}
                self._registry_read_at = time.monotonic()
            return self._registry.get(agent_id, [])

    async def capability_for(self, agent_id: str, message: Message) -> str:
        """The capability `message` calls on `agent_id`: the one it names (metadata.skill, or
        capability_name in its payload), else the agent's sole capability. InvalidParamsError
        when it names none and the agent has no sole one."""
        named = named_capability(message)
        if named is not None:
            return named
        try:
            offered = [capability.name for capability in await self.capabilities_of(agent_id)]
        except AgentSDKError as exc:
            raise InternalError(message=f"cannot read the lobby's registry: {exc}") from None
        if len(offered) == 1:
            return offered[0]
        if not offered:
            raise InvalidParamsError(message=f"no lobby agent {agent_id!r} offers a capability")
        raise InvalidParamsError(
            message=f"the message names no skill and lobby agent {agent_id!r} offers "
            f"{len(offered)} ({', '.join(offered)}): name one in metadata.skill"
        )

    def _target(self, request: Request) -> str:
        target = request.path_params.get("agent_id", self._default_agent)
        if target is None:
            raise HTTPException(
                404,
                "this gateway has no default agent: an agent's card is at "
                f"/agents/<agent id>/{CARD_PATH}",
            )
        return str(target)

    async def _card(self, request: Request) -> Response:
        agent_id = self._target(request)
        try:
            capabilities = await self.capabilities_of(agent_id)
        except AgentSDKError as exc:
            return rpc_error(503, f"cannot read the lobby's registry: {exc}")
        if not capabilities:
            return rpc_error(404, f"no lobby agent {agent_id!r} offers a capability")
        base = str(request.base_url).rstrip("/")
        url = f"{base}/agents/{agent_id}/" if "agent_id" in request.path_params else f"{base}/"
        card = agent_card(agent_id, capabilities, url, bearer_required=self._anonymous is None)
        return card_response(card, request)

    async def _rpc(self, request: Request) -> Response:
        target = self._target(request)
        authorization = request.headers.get("authorization")
        if authorization is None and self._anonymous is not None:
            caller_id: str | None = self._anonymous
        else:
            scheme, _, token = (authorization or "").partition(" ")
            caller_id = self._tokens.get(_digest(token)) if scheme.lower() == "bearer" else None
        if caller_id is None:
            return rpc_error(
                401,
                "a bearer token of the gateway's tokens file is required",
                code=UNAUTHENTICATED,
                headers={"WWW-Authenticate": "Bearer"},
            )
        content_type = request.headers.get("content-type")
        if not is_json(content_type):
            return rpc_error(
                415,
                f"the body must be JSON-RPC as application/json, not {content_type}",
                code=CONTENT_TYPE_NOT_SUPPORTED,
            )
        request.scope[CALLER] = self._callers[caller_id]
        request.scope[TARGET] = target
        return await self._dispatcher.handle_requests(request)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no such path, a method a path does not take) as JSON-RPC."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404 and exc.detail == "Not Found":
        detail = (
            f"no such path {request.url.path!r}: an agent's card is at "
            f"/agents/<agent id>/{CARD_PATH} (a base URL /agents/<agent id> needs its trailing "
            "slash for the card to be found relative to it), its JSON-RPC at /agents/<agent id>/"
        )
    elif exc.status_code == 405:
        detail = f"{request.method} is not served at {request.url.path!r}"
    else:
        detail = str(exc.detail)
    return rpc_error(exc.status_code, detail, headers=exc.headers)


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
