"""REQUEST and RESPONSE: authorization by capability, and the open conversations.

A REQUEST is forwarded only to a capability its receiver declares, only for a requester that
capability authorizes, and only with arguments its input schema accepts; it then opens
(requester, responder, conversation_id). A RESPONSE is forwarded only to the requester of such
an open conversation, and a final one (any status but `in_progress`) closes it. Refused REQUESTs
get the seed's error RESPONSE; refused RESPONSEs an ERROR. An `in_progress` RESPONSE carrying
`input_required` leaves the conversation waiting for the requester's INPUT (multiturn.py).
This is the hot path: dict lookups, one `deliver`, and a schema check only for a capability that
declares a schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from lobby.core.deadlines import Deadlines
from lobby.core.multiturn import WAITING, Turns, asks_for_input
from lobby.core.records import Effect, Snapshot
from lobby.core.refusal import Refusal, unknown_receiver
from lobby.core.session import Action, AgentRecord, Send, Session
from lobby.core.state import LobbyState
from protocol.limits import clip
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType, ResponseStatus
from protocol.payloads import Capability

log = structlog.get_logger("lobby")

ConversationKey = tuple[str, str, str]
"""(requester, responder, conversation_id) of an open REQUEST."""


class Conversations:
    """Owns the open conversations (REQUESTs waiting for a final RESPONSE) and the rule that
    opens and closes them; handles REQUEST and RESPONSE."""

    def __init__(self, state: LobbyState) -> None:
        self.state = state
        self.open: dict[ConversationKey, int] = {}
        """Open conversations -> how many REQUESTs in each wait for a final RESPONSE."""
        self.traces: dict[ConversationKey, str] = {}
        """Open conversations whose REQUEST carried a traceparent -> it: a RESPONSE sent
        without one is put in its REQUEST's trace. Not kept across a restart."""
        self.to_capability: Callable[[Session, AgentRecord, Message], list[Action]] | None = None
        """Handles a REQUEST addressed to the lobby, naming a capability instead of an agent
        (`lobby.core.addressed.Addressing.request`, set by the router)."""
        self.addressed: dict[ConversationKey, Any] = {}
        """Open conversations of capability-addressed REQUESTs (`Addressing.pending`, the same
        dict): their final RESPONSE forgets the oldest such REQUEST here, and tells `answered`
        only when later ones wait in `addressed_later` (rare)."""
        self.addressed_later: dict[ConversationKey, Any] = {}
        """`Addressing.queued`, the same dict."""
        self.answered: Callable[[ConversationKey, Any], None] = _nothing
        self.sole_provider: Callable[[AgentRecord, Message, str], AgentRecord | None] = _nothing
        """The provider of a capability-addressed REQUEST in the usual case, routed as a direct
        REQUEST to it (`Addressing.sole_provider`); None: `to_capability` chooses."""
        self.given: Callable[[ConversationKey, Message, AgentRecord, list[Action]], None] = _nothing
        """Keeps what a failover of such a REQUEST needs, once given (`Addressing.given`)."""
        self.deadlines = Deadlines(state, self.ended, self.traces)
        """The open REQUESTs one by one: deadlines and CANCEL (lobby/core/deadlines.py)."""
        self._waiting = self.deadlines.open  # its common case, inlined below
        self.turns = Turns(state, self)
        """Which open conversations wait for input (multi-turn); handles INPUT."""

    # The rule, used live and at restore: a REQUEST opens (requester, responder,
    # conversation_id) once more; a final RESPONSE closes it once.

    def _opens(self, key: ConversationKey) -> None:
        self.open[key] = self.open.get(key, 0) + 1

    def _closes(
        self,
        key: ConversationKey,
        count: int,
        responder: AgentRecord | None = None,
        forget: bool = True,
    ) -> None:
        if count > 1:
            self.open[key] = count - 1
        else:
            del self.open[key]
            if self.traces:
                self.traces.pop(key, None)
            if self.turns.waiting:
                self.turns.ended(key)
        if responder is None:
            responder = self.state.registry.agents.get(key[1])
        if responder is not None and responder.serving:
            responder.serving -= 1
        if forget and self.addressed:  # `forget` False: a failover, which forgot it itself
            done = self.addressed.pop(key, None)
            if done is not None and self.addressed_later:
                self.answered(key, done)

    def ended(self, key: ConversationKey) -> None:
        """The lobby ended one REQUEST of `key` (a deadline, a CANCEL): close it once."""
        count = self.open.get(key)
        if count is not None:
            self._closes(key, count)
            requester = self.state.registry.agents.get(key[0])
            if requester is not None:
                requester.open_requests = max(0, requester.open_requests - 1)

    def restore(self, snapshot: Snapshot) -> None:
        """The open conversations after a restart: the snapshot's checkpoint, then the effect
        of each message stored after it (for a receiver still registered); each requester's
        count follows. Call after `Delivery.restore`."""
        self.open = dict(snapshot.conversations)
        agents = self.state.registry.agents
        for row in snapshot.messages:
            cid = row.conversation_id
            if row.row_id <= snapshot.conversations_upto or cid is None:
                continue
            if row.receiver not in agents:
                continue
            if row.effect == Effect.OPENS:
                self._opens((row.sender, row.receiver, cid))
            elif row.effect == Effect.CLOSES:
                key = (row.receiver, row.sender, cid)
                count = self.open.get(key)
                if count is not None:
                    self._closes(key, count)
        for agent in agents.values():
            agent.serving = 0  # counted below, from what is open
        for (requester_id, responder_id, _), count in self.open.items():
            requester = agents.get(requester_id)
            if requester is not None:
                requester.open_requests += count
            responder = agents.get(responder_id)
            if responder is not None:
                responder.serving += count
        self.deadlines.restore(snapshot, self.open)
        self.turns.restore(snapshot.state.get(WAITING, ()))

    def request(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """Authorize by capability (and its `authorized_requester_ids`), forward, and open
        the conversation its RESPONSEs will answer."""
        state = self.state
        conversation_id = msg.conversation_id
        if conversation_id is None:
            raise Refusal(ErrorCode.MALFORMED, "a REQUEST needs a conversation_id")
        name = msg.payload.get("capability_name")
        if type(name) is not str:
            raise Refusal(ErrorCode.MALFORMED, "a REQUEST payload needs a string 'capability_name'")
        target = state.registry.agents.get(msg.receiver_id)
        given: dict[str, Any] | None = None  # the arguments of one addressed to the lobby
        if target is None:
            if msg.receiver_id != LOBBY_ID or self.to_capability is None:
                raise Refusal(ErrorCode.UNKNOWN_RECEIVER, unknown_receiver(msg.receiver_id))
            target = self.sole_provider(agent, msg, name)
            if target is None:
                return self.to_capability(session, agent, msg)
            given = msg.payload.get("arguments", {})
            msg.receiver_id = target.agent_id
        entry = target.capabilities.get(name)
        if entry is None:
            return self._deny(
                session,
                msg,
                ErrorCode.CAPABILITY_NOT_FOUND,
                f"Capability '{clip(name)}' not found on agent '{target.agent_id}'.",
            )
        if entry.allowed is not None and agent.agent_id not in entry.allowed:
            log.info(
                "REQUEST_DENIED_AUTHORIZATION",
                requester=agent.agent_id,
                responder=target.agent_id,
                capability=clip(name),
                conversation_id=clip(conversation_id),
            )
            return self._deny(
                session,
                msg,
                ErrorCode.UNAUTHORIZED,
                f"Unauthorized: Agent '{agent.agent_id}' is not authorized to call capability "
                f"'{clip(name)}' on agent '{target.agent_id}'.",
            )
        now = state.clock()
        if state.is_duplicate(msg, session, now):
            return []
        payload = msg.payload
        if given is None:
            nested = _nested_arguments(payload, entry.model) if "arguments" in payload else None
        else:
            nested = given
        flat = payload if nested is None else {"capability_name": name, **nested}
        check = entry.input_check
        if check is not None:
            invalid = check.invalid(flat)
            if invalid is not None:
                reason = invalid.sentence(name, target.agent_id)
                return self._deny(session, msg, ErrorCode.INVALID_INPUT, reason, invalid.path)
        limit = state.limits.max_open_requests
        if limit and agent.open_requests >= limit:
            raise Refusal(
                ErrorCode.LIMIT_EXCEEDED,
                f"agent {agent.agent_id!r} already has {limit} REQUESTs waiting for a final "
                "RESPONSE; this one was not routed",
            )
        if entry.model.arguments_form == "object":
            arguments = nested if nested is not None else _without(payload, "capability_name")
            msg.payload = {"capability_name": name, "arguments": arguments}
        elif nested is not None:
            msg.payload = flat
        timeout_ms = msg.timeout_ms
        if timeout_ms is not None:
            # Forwarded as the lobby's deadline; a REQUEST relayed by another node has it.
            msg.timeout_ms = None
            msg.deadline = int(now * 1000) + timeout_ms
        actions = state.deliver(target, msg, session, Effect.OPENS, now)
        key = (agent.agent_id, target.agent_id, conversation_id)
        self._opens(key)
        if msg.traceparent is not None:
            self.traces[key] = msg.traceparent
        agent.open_requests += 1
        target.serving += 1
        # Kept one by one for CANCEL and deadlines (lobby/core/deadlines.py); the common case,
        # the only REQUEST open in its conversation and without a deadline, is this setdefault.
        one = (target.agent_id, msg.message_id or "", msg.seq, msg.deadline)
        pending = self._waiting.setdefault((agent.agent_id, conversation_id), one)
        if pending is not one or one[3] is not None:
            self.deadlines.opened(agent.agent_id, conversation_id, one, timeout_ms or 0)
        if given is not None:
            self.given(key, msg, target, actions)
        if state.trace:
            log.debug(
                "REQUEST_AUTHORIZED",
                requester=agent.agent_id,
                responder=target.agent_id,
                capability=name,
                conversation_id=conversation_id,
            )
        return actions

    def response(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """Forward a RESPONSE to an open REQUEST of its receiver's; a final one closes it."""
        state = self.state
        status = msg.payload.get("status")
        if type(status) is not str:
            raise Refusal(ErrorCode.MALFORMED, "a RESPONSE payload needs a string 'status'")
        # A RESPONSE without a conversation_id answers none (`""` is an id like any other).
        if msg.conversation_id is None:
            raise _no_open_request(msg, agent)
        key = (msg.receiver_id, agent.agent_id, msg.conversation_id)
        open_requests = self.open.get(key)
        if open_requests is None:
            raise _no_open_request(msg, agent)
        target = state.registry.agents.get(msg.receiver_id)
        if target is None:
            self._closes(key, 1, agent)
            raise Refusal(ErrorCode.UNKNOWN_RECEIVER, unknown_receiver(msg.receiver_id))
        final = status != ResponseStatus.IN_PROGRESS
        asks = "input_required" in msg.payload and asks_for_input(msg.payload, final)
        now = state.clock()
        if state.is_duplicate(msg, session, now):
            return []
        if msg.traceparent is None and self.traces:
            msg.traceparent = self.traces.get(key)
        if target.home is not None and self.addressed and key in self.addressed:
            # A capability-addressed REQUEST from another node: decided here, where it was
            # dispatched; the requester's node only delivers (`lobby.core.addressed`).
            actions = state.delivery.forward(target, msg, session, True)
        else:
            effect = Effect.CLOSES if final else Effect.NONE
            actions = state.deliver(target, msg, session, effect, now)
        if final:
            waiting = self._waiting.pop((key[0], key[2]), None)
            if waiting is not None and (type(waiting) is list or waiting[0] != key[1]):
                self.deadlines.answered(key, waiting, msg.in_reply_to)
            self._closes(key, open_requests, agent)
            target.open_requests = max(0, target.open_requests - 1)
        elif asks:
            self.turns.asked(key)
        return actions

    def _deny(
        self,
        session: Session,
        msg: Message,
        code: ErrorCode,
        reason: str,
        path: str | None = None,
    ) -> list[Action]:
        """The seed's answer to a refused REQUEST: an error RESPONSE in the same conversation
        (with `path`, the JSON Pointer of the failing argument, for `invalid_input`)."""
        self.state.counters.refused[code] += 1
        payload = {"status": ResponseStatus.ERROR, "code": code, "error": reason}
        if path is not None:
            payload["path"] = path
        frame = self.state.from_lobby(
            msg.sender_id,
            MessageType.RESPONSE,
            payload,
            msg.conversation_id,
            msg.message_id,
            traceparent=msg.traceparent,
        )
        return [Send(session, frame)]


def _nothing(*_: object) -> None:
    """What a hook of `lobby.core.addressed` does until the router sets it."""
    return None


def _no_open_request(msg: Message, agent: AgentRecord) -> Refusal:
    """The refusal of a RESPONSE that answers no open REQUEST of its receiver's."""
    conversation = None if msg.conversation_id is None else clip(msg.conversation_id)
    return Refusal(
        ErrorCode.UNKNOWN_CONVERSATION,
        f"no open REQUEST from {msg.receiver_id!r} to {agent.agent_id!r} in conversation "
        f"{conversation!r}",
    )


def _nested_arguments(payload: dict[str, Any], capability: Capability) -> dict[str, Any] | None:
    """The arguments of a REQUEST in the object form, `{"capability_name", "arguments": {}}`;
    None for the flat form. A payload with other fields, an `arguments` that is not an object,
    or a capability whose input schema declares an `arguments` property is the flat form:
    an agent may have an argument of that name."""
    arguments = payload.get("arguments")
    if type(arguments) is not dict or len(payload) != 2:
        return None
    properties = capability.input_schema.get("properties")
    return None if isinstance(properties, dict) and "arguments" in properties else arguments


def _without(payload: dict[str, Any], key: str) -> dict[str, Any]:
    rest = dict(payload)
    rest.pop(key, None)
    return rest
