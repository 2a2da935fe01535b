"""DISCOVER_SERVICES: the exact lookups of seed 003, and ranked search (`search.py`), in pages.

Every answer is one page: at most `limit` capabilities, and at most the lobby's byte bound
(`max_discover_bytes`) as one frame. A page that would pass the bound holds fewer capabilities
(always at least one, so paging moves on) and carries `next`, like any page with more after it;
a frame is never cut. `next` is an opaque cursor: base64url of a JSON array, `[rank]` or
`[rank, agent_id, name]` (`listing.Position`), which the client sends back as `cursor`.

Exceptions: ValueError └── BadDiscovery (an unusable cursor, filter or query; the router answers
it with ERROR `malformed`, its text naming the problem).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

import orjson

from lobby.core.discovery.listing import Position
from lobby.core.discovery.registry import Registry
from lobby.core.discovery.search import BadFilter, BadQuery, SearchPage, parse_filters
from protocol.payloads import DISCOVER_LIMIT, MAX_RANK, SEARCH_LIMIT, DiscoverServicesPayload

MAX_WAITING_QUERIES: Final = 4
"""DISCOVER_SERVICES one agent may have waiting for their answers; more gets `rate_limited`.
Answers come one per pass of the event loop, so a flood of queries waits in line instead of
holding the loop; this bound keeps that line short (the SDK pages one answer at a time)."""

_SERVICE: Final = len(b'{"agent_id":,"relevant_capabilities":[],"online":false},')
"""A service's bytes besides its agent id and capabilities (`false` is the longer boolean)."""
_SCORE: Final = len(b',"score":')
_NOT_A_CURSOR: Final = "invalid DISCOVER_SERVICES cursor: not the 'next' of an answer"


class BadDiscovery(ValueError):
    """A DISCOVER_SERVICES the lobby cannot answer; the text names the problem."""


def encode_cursor(position: Position) -> str:
    """The `next` an answer carries for `position`."""
    raw = [position.rank] if position.key is None else [position.rank, *position.key]
    return base64.urlsafe_b64encode(orjson.dumps(raw)).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> Position:
    """The position a `cursor` names; `BadDiscovery` if it is not one the lobby made."""
    try:
        raw = orjson.loads(base64.b64decode(cursor + "=" * (-len(cursor) % 4), b"-_", True))
    except (binascii.Error, ValueError):
        raise BadDiscovery(_NOT_A_CURSOR) from None
    if (
        isinstance(raw, list)
        and len(raw) in (1, 3)
        and type(raw[0]) is int
        and 0 <= raw[0] < MAX_RANK
        and all(isinstance(part, str) for part in raw[1:])
    ):
        return Position((raw[1], raw[2]) if len(raw) == 3 else None, raw[0])
    raise BadDiscovery(_NOT_A_CURSOR)


ONLINE_MARK: Final = orjson.Fragment(b"\x01")
"""Stands for a service's `online` in an answer made without presence (a replica of the index,
`lobby.discovery_worker`): a byte orjson never writes, replaced by `with_presence`."""


def with_presence(registry: Registry, answer: bytes, agent_ids: list[str]) -> bytes:
    """`answer`, made with `marked=True` for the services of `agent_ids` (in order), with each
    `ONLINE_MARK` replaced by whether that agent is online now."""
    parts = answer.split(b"\x01")
    if len(parts) != len(agent_ids) + 1:
        raise ValueError("an answer's presence marks do not match its services")
    agents = registry.agents
    out = [parts[0]]
    for agent_id, part in zip(agent_ids, parts[1:], strict=True):
        record = agents.get(agent_id)
        out.append(b"true" if record is not None and record.session is not None else b"false")
        out.append(part)
    return b"".join(out)


