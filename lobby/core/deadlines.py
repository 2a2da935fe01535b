"""Deadlines and CANCEL: the REQUESTs waiting for a final RESPONSE, one by one, and the lobby's
own ending of one (PROTOCOL.md §5.2).

`Conversations` counts open REQUESTs per (requester, responder, conversation_id); this module
keeps each of them (`Waiting`: its responder, message_id, seq in the responder's mailbox and
deadline) by (requester, conversation_id), which is what a CANCEL names, because ending one
needs exactly that: which copy to drop, which REQUEST the provider's CANCEL and the
requester's final RESPONSE name. The common case (one REQUEST open in its conversation, no
deadline) is opened and closed by `Conversations` itself, one dict operation each.

A REQUEST ends here when its deadline passes (`expire_due`, from the router's `tick`: a heap
ordered by deadline, so a tick with nothing due looks at one entry) or when its requester sends
CANCEL (`cancel`). Ending one closes its conversation, withdraws the copy still held unwritten
for the provider (it never reaches it), sends the provider CANCEL if it had been given the
REQUEST, and answers the requester with the final RESPONSE `timeout` or `cancelled`; a late
RESPONSE is then refused `unknown_conversation` by `Conversations`.

Durable as the messages are: the REQUEST's stored frame carries its `deadline`, and the lobby's
final RESPONSE is stored with `Effect.ENDS` (its frame names the REQUEST in `in_reply_to`), so
`restore` rebuilds the open REQUESTs and withdraws again the copies ended before a restart.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable
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


Waiting = tuple[str, str, int | None, int | None]
"""One REQUEST forwarded and not yet answered with a final RESPONSE: (responder, its
message_id, its seq in the responder's mailbox on this node (None: forwarded to another node),
its deadline (Unix ms, the lobby's clock; None: none)). A tuple: one is made per REQUEST."""

Due = tuple[int, str, str, str, int]
"""A deadline in the heap: (deadline, requester, conversation_id, message_id, timeout_ms)."""


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
    conversations' own rule for closing (requester, responder, conversation_id) once; `traces`
    their traceparents, which the lobby's CANCEL and final RESPONSE join."""

    def __init__(
        self,
        state: LobbyState,
        close: Callable[[tuple[str, str, str]], None],
        traces: dict[tuple[str, str, str], str],
    ) -> None:
        self.state = state
        self._close = close
        self._traces = traces
        self.open: dict[tuple[str, str], Waiting | list[Waiting]] = {}
        """(requester, conversation_id) -> its REQUEST in it waiting for a final RESPONSE, or
        a list of them when there are several (rare: a list is made only then)."""
        self._due: list[Due] = []
        """A heap of deadlines: a tick looks at the earliest only. An entry whose REQUEST was
        answered meanwhile is dropped when it comes due."""
        self.elsewhere: set[tuple[str, str, str]] = set()
        """Cluster only: (requester, conversation_id, message_id) of the capability-addressed
        REQUESTs in `open` that went to another node to be decided there (`passed_on`)."""

    # -- as REQUESTs open and close. The common case, one REQUEST open in a conversation,
    # is `Conversations`' own (one `setdefault` as it opens, one `pop` as it closes); these
    # take the rest: several open at once, a deadline.

    def opened(self, requester: str, conversation_id: str, entry: Waiting, timeout_ms: int) -> None:
        """`entry`, a REQUEST from `requester` in `conversation_id`, was accepted, and either
        another is open in the conversation (`open` holds that one, not `entry`) or it has a
        deadline."""
        key = (requester, conversation_id)
        waiting = self.open[key]
        if waiting is not entry:  # another REQUEST in the conversation is open
            if type(waiting) is list:
                waiting.append(entry)
            else:
                self.open[key] = [waiting, entry]  # type: ignore[list-item]
        deadline = entry[3]
        if deadline is not None:
            heapq.heappush(self._due, (deadline, requester, conversation_id, entry[1], timeout_ms))

    def answered(
        self,
        conversation: tuple[str, str, str],
        waiting: Waiting | list[Waiting],
        in_reply_to: str | None,
    ) -> None:
        """A final RESPONSE in `conversation` (requester, responder, conversation_id) closed
        one of its REQUESTs; `waiting` is what `open` held for (requester, conversation_id),
        taken out of it: what stays open goes back. The REQUEST closed is the one the
        RESPONSE's `in_reply_to` names, else the responder's oldest."""
        requester, responder, conversation_id = conversation
        key = (requester, conversation_id)
        if type(waiting) is not list:
            if waiting[0] != responder:
                self.open[key] = waiting  # another provider's
            return
        chosen = None
        for entry in waiting:
            if entry[0] == responder:
                if chosen is None:
                    chosen = entry
                if entry[1] == in_reply_to:
                    chosen = entry
                    break
        if chosen is not None:
            waiting.remove(chosen)
        self._keep(key, waiting)

    def withdrawn(self, conversation: tuple[str, str, str], message_id: str) -> None:
        """The REQUEST `message_id` in `conversation` (requester, responder, conversation_id)
        was taken back from its responder unanswered (a failover): no longer its to end. Its
        deadline stays in the heap for the copy given to the next provider."""
        requester, _, conversation_id = conversation
        waiting = self.open.pop((requester, conversation_id), None)
        if waiting is not None:
            self.answered(conversation, waiting, message_id)

    def waiting(self, requester: str, conversation_id: str) -> list[Waiting]:
        """`requester`'s REQUESTs open in `conversation_id` (a copy of the list)."""
        waiting = self.open.get((requester, conversation_id))
        if waiting is None:
            return []
        return list(waiting) if type(waiting) is list else [waiting]  # type: ignore[list-item]

    # -- decided on another node (a cluster's capability-addressed REQUEST) ------------------

    def passed_on(self, requester: str, provider: str, msg: Message) -> None:
        """A capability-addressed REQUEST `msg` of `requester`'s, homed here, was forwarded
        (its message_id named, its `timeout_ms` still on it) to the node of `provider` (an
        agent of another node), which chooses, dispatches and answers it. Kept open here as
        well, as a direct REQUEST to `provider` is: the requester's CANCEL goes on to that
        node and is answered here (`cancel`), so is its deadline (`expire_due`), and its INPUT
        goes on to the provider's node (`Turns.input`), until the final RESPONSE that node
        decided arrives (`settled_elsewhere`)."""
        conversation_id: str = msg.conversation_id  # type: ignore[assignment]  # checked
        message_id: str = msg.message_id  # type: ignore[assignment]  # named by `forward`
        timeout_ms = msg.timeout_ms
        deadline = None
        if timeout_ms is not None:
            deadline = int(self.state.clock() * 1000) + timeout_ms
        entry = (provider, message_id, None, deadline)
        if self.open.setdefault((requester, conversation_id), entry) is not entry or deadline:
            self.opened(requester, conversation_id, entry, timeout_ms or 0)
        self.elsewhere.add((requester, conversation_id, message_id))

    def settled_elsewhere(
        self, requester: str, conversation_id: str, message_id: str | None, *, exact: bool
    ) -> None:
        """A REQUEST `passed_on` is no longer the other node's: its final RESPONSE arrived
        (`message_id` its `in_reply_to`, else the oldest such REQUEST in the conversation), or
        that node gave it back here in a failover (`exact`: the REQUEST `message_id`; its
        deadline stays in the heap for the copy dispatched here, with the same message_id)."""
        elsewhere = self.elsewhere
        mine = [
            e
            for e in self.waiting(requester, conversation_id)
            if (requester, conversation_id, e[1]) in elsewhere
        ]
        entry = next((e for e in mine if e[1] == message_id), None)
        if entry is None and mine and not exact:
            entry = mine[0]
        if entry is not None:
            elsewhere.discard((requester, conversation_id, entry[1]))
            self._remove(requester, conversation_id, entry)

    def taken_back(self, requester: str, msg: Message) -> None:
        """The REQUEST `msg` of `requester`'s, homed here, came back redelivered from the node
        it was passed on to (a failover there): no longer that node's (if it was)."""
        if self.elsewhere and msg.conversation_id is not None:
            self.settled_elsewhere(requester, msg.conversation_id, msg.message_id, exact=True)

    def decided_elsewhere(self, requester: str, conversation_id: str) -> bool:
        """Whether `requester` has a REQUEST open in `conversation_id` that another node
        decides (`passed_on`)."""
        return any(
            (requester, conversation_id, e[1]) in self.elsewhere
            for e in self.waiting(requester, conversation_id)
        )

    # -- the lobby ends them ---------------------------------------------------------------

    def expire_due(self, now: float) -> list[Action]:
        """End the REQUESTs whose deadline passed: `timeout`."""
        due = self._due
        now_ms = int(now * 1000)
        actions: list[Action] = []
        while due and due[0][0] <= now_ms:
            _, requester, conversation_id, message_id, timeout_ms = heapq.heappop(due)
            waiting = self.waiting(requester, conversation_id)
            entry = next((e for e in waiting if e[1] == message_id), None)
            if entry is None:
                continue  # answered, or cancelled
            sentence = f"no final RESPONSE to REQUEST {clip(message_id)!r} within {timeout_ms} ms"
            actions += self._end(
                requester, conversation_id, entry, ErrorCode.TIMEOUT, "deadline", sentence, now
            )
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
        requester = agent.agent_id
        waiting = self.waiting(requester, conversation_id)
        if not waiting:
            raise Refusal(
                ErrorCode.UNKNOWN_CONVERSATION,
                f"no open REQUEST from {requester!r} in conversation {clip(conversation_id)!r}",
            )
        now = self.state.clock()
        actions: list[Action] = []
        cancelled = list(waiting)
        agents = self.state.registry.agents
        homes: set[str] = set()
        for responder, *_ in cancelled:
            provider = agents.get(responder)
            if provider is not None and provider.home is not None and provider.home not in homes:
                # Cluster: the provider's home ends its side (its copy, its CANCEL) when it
                # routes this CANCEL as its own; this node answers the requester.
                homes.add(provider.home)
                relayed = Message(
                    requester,
                    LOBBY_ID,
                    MessageType.CANCEL,
                    msg.payload,
                    conversation_id,
                    traceparent=msg.traceparent,
                )
                self.state.delivery.forward(provider, relayed, session)
        for entry in cancelled:
            sentence = f"REQUEST {clip(entry[1])!r} was cancelled by {requester!r}" + (
                f": {clip(reason)}" if reason else ""
            )
            actions += self._end(
                requester,
                conversation_id,
                entry,
                ErrorCode.CANCELLED,
                reason or "cancelled",
                sentence,
                now,
            )
        log.info(
            "REQUEST_CANCELLED",
            requester=requester,
            conversation_id=clip(conversation_id),
            requests=len(cancelled),
        )
        return actions

    def _end(
        self,
        requester_id: str,
        conversation_id: str,
        entry: Waiting,
        code: ErrorCode,
        reason: str,
        sentence: str,
        now: float,
    ) -> list[Action]:
        """Close `entry`'s conversation; withdraw its held copy, or CANCEL it at the provider
        if it had been given it; answer the requester with the final RESPONSE `code`. In a
        cluster each node does its own agents' side (both nodes track a REQUEST between them):
        the requester's CANCEL is routed again by the provider's home (`cancel`), and a deadline
        passes there too."""
        responder, message_id, seq, _ = entry
        self._remove(requester_id, conversation_id, entry)
        if self.elsewhere:
            self.elsewhere.discard((requester_id, conversation_id, message_id))
        conversation = (requester_id, responder, conversation_id)
        traceparent = self._traces.get(conversation) if self._traces else None
        self._close(conversation)
        state = self.state
        agents = state.registry.agents
        actions: list[Action] = []
        provider = agents.get(responder)
        # A provider given the REQUEST is told to stop; a copy never given is just dropped.
        if (
            provider is not None
            and provider.home is None
            and (seq is None or withdraw(provider, seq))
        ):
            notice = Message(
                LOBBY_ID,
                responder,
                MessageType.CANCEL,
                {"requester_id": requester_id, "reason": reason},
                conversation_id,
                in_reply_to=message_id,
                traceparent=traceparent,
            )
            actions += state.deliver(provider, notice, None, Effect.NONE, now, force=True)
        requester = agents.get(requester_id)
        if requester is not None and requester.home is None:
            answer = Message(
                LOBBY_ID,
                requester_id,
                MessageType.RESPONSE,
                {"status": ResponseStatus.ERROR, "code": code, "error": sentence},
                conversation_id,
                in_reply_to=message_id,
                traceparent=traceparent,
            )
            actions += state.deliver(requester, answer, None, Effect.ENDS, now, force=True)
        state.counters.refused[code] += 1
        return actions

    def _remove(self, requester: str, conversation_id: str, entry: Waiting) -> None:
        waiting = self.waiting(requester, conversation_id)
        waiting.remove(entry)
        self._keep((requester, conversation_id), waiting)

    def _keep(self, key: tuple[str, str], waiting: list[Waiting]) -> None:
        """`waiting` as what `open` holds for `key`: nothing, the one, or the list."""
        if not waiting:
            self.open.pop(key, None)
        else:
            self.open[key] = waiting if len(waiting) > 1 else waiting[0]

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
        for (requester, responder, conversation_id), rows in newest.items():
            for row in rows[-still_open[(requester, responder, conversation_id)] :]:
                deadline = None
                if _DEADLINE_FIELD in row.frame:
                    deadline = orjson.loads(row.frame).get("deadline")
                entry = (responder, row.message_id, row.seq, deadline)
                waiting = [*self.waiting(requester, conversation_id), entry]
                self._keep((requester, conversation_id), waiting)
                if deadline is not None:
                    timeout_ms = deadline - int(row.at * 1000)
                    due = (deadline, requester, conversation_id, row.message_id, timeout_ms)
                    heapq.heappush(self._due, due)
