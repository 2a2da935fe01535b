"""What the A2A gateway answers over plain HTTP: agent cards (with caching headers) and errors
(every one a JSON-RPC error object, whatever the HTTP status).

A card is answered with `Cache-Control: public, max-age=60` and a strong `ETag` (a digest of its
bytes); a request whose `If-None-Match` names that tag is answered 304 with no body. A card
changes only when its agent's capabilities do, so a minute's caching costs little.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from starlette.requests import Request
from starlette.responses import Response

from protocol.payloads import Capability

CARD_PATH = ".well-known/agent-card.json"
CARD_MAX_AGE = 60
"""Seconds a client may reuse a card without asking again."""

INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
CONTENT_TYPE_NOT_SUPPORTED = -32005
UNAUTHENTICATED = -31401
"""No or an unknown bearer token. A2A names no JSON-RPC code for it ("a custom error"): this
one lies outside the range JSON-RPC and A2A reserve (-32768 to -32000)."""


def agent_card(
    agent_id: str, capabilities: list[Capability], url: str, *, bearer_required: bool = True
) -> AgentCard:
    """The A2A card of lobby agent `agent_id`, served at `url`: a skill per capability.
    `bearer_required=False` when the gateway also takes callers without a token."""
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
        security_requirements=(
            [SecurityRequirement(schemes={"bearer": StringList()})] if bearer_required else []
        ),
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


def card_response(card: AgentCard, request: Request) -> Response:
    """`card` as JSON with its caching headers, or 304 when the client holds it already."""
    body = orjson.dumps(agent_card_to_dict(card))
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    headers = {"Cache-Control": f"public, max-age={CARD_MAX_AGE}", "ETag": etag}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def is_json(content_type: str | None) -> bool:
    """Whether a request's Content-Type is JSON (or absent: then the body decides)."""
    if content_type is None:
        return True
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110's weak comparison, as If-None-Match asks: `*`, or any listed tag, W/ or not."""
    if if_none_match is None:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


def rpc_error(
    status: int,
    message: str,
    *,
    code: int | None = None,
    headers: Mapping[str, str] | None = None,
    request_id: Any = None,
) -> Response:
    """An HTTP error answered as a JSON-RPC error: A2A clients read the body of any answer as
    JSON-RPC. Unless `code` says otherwise, a client error (4xx) is Invalid Request, a server
    error Internal Error; the HTTP status stays what it is (401, 404, ...)."""
    if code is None:
        code = INVALID_REQUEST if status < 500 else INTERNAL_ERROR
    error = {"code": code, "message": message, "data": {"httpStatus": status}}
    body = {"jsonrpc": "2.0", "id": request_id, "error": error}
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )
