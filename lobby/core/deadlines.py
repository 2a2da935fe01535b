"""Deadlines and CANCEL: the REQUESTs waiting for a final RESPONSE, one by one, and the lobby's
own ending of one (PROTOCOL.md §5.2).

`Conversations` counts open REQUESTs per (requester, responder, conversation_id); this module
keeps each of them (`OpenRequest`: its message_id, its seq in the responder's mailbox, its
deadline), because ending one needs exactly that: which copy to drop, which REQUEST the
provider's CANCEL and the requester's final RESPONSE name. A REQUEST ends here when its
deadline passes (`expire_due`, from the router's `tick`: a heap ordered by deadline, so a tick
with nothing due looks at one entry) or when its requester sends CANCEL (`cancel`). Ending one
closes its conversation, withdraws the copy still held unwritten for the provider (it never
reaches it), sends the provider CANCEL if it had been given the REQUEST, and answers the
requester with the final RESPONSE `timeout` or `cancelled`; a late RESPONSE is then refused
`unknown_conversation` by `Conversations`.

Durable as the messages are: the REQUEST's stored frame carries its `deadline`, and the lobby's
final RESPONSE is stored with `Effect.ENDS` (its frame names the REQUEST in `in_reply_to`), so
`restore` rebuilds the open REQUESTs and withdraws again the copies ended before a restart.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import orjson
import structlog

from lobby.core.records import Effect, MessageStored, Snapshot
from lobby.core.refusal import Refusal
from lobby.core.session import Action, AgentRecord, Session
from lobby.core.state import LobbyState
from protocol.limits import MAX_REASON_LENGTH, clip
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType, ResponseStatus

log = structlog.get_logger("lobby")

_DEADLINE_FIELD: Final = b'"deadline":'


@dataclass(slots=True, eq=False)
class OpenRequest:
    """One REQUEST forwarded and not yet answered with a final RESPONSE."""

    requester: str
    responder: str
    conversation_id: str
    message_id: str
    seq: int | None
    """Its seq in the responder's mailbox on this node; None when forwarded to another node."""
    deadline: int | None = None
    """Unix time in ms (the lobby's clock) when the requester stops waiting; None: never."""
    timeout_ms: int = 0
    traceparent: str | None = None
    ended: bool = False
    """Answered or ended by the lobby: its heap entry, if any, is skipped when it comes due."""


def _seq(held: tuple[int, bytes]) -> int:
    return held[0]


def withdraw(agent: AgentRecord, seq: int) -> bool:
    """Drop the message `seq` from `agent`'s mailbox; whether the agent may have been given it
    (written to a connection, now or before a restart, or no longer held: written and
    acknowledged). A copy dropped unwritten never reaches the agent."""
    mailbox = agent.mailbox
    at = bisect_left(mailbox, seq, key=_seq)
    if at == len(mailbox) or mailbox[at][0] != seq:
        return True
    frame = mailbox[at][1]
    del mailbox[at]
    if seq <= max(agent.delivered_seq, agent.redeliver_upto):
        return True
    if agent.session is not None and seq > agent.resumed_seq:
        agent.held_bytes -= len(frame)
    return False


