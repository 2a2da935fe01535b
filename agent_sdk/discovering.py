"""Questions to the lobby: discovery and ranked search, page by page, and `ask_lobby`, the
one exchange they (and other lobby questions) are made of."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_sdk.core import AgentCore
from agent_sdk.errors import LobbyError, RequestTimeoutError
from protocol.models import LOBBY_ID, Message, MessageType
from protocol.payloads import MAX_DISCOVER_LIMIT, ServiceRecord, ServicesAvailablePayload


class Discovery(AgentCore):
    """DISCOVER_SERVICES and the lobby's other answers; mixed into `Agent` (via `Caller`)."""

    async def discover(
        self,
        capability_name: str | None = None,
        *,
        keywords: list[str] | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> list[ServiceRecord]:
        """Agents (other than this one) offering a capability, by name and/or keywords: every
        match, by agent id. The lobby answers in pages; this follows them to the end,
        `page_size` capabilities per DISCOVER (None: the lobby's default, 100; at most 200).
        `timeout` is per page."""
        payload: dict[str, Any] = {}
        if capability_name is not None:
            payload["capability_name"] = capability_name
        if keywords is not None:
            payload["keywords"] = keywords
        if page_size is not None:
            payload["limit"] = page_size
        return await self._pages(payload, None, timeout)

    async def search(
        self,
        query: str | None = None,
        *,
        algorithm: str | None = None,
        filters: list[dict[str, Any]] | None = None,
        capability_name: str | None = None,
        keywords: list[str] | None = None,
        limit: int = 50,
        offset: int = 0,
        timeout: float | None = None,
    ) -> list[ServiceRecord]:
        """Ranked search (`simple`, `filtered`, `lexical`; default lexical with a query):
        services in rank order, each with its `score`. Filters match capability `attributes`:
        `{"attribute": "price", "op": "lt", "value": 10}`. Up to `limit` capabilities from rank
        `offset` (a lexical search serves ranks below 1000), fetched in as many pages as that
        takes; `timeout` is per page."""
        payload: dict[str, Any] = {"algorithm": algorithm or ("lexical" if query else "filtered")}
        optional = {
            "query": query,
            "filters": filters,
            "capability_name": capability_name,
            "keywords": keywords,
        }
        payload.update({k: v for k, v in optional.items() if v is not None})
        if offset:
            payload["offset"] = offset
        return await self._pages(payload, limit, timeout)

    async def _pages(
        self, query: dict[str, Any], want: int | None, timeout: float | None
    ) -> list[ServiceRecord]:
        """DISCOVER_SERVICES `query`, then each answer's `next`, until there is none or `want`
        capabilities came; an agent listed on several pages is merged into its first place."""
        found: dict[str, ServiceRecord] = {}
        got = 0
        payload = dict(query)
        while want is None or got < want:
            if want is not None:
                payload["limit"] = min(want - got, MAX_DISCOVER_LIMIT)
            reply = await self.ask_lobby(MessageType.DISCOVER_SERVICES, payload, timeout=timeout)
            answer = ServicesAvailablePayload.model_validate(reply.payload)
            for service in answer.services_found:
                got += len(service.relevant_capabilities)
                first = found.get(service.agent_id)
                if first is not None:
                    more = [*first.relevant_capabilities, *service.relevant_capabilities]
                    service = first.model_copy(update={"relevant_capabilities": more})
                found[service.agent_id] = service
            if answer.next is None:
                break
            payload = {k: v for k, v in payload.items() if k != "offset"}
            payload["cursor"] = answer.next
        return list(found.values())

    async def ask_lobby(
        self,
        message_type: MessageType,
        payload: dict[str, Any],
        *,
        timeout: float | None = None,
        receiver_id: str = LOBBY_ID,
    ) -> Message:
        """Send a message and return the lobby's answer in its conversation; `LobbyError` if
        it is an ERROR. Usually to the lobby itself; a PAYMENT goes to the payee and the
        lobby answers with PAYMENT_CONFIRMED."""
        conversation_id = self.new_id()
        future = self._outstanding.question(conversation_id)
        try:
            async with asyncio.timeout(timeout or self.request_timeout):
                await self.send(receiver_id, message_type, payload, conversation_id=conversation_id)
                reply = await future
        except TimeoutError:
            raise RequestTimeoutError(f"no reply from the lobby to {message_type}") from None
        finally:
            self._outstanding.forget(conversation_id)
        if reply.message_type is MessageType.ERROR:
            raise LobbyError(str(reply.payload.get("code")), str(reply.payload.get("error")))
        return reply