def services_available(
    registry: Registry,
    requester_id: str,
    query: DiscoverServicesPayload,
    *,
    room: int,
    marked: bool = False,
) -> dict[str, Any]:
    """The SERVICES_AVAILABLE payload answering `query`, at most `room` bytes as JSON (but
    always with one capability when there is one); `BadDiscovery` when it cannot be answered.
    With `marked`, each service's `online` is `ONLINE_MARK` (`with_presence` fills it in).

    Without `query`, `algorithm` or `filters` this is the seed's discovery: by exact capability
    name and/or keywords (any match), by agent id, then capability name. With them it is a
    ranked search over capabilities (restricted by name/keywords if given), grouped by agent in
    rank order, each capability carrying its `score`, with the `total` before paging.
    """
    keywords = query.keywords if query.keywords is not None else query.query_keywords
    if query.cursor is not None and query.offset:
        raise BadDiscovery("DISCOVER_SERVICES takes 'cursor' or 'offset', not both")
    start = Position(None, query.offset) if query.cursor is None else decode_cursor(query.cursor)
    payload: dict[str, Any] = {"discovered_for_capability": query.capability_name}
    if not query.ranked:
        page = registry.search.lookup(
            capability_name=query.capability_name,
            keywords=keywords,
            exclude_agent=requester_id,
            after=start.key,
            limit=query.limit or DISCOVER_LIMIT,
        )
    else:
        limit = query.limit or SEARCH_LIMIT
        if query.offset + limit > MAX_RANK:
            raise BadDiscovery(
                f"invalid DISCOVER_SERVICES offset: offset + limit must be at most {MAX_RANK}"
            )
        try:
            filters = parse_filters(query.filters)
            page = registry.search.search(
                query=query.query,
                algorithm=query.algorithm or ("lexical" if query.query else "filtered"),
                capability_name=query.capability_name,
                keywords=keywords,
                filters=filters,
                exclude_agent=requester_id,
                limit=limit,
                offset=start.rank,
                after=start.key,
            )
        except BadFilter as bad:
            raise BadDiscovery(f"invalid DISCOVER_SERVICES filters: {bad}") from None
        except BadQuery as bad:
            raise BadDiscovery(f"invalid DISCOVER_SERVICES query: {bad}") from None
        payload["total"] = page.total
        if not page.exact:
            payload["approximate"] = True
    room -= len(orjson.dumps(payload)) + len(b',"services_found":[],"next":null')
    services, page = _services(registry, page, query.ranked, room, marked)
    return {
        "services_found": services,
        **payload,
        "next": encode_cursor(page.next) if page.next is not None else None,
    }


def _services(
    registry: Registry, page: SearchPage, ranked: bool, room: int, marked: bool
) -> tuple[list[dict[str, Any]], SearchPage]:
    """The longest head of `page` whose services, and the `next` it then carries, take at
    most `room` bytes (at least one capability), grouped by agent, agents in order of their
    first capability; and that head. Sizes are counted from each capability's known JSON size
    and an upper bound per service: nothing is encoded to be measured but the cursor."""
    agents = registry.agents
    grouped: dict[str, dict[str, Any]] = {}
    costs: list[int] = []
    used = 0
    scored: dict[float, int] = {}  # score -> bytes of ',"score":<score>'; scores repeat
    for agent_id, name, score in page.hits:
        record = agents[agent_id]
        entry = record.capabilities[name]
        cost = entry.size + 1
        score_bytes = 0
        if ranked:
            score_bytes = scored.get(score, 0)
            if not score_bytes:
                score_bytes = scored[score] = _SCORE + len(orjson.dumps(score))
            cost += score_bytes
        service = grouped.get(agent_id)
        if service is None:
            cost += _SERVICE + len(orjson.dumps(agent_id))
            if ranked:
                cost += score_bytes
        if costs and used + cost > room:
            break
        if service is None:
            online = ONLINE_MARK if marked else record.session is not None
            service = {"agent_id": agent_id, "relevant_capabilities": [], "online": online}
            if ranked:
                service["score"] = score
            grouped[agent_id] = service
        service["relevant_capabilities"].append(
            {**entry.wire, "score": score} if ranked else entry.wire
        )
        costs.append(cost)
        used += cost
    taken = len(costs)
    head = page.cut(taken)
    # The cursor of a shorter page differs in length: give back capabilities until it fits.
    while head.next is not None and taken > 1:
        if used + len(encode_cursor(head.next)) + 2 <= room + len(b"null"):
            break
        taken -= 1
        used -= costs[taken]
        agent_id = head.hits[-1].agent_id
        capabilities = grouped[agent_id]["relevant_capabilities"]
        capabilities.pop()
        if not capabilities:
            del grouped[agent_id]
        head = page.cut(taken)
    return list(grouped.values()), head


__all__ = [
    "MAX_WAITING_QUERIES",
    "ONLINE_MARK",
    "BadDiscovery",
    "decode_cursor",
    "encode_cursor",
    "services_available",
    "with_presence",
]