class Deadlines:
    """Owns the open REQUESTs one by one and their deadlines; handles CANCEL. `close` is the
    conversations' own rule for closing (requester, responder, conversation_id) once."""

    def __init__(self, state: LobbyState, close: Callable[[tuple[str, str, str]], None]) -> None:
        self.state = state
        self._close = close
        self.open: dict[tuple[str, str], list[OpenRequest]] = {}
        """(requester, conversation_id) -> its REQUESTs in it waiting for a final RESPONSE."""
        self._due: list[tuple[int, int, OpenRequest]] = []
        """A heap of (deadline, order, REQUEST): a tick looks at the earliest only."""
        self._order = itertools.count()

    # -- as REQUESTs open and close (the hot path: a dict lookup and an append) -------------

    def opened(self, msg: Message, requester: str, responder: str, timeout_ms: int) -> None:
        """`msg`, a REQUEST from `requester`, was accepted for `responder` (stamped by
        `deliver`: its message_id, its seq unless forwarded, its deadline if any)."""
        request = OpenRequest(
            requester,
            responder,
            msg.conversation_id,  # type: ignore[arg-type]  # a REQUEST has one
            msg.message_id,  # type: ignore[arg-type]  # set by deliver
            msg.seq,
            msg.deadline,
            timeout_ms,
            msg.traceparent,
        )
        key = (requester, request.conversation_id)
        waiting = self.open.get(key)
        if waiting is None:
            self.open[key] = [request]
        else:
            waiting.append(request)
        if request.deadline is not None:
            heapq.heappush(self._due, (request.deadline, next(self._order), request))

    def answered(
        self, requester: str, responder: str, conversation_id: str, in_reply_to: str | None
    ) -> None:
        """A final RESPONSE from `responder` closed one of `requester`'s REQUESTs: the one its
        `in_reply_to` names, else the oldest."""
        key = (requester, conversation_id)
        waiting = self.open.get(key)
        if waiting is None:
            return
        chosen = None
        for request in waiting:
            if request.responder == responder:
                if chosen is None:
                    chosen = request
                if request.message_id == in_reply_to:
                    chosen = request
                    break
        if chosen is not None:
            chosen.ended = True
            waiting.remove(chosen)
            if not waiting:
                del self.open[key]

    # -- the lobby ends them ---------------------------------------------------------------

    def expire_due(self, now: float) -> list[Action]:
        """End the REQUESTs whose deadline passed: `timeout`."""
        due = self._due
        now_ms = int(now * 1000)
        actions: list[Action] = []
        while due and due[0][0] <= now_ms:
            request = heapq.heappop(due)[2]
            if request.ended:
                continue
            sentence = (
                f"no final RESPONSE to REQUEST {clip(request.message_id)!r} within "
                f"{request.timeout_ms} ms"
            )
            actions += self._end(request, ErrorCode.TIMEOUT, "deadline", sentence, now)
        return actions

    def cancel(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """CANCEL: end every open REQUEST of the sender's in the conversation: `cancelled`."""
        if msg.receiver_id != LOBBY_ID:
            raise Refusal(ErrorCode.MALFORMED, f"CANCEL is addressed to {LOBBY_ID}")
        conversation_id = msg.conversation_id
        if conversation_id is None:
            raise Refusal(ErrorCode.MALFORMED, "a CANCEL needs a conversation_id")
        reason = msg.payload.get("reason")
        if reason is not None and (type(reason) is not str or len(reason) > MAX_REASON_LENGTH):
            raise Refusal(
                ErrorCode.MALFORMED,
                f"a CANCEL's 'reason' is a string of at most {MAX_REASON_LENGTH} characters",
            )
        waiting = self.open.get((agent.agent_id, conversation_id))
        if not waiting:
            raise Refusal(
                ErrorCode.UNKNOWN_CONVERSATION,
                f"no open REQUEST from {agent.agent_id!r} in conversation "
                f"{clip(conversation_id)!r}",
            )
        now = self.state.clock()
        actions: list[Action] = []
        cancelled = list(waiting)
        agents = self.state.registry.agents
        homes: set[str] = set()
        for request in cancelled:
            provider = agents.get(request.responder)
            if provider is not None and provider.home is not None and provider.home not in homes:
                # Cluster: the provider's home ends its side (its copy, its CANCEL) when it
                # routes this CANCEL as its own; this node answers the requester.
                homes.add(provider.home)
                relayed = Message(
                    msg.sender_id,
                    LOBBY_ID,
                    MessageType.CANCEL,
                    msg.payload,
                    conversation_id,
                    traceparent=msg.traceparent,
                )
                self.state.delivery.forward(provider, relayed, session)
        for request in cancelled:
            sentence = (
                f"REQUEST {clip(request.message_id)!r} was cancelled by {agent.agent_id!r}"
                + (f": {clip(reason)}" if reason else "")
            )
            actions += self._end(request, ErrorCode.CANCELLED, reason or "cancelled", sentence, now)
        log.info(
            "REQUEST_CANCELLED",
            requester=agent.agent_id,
            conversation_id=clip(conversation_id),
            requests=len(cancelled),
        )
        return actions

    def _end(
        self, request: OpenRequest, code: ErrorCode, reason: str, sentence: str, now: float
    ) -> list[Action]:
        """Close `request`'s conversation; withdraw its held copy, or CANCEL it at the provider
        if it had been given it; answer the requester with the final RESPONSE `code`. In a
        cluster each node does its own agents' side (both nodes track a REQUEST between them):
        the requester's CANCEL is routed again by the provider's home (`cancel`), and a deadline
        passes there too."""
        request.ended = True
        key = (request.requester, request.conversation_id)
        waiting = self.open.get(key)
        if waiting is not None and request in waiting:
            waiting.remove(request)
            if not waiting:
                del self.open[key]
        self._close((request.requester, request.responder, request.conversation_id))
        state = self.state
        agents = state.registry.agents
        actions: list[Action] = []
        provider = agents.get(request.responder)
        if provider is not None and provider.home is None:
            given = True
            if request.seq is not None:
                given = withdraw(provider, request.seq)
            if given:
                notice = Message(
                    LOBBY_ID,
                    provider.agent_id,
                    MessageType.CANCEL,
                    {"requester_id": request.requester, "reason": reason},
                    request.conversation_id,
                    in_reply_to=request.message_id,
                    traceparent=request.traceparent,
                )
                actions += state.deliver(provider, notice, None, Effect.NONE, now, force=True)
        requester = agents.get(request.requester)
        if requester is not None and requester.home is None:
            answer = Message(
                LOBBY_ID,
                requester.agent_id,
                MessageType.RESPONSE,
                {"status": ResponseStatus.ERROR, "code": code, "error": sentence},
                request.conversation_id,
                in_reply_to=request.message_id,
                traceparent=request.traceparent,
            )
            actions += state.deliver(requester, answer, None, Effect.ENDS, now, force=True)
        state.counters.refused[code] += 1
        return actions

    # -- a restart -------------------------------------------------------------------------

    def restore(self, snapshot: Snapshot, still_open: dict[tuple[str, str, str], int]) -> None:
        """After `Conversations.restore` (whose open conversations are `still_open`) and
        `Delivery.restore`: close the REQUESTs the lobby ended after the checkpoint, withdraw
        again the copies they left in mailboxes, and rebuild the open REQUESTs (the newest of
        each open conversation) with their deadlines, read from their stored frames."""
        agents = self.state.registry.agents
        requests: dict[tuple[str, str], MessageStored] = {}
        for row in snapshot.messages:
            if row.effect == Effect.OPENS:
                requests[(row.sender, row.message_id)] = row
        ended: set[tuple[str, str]] = set()
        for row in snapshot.messages:
            if row.effect != Effect.ENDS or row.frame[:1] != b"{":
                continue
            in_reply_to = orjson.loads(row.frame).get("in_reply_to")
            opened = requests.get((row.receiver, in_reply_to))
            if opened is None or opened.conversation_id is None:
                continue
            ended.add((opened.sender, opened.message_id))
            if row.row_id > snapshot.conversations_upto and opened.receiver in agents:
                self._close((opened.sender, opened.receiver, opened.conversation_id))
            provider = agents.get(opened.receiver)
            if provider is not None:
                withdraw(provider, opened.seq)
        newest: dict[tuple[str, str, str], list[MessageStored]] = {}
        for row in requests.values():
            key = (row.sender, row.receiver, row.conversation_id or "")
            if key in still_open and (row.sender, row.message_id) not in ended:
                newest.setdefault(key, []).append(row)
        for key, rows in newest.items():
            for row in rows[-still_open[key] :]:
                deadline = None
                if _DEADLINE_FIELD in row.frame:
                    deadline = orjson.loads(row.frame).get("deadline")
                request = OpenRequest(
                    row.sender,
                    row.receiver,
                    key[2],
                    row.message_id,
                    row.seq,
                    deadline,
                    0 if deadline is None else deadline - int(row.at * 1000),
                )
                self.open.setdefault((row.sender, key[2]), []).append(request)
                if deadline is not None:
                    heapq.heappush(self._due, (deadline, next(self._order), request))
