"""The observer stream behind the dashboard: the /admin `observe` command, the state the
dashboard shows, and a bounded ring of recent message summaries per conversation and trace
for the conversation viewer.

Nothing here runs while nobody observes: the server calls `routed` and `noticed` only under
`if observers.sessions:`, so the routing path pays one set-truth test per message. While
someone observes, each routed message is decoded once more here (never in the core), its
summary recorded and pushed to every observer. The rings therefore hold what was routed while
a dashboard was open; the lobby keeps nothing of the kind otherwise.

A summary carries the envelope's routing fields and a clipped preview of the payload from
which every value under a key named in `SECRET_KEYS` is replaced by "[secret]" (at any
depth); `auth_token` is never read, and REGISTER and REGISTER_ACK payloads (which carry
tokens) are never previewed.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from lobby.core.session import Action, Send, Session
from protocol.models import LOBBY_ID

if TYPE_CHECKING:
    from lobby.core.router import Router


class Server(Protocol):
    """What the observers use of the server (`lobby.server.LobbyServer`)."""

    router: Router
    connections: int

    def send(self, session: Session, frame: bytes) -> None: ...


SECRET_KEYS = frozenset(
    {
        "auth_token",
        "token",
        "password",
        "passphrase",
        "secret",
        "api_key",
        "private_key",
        "card_number",
        "cvv",
        "credentials",
    }
)
"""Payload keys whose values never leave the lobby through the observer stream."""

RING_MESSAGES = 200
"""Summaries kept per conversation (or trace) id: the oldest go first."""
RING_KEYS = 1000
"""Conversation and trace ids kept: the least recently used go first."""
RECENT = 100
"""Summaries across all conversations sent in a snapshot."""
LISTED = 500
"""Agents, dialogues, conversations and transactions listed in a state event at most."""
STATE_INTERVAL = 1.0
"""Seconds between two `state` events while someone observes."""
PREVIEW_CHARS = 300

_UNPREVIEWED = frozenset({"REGISTER", "REGISTER_ACK"})
_NOTICES = frozenset(
    {"TRANSACTION_CONFIRMED", "PAYMENT_CONFIRMED", "DIALOGUE_EXPIRED", "BIDS_REVEALED"}
)
"""Messages the lobby itself sends to agents that belong in the viewer."""

Summary = dict[str, Any]


def _trace_id(envelope: dict[str, Any]) -> str | None:
    """The trace id of a W3C `traceparent` (version-traceid-spanid-flags), when there is one."""
    parent = envelope.get("traceparent")
    if isinstance(parent, str):
        parts = parent.split("-")
        if len(parts) == 4:
            return parts[1]
    return None


def _conversation_id(envelope: dict[str, Any]) -> str | None:
    value = envelope.get("conversation_id")
    return value if isinstance(value, str) else None


KEYS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "conversation_id": _conversation_id,
    "trace_id": _trace_id,
}
"""The ids a message is found by in the viewer (a dialogue's id is its conversation_id); a new
kind of id is a new entry."""


DEPTH = 32
"""Deeper than this, a payload's preview says "[...]" (no recursion without a bound)."""


def redact(value: Any, depth: int = 0) -> Any:
    """`value` with every entry under a key in `SECRET_KEYS` replaced, at any depth."""
    if isinstance(value, dict | list) and depth >= DEPTH:
        return "[...]"
    if isinstance(value, dict):
        return {
            k: "[secret]" if str(k).lower() in SECRET_KEYS else redact(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v, depth + 1) for v in value]
    return value


def summarize(envelope: dict[str, Any], at: float) -> Summary:
    """The summary of one message's envelope, as the viewer shows it."""
    message_type = envelope.get("message_type")
    summary: Summary = {
        "at": at,
        "sender_id": envelope.get("sender_id"),
        "receiver_id": envelope.get("receiver_id"),
        "message_type": message_type,
        "message_id": envelope.get("message_id"),
        "in_reply_to": envelope.get("in_reply_to"),
    }
    for key, find in KEYS.items():
        summary[key] = find(envelope)
    if message_type not in _UNPREVIEWED:
        preview = orjson.dumps(redact(envelope.get("payload"))).decode()
        if len(preview) > PREVIEW_CHARS:
            preview = preview[: PREVIEW_CHARS - 3] + "..."
        summary["payload"] = preview
    return summary


class Rings:
    """Recent summaries per id, bounded: `RING_MESSAGES` per id, `RING_KEYS` ids."""

    def __init__(self, *, per_key: int = RING_MESSAGES, keys: int = RING_KEYS) -> None:
        self.per_key = per_key
        self.keys = keys
        self._rings: OrderedDict[str, deque[Summary]] = OrderedDict()
        self.recent: deque[Summary] = deque(maxlen=RECENT)

    def add(self, summary: Summary) -> None:
        self.recent.append(summary)
        for kind in KEYS:
            key = summary.get(kind)
            if not key:
                continue
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = deque(maxlen=self.per_key)
                if len(self._rings) > self.keys:
                    self._rings.popitem(last=False)
            else:
                self._rings.move_to_end(key)
            ring.append(summary)

    def find(self, key: str) -> list[Summary]:
        """The summaries kept for a conversation, dialogue or trace id, oldest first."""
        return list(self._rings.get(key, ()))

    def __len__(self) -> int:
        return len(self._rings)


class Observers:
    """The /admin connections that sent `observe`, and what they are told."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.sessions: set[Session] = set()
        self.rings = Rings()
        self._ticker: asyncio.TimerHandle | None = None

    # -- commands -------------------------------------------------------------------------

    def observe(self, session: Session, answer: dict[str, Any]) -> None:
        """Start streaming to `session`: the answer carries the snapshot, events follow."""
        self.sessions.add(session)
        snapshot = self.state()
        snapshot["recent"] = list(self.rings.recent)
        self._send(session, {"ok": True, **answer, "event": "snapshot", **snapshot})
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(STATE_INTERVAL, self._tick)

    def find(self, key: str) -> list[Summary]:
        return self.rings.find(key)

    def left(self, session: Session) -> None:
        """`session` closed."""
        self.sessions.discard(session)

    # -- what the server reports while someone observes ------------------------------------

    def routed(self, session: Session, data: bytes, actions: Iterable[Action]) -> None:
        """One message from an agent was handled into `actions`."""
        try:
            envelope = orjson.loads(data)
        except orjson.JSONDecodeError:
            envelope = None
        now = time.time()
        summary = summarize(envelope if isinstance(envelope, dict) else {}, now)
        if session.agent is not None:
            summary["sender_id"] = session.agent.agent_id
        notices: list[Summary] = []
        for action in actions:
            if not isinstance(action, Send):
                continue
            frame = orjson.loads(action.frame)
            kind = frame.get("message_type")
            payload = frame.get("payload") or {}
            if action.session is session and (
                kind == "ERROR"
                or (
                    kind == "RESPONSE"
                    and summary["message_type"] == "REQUEST"
                    and payload.get("status") == "error"
                )
            ):
                summary["refused"] = {"code": payload.get("code"), "error": payload.get("error")}
            elif kind in _NOTICES and frame.get("sender_id") == LOBBY_ID:
                notices.append(summarize(frame, now))
            elif kind == summary["message_type"] and frame.get("sender_id") == summary["sender_id"]:
                # The message as forwarded: ids the lobby gave it (a trace started for a
                # message sent without one) find it in the viewer too.
                for key, find in KEYS.items():
                    summary[key] = summary[key] or find(frame)
                summary["message_id"] = summary["message_id"] or frame.get("message_id")
        self._record(summary)
        for notice in notices:
            self._record(notice)

    def noticed(self, actions: Iterable[Action]) -> None:
        """The lobby acted on its own (a dialogue expired)."""
        now = time.time()
        for action in actions:
            if isinstance(action, Send):
                frame = orjson.loads(action.frame)
                if frame.get("message_type") in _NOTICES:
                    self._record(summarize(frame, now))

    def _record(self, summary: Summary) -> None:
        self.rings.add(summary)
        self._broadcast({"event": "message", "message": summary})

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What the dashboard lists: agents, open conversations and dialogues, transactions,
        and the counts its message-rate chart is drawn from."""
        server = self._server
        router = server.router
        agents = router.registry.agents
        counters = router.counters
        dialogues = router.negotiations.open
        conversations = router.requests.open
        transactions = router.ledger.transactions
        return {
            "at": time.time(),
            "connections": server.connections,
            "routed": sum(counters.by_type().values()),
            "refused": sum(counters.refused.values()),
            "agents_total": len(agents),
            "agents": [
                {
                    "agent_id": agent.agent_id,
                    "online": agent.session is not None,
                    "capabilities": list(agent.capabilities),
                }
                for agent in list(agents.values())[:LISTED]
            ],
            "dialogues_open": len(dialogues),
            "dialogues": [
                {
                    "dialogue_id": d.dialogue_id,
                    "initiator": d.initiator,
                    "responder": d.responder,
                    "state": d.state.name,
                    "moves": d.moves,
                }
                for d in list(dialogues.values())[:LISTED]
            ],
            "conversations_open": len(conversations),
            "conversations": [
                {"requester": r, "responder": s, "conversation_id": c, "waiting": n}
                for (r, s, c), n in list(conversations.items())[:LISTED]
            ],
            "transactions_total": len(transactions),
            "transactions": redact(transactions[-LISTED:]),
        }

    def _tick(self) -> None:
        if not self.sessions:
            self._ticker = None
            return
        self._broadcast({"event": "state", **self.state()})
        self._ticker = asyncio.get_running_loop().call_later(STATE_INTERVAL, self._tick)

    def close(self) -> None:
        """The lobby stops."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _broadcast(self, event: dict[str, Any]) -> None:
        frame = orjson.dumps(event)
        for session in self.sessions:
            self._server.send(session, frame)

    def _send(self, session: Session, event: dict[str, Any]) -> None:
        self._server.send(session, orjson.dumps(event))


__all__ = ["KEYS", "RING_KEYS", "RING_MESSAGES", "SECRET_KEYS", "Observers", "Rings", "redact"]
