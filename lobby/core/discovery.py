"""DISCOVER_SERVICES: the exact lookups of seed 003, and ranked search (`search.py`)."""

from __future__ import annotations

from typing import Any

from lobby.core.registry import Registry
from lobby.core.search import BadFilter, parse_filters
from protocol.models import DiscoverServicesPayload


def services_available(
    registry: Registry, requester_id: str, query: DiscoverServicesPayload
) -> dict[str, Any]:
    """The SERVICES_AVAILABLE payload answering `query`; `BadFilter` for unusable filters.

    Without `query`, `algorithm` or `filters` this is the seed's discovery: by exact capability
    name and/or keywords (any match), every match, by agent id. With them it is a ranked
    search over capabilities (restricted by name/keywords if given), paged by `limit` and
    `offset`, grouped by agent in rank order, each capability carrying its `score`.
    """
    keywords = query.keywords if query.keywords is not None else query.query_keywords
    if not query.ranked:
        found = registry.discover(
            requester_id=requester_id, capability_name=query.capability_name, keywords=keywords
        )
        services = [
            {
                "agent_id": record.agent_id,
                "relevant_capabilities": [entry.wire for entry in entries],
                "online": record.session is not None,
            }
            for record, entries in found
        ]
        return {"services_found": services, "discovered_for_capability": query.capability_name}
    filters = parse_filters(query.filters)
    only = None
    if query.capability_name is not None or keywords:
        only = registry.keys_matching(query.capability_name, keywords)
    algorithm = query.algorithm or ("lexical" if query.query else "filtered")
    page = registry.search.search(
        query=query.query,
        algorithm=algorithm,
        filters=filters,
        exclude_agent=requester_id,
        only=only,
        limit=query.limit,
        offset=query.offset,
    )
    grouped: dict[str, dict[str, Any]] = {}
    for hit in page.hits:
        record = registry.agents[hit.agent_id]
        service = grouped.get(hit.agent_id)
        if service is None:
            service = grouped[hit.agent_id] = {
                "agent_id": hit.agent_id,
                "relevant_capabilities": [],
                "online": record.session is not None,
                "score": hit.score,
            }
        wire = record.capabilities[hit.name].wire
        service["relevant_capabilities"].append({**wire, "score": hit.score})
    return {
        "services_found": list(grouped.values()),
        "discovered_for_capability": query.capability_name,
        "total": page.total,
    }


__all__ = ["BadFilter", "services_available"]
