"""Capability-addressed REQUESTs: the lobby chooses the provider, and fails over to another.

A REQUEST to `global_lobby` names a capability, not an agent:
`{"capability_name": "quote", "arguments": {...}, "filters": [...]}`. Its candidates are the
agents online now that offer the capability, match the filters (DISCOVER's, over capability
attributes), authorize the requester and are not the requester; the lobby gives it to the one
serving the fewest REQUESTs (`AgentRecord.serving`), ties in turn per capability, passing over a
candidate whose input schema refuses the arguments (each distinct schema is checked once per
REQUEST: `Addressed.verdicts`). From there it is a direct REQUEST to that provider: the same
conversation (requester, provider, conversation_id), its RESPONSEs forwarded as they are.

What the lobby keeps per such REQUEST (`Addressed`, `lobby.core.addressed_parts`) lets it fail
over: when the provider's connection closes before its final RESPONSE (`provider_gone`; not when
it moves with what it holds: 4001, its own newer connection, 1012/1013 to another node, or the
lobby stopping, `paused`), the lobby closes that conversation, drops the copy it holds for the
provider, and gives the REQUEST (same message_id, `redelivered`) to another candidate never
tried for it, or answers the requester with the final RESPONSE `no_provider`. A late RESPONSE of
the old provider finds no open conversation (`unknown_conversation`). The dropped copy is still
in the store: a `dropped_request` state record keeps a restart from giving it back (`restore`).
The rest is in memory only: after a restart a REQUEST given to a provider stays with it, as a
direct one would.

On a cluster, candidates are this node's connections first; with none, the REQUEST goes on,
still addressed to the lobby, to the node of a provider connected elsewhere (online there as
the cluster's presence says, first: `choose_elsewhere`), which chooses among its own, fails
over and answers there; its RESPONSEs reach the requester's node decided, which keeps it open
too, for CANCEL, deadline and INPUT (`Deadlines.passed_on`). A failover with nobody left on its
node passes the REQUEST on the same way, redelivered. A node that received one never passes it
on again itself (one hop), except by a failover of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson
import structlog

from lobby.core.addressed_parts import (
    Addressed,
    Candidate,
    Given,
    Ranked,
    choose_elsewhere,
    drop_held,
    given_frame,
    mark_redelivered,
    no_candidate,
    parse_payload,
    rank,
    scan,
    verdict,
)
from lobby.core.conversations import ConversationKey, Conversations
from lobby.core.discovery.filters import Filter
from lobby.core.records import Effect, Snapshot, StateRemoved, StateSaved
from lobby.core.refusal import Refusal
from lobby.core.session import Action, AgentRecord, Session
from lobby.core.state import LobbyState
from protocol.codec import encode
from protocol.limits import clip
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType, ResponseStatus

log = structlog.get_logger("lobby")

DROPPED: Final = "dropped_request"
"""The kind of state saved for each copy of a REQUEST failed over that is still stored: the
provider it was held for, its seq, and where its conversation was closed (`Addressing.restore`)."""


class Addressing:
    """Owns the capability-addressed REQUESTs in flight (`pending`, by conversation) and the
    turn of each capability; chooses, dispatches and re-dispatches them through the shared
    state and the conversations."""

    def __init__(self, state: LobbyState, conversations: Conversations) -> None:
        self.state = state
        self.conversations = conversations
        self.pending: dict[ConversationKey, Addressed | Given] = {}
        """Open conversations of addressed REQUESTs -> the oldest such REQUEST in each. A
        provider's are found by a walk of it when it goes (rare), which saves an index per
        REQUEST on the hot path."""
        self.queued: dict[ConversationKey, list[Addressed | Given]] = {}
        """The later ones, when a requester has several in one conversation with one provider
        (rare), oldest first: each moves up into `pending` as the one before it is answered."""
        self.last: dict[str, str] = {}
        """Capability -> the provider chosen last: ties go to the next one in turn."""
        self.paused = False
        """The lobby is stopping: connections closing now keep what they hold (a direct
        REQUEST would), for after the restart, instead of failing over (`LobbyServer.stop`)."""
        conversations.to_capability = self.request
        conversations.addressed = self.pending
        conversations.addressed_later = self.queued
        conversations.answered = self.answered
        conversations.sole_provider = self.sole_provider
        conversations.given = self.given

    # -- a new REQUEST ----------------------------------------------------------------------

    def request(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """A REQUEST to `global_lobby` (its conversation_id and capability_name checked):
        check the payload, choose a provider, dispatch; or answer with the lobby's RESPONSE."""
        state = self.state
        payload = msg.payload
        here = agent.session is session  # else relayed by the requester's node (a cluster's)
        redelivered = msg.redelivered and not here
        name: str = payload["capability_name"]
        arguments = payload.get("arguments")
        filters: Sequence[Filter] = ()
        if len(payload) != 2 or type(arguments) is not dict:  # not just the two usual fields
            arguments, filters = parse_payload(payload)
        now = state.clock()
        if state.is_duplicate(msg, session, now):
            return []
        if redelivered and agent.home is None:  # passed on from here, given back by a failover
            self.conversations.deadlines.taken_back(agent.agent_id, msg)
        limit = state.limits.max_open_requests
        if limit and agent.open_requests >= limit:
            raise Refusal(
                ErrorCode.LIMIT_EXCEEDED,
                f"agent {agent.agent_id!r} already has {limit} REQUESTs waiting for a final "
                "RESPONSE; this one was not routed",
            )
        requester = agent.agent_id
        pending = Addressed(
            requester,
            msg.conversation_id,  # type: ignore[arg-type]  # checked by the caller
            msg.message_id or "",
            name,
            arguments,
            filters,
            msg.traceparent,
        )
        chosen = self._choose(pending)
        if chosen is None:
            if here and state.shared is not None:
                away = choose_elsewhere(
                    state.registry.providers, self.last, pending, state.presence.elsewhere
                )
                if away is not None:
                    return self._pass_on(pending, away, msg, session)
            if not here:  # the requester is on another node: answered there, and stored
                return self._no_provider(pending, agent, now, failed_over=bool(redelivered))
            code, reason, path = no_candidate(pending, failed_over=False)
            return self.conversations._deny(session, msg, code, reason, path)
        actions = self._dispatch(pending, chosen, msg, session, now)
        if redelivered:
            actions = mark_redelivered(chosen[0], msg.seq, actions)
        agent.open_requests += 1
        return actions

    def sole_provider(self, requester: AgentRecord, msg: Message, name: str) -> AgentRecord | None:
        """The usual case, routed by `Conversations.request` as a direct REQUEST to the one
        provider: the capability has one, online here, that admits the requester and checks
        no input schema, and the REQUEST has just its arguments (if any), no deadline, and is not
        redelivered. What failover needs is then kept in a tuple (`given`). None: `request`
        chooses (it says why nobody may take it)."""
        payload = msg.payload
        if len(payload) != 1 and (len(payload) != 2 or type(payload.get("arguments")) is not dict):
            return None  # filters, or something `request` refuses
        offering = self.state.registry.providers.get(name)
        if offering is None or len(offering) != 1 or msg.timeout_ms is not None or msg.redelivered:
            return None
        (record,) = offering.values()
        entry = record.capabilities[name]
        if (
            record.session is None
            or record.agent_id == requester.agent_id
            or entry.input_check is not None
            or (entry.allowed is not None and requester.agent_id not in entry.allowed)
        ):
            return None
        return record

    def given(
        self, key: ConversationKey, msg: Message, target: AgentRecord, actions: list[Action]
    ) -> None:
        """`msg`, to the lobby, was given to its sole provider `target` (`sole_provider`) in
        `actions`: what a failover needs is kept until its final RESPONSE (`Given`)."""
        name = msg.payload["capability_name"]
        self.last[name] = target.agent_id
        object_form = target.capabilities[name].model.arguments_form == "object"
        frame = given_frame(target, actions)
        brief = (msg.message_id or "", name, frame, object_form, msg.traceparent, msg.seq)
        if self.pending.setdefault(key, brief) is not brief:
            self.queued.setdefault(key, []).append(brief)

    # -- choosing ---------------------------------------------------------------------------

    def _choose(self, pending: Addressed) -> Candidate | None:
        """The candidate to give `pending` to: not yet tried, the least served, then the next
        in turn after the last chosen (it last); passing over those whose input schema refuses
        the arguments (the first refusal is kept in `pending`). None when none is left."""
        name = pending.capability
        offering = self.state.registry.providers.get(name)
        if not offering:
            return None
        best = scan(offering, self.last.get(name), pending, None)
        if best is None or best[1].input_check is None or verdict(pending, best[1]) is None:
            return best  # the usual case: one pass
        ranked: list[Ranked] = []
        scan(offering, self.last.get(name), pending, ranked)
        ranked.sort(key=rank)
        for _, candidate in ranked:
            invalid = verdict(pending, candidate[1])
            if invalid is None:
                return candidate
            if pending.refusal is None:
                pending.refusal, pending.refused_by = invalid, candidate[0].agent_id
        return None

    # -- other nodes ------------------------------------------------------------------------

    def _pass_on(
        self, pending: Addressed, away: AgentRecord, msg: Message | None, sender: Session | None
    ) -> list[Action]:
        """Forward `pending` to the node `away` is connected to, still addressed to the lobby:
        that node chooses, dispatches, fails over among its agents and answers (its RESPONSEs
        reach the requester decided, `Conversations.response`). `msg` None: a failover here
        passes on the REQUEST it had dispatched, marked redelivered."""
        self.last[pending.capability] = away.agent_id
        if msg is None:
            payload: dict[str, Any] = {
                "capability_name": pending.capability,
                "arguments": pending.arguments,
            }
            if pending.filters:
                payload["filters"] = [f.serialize() for f in pending.filters]
            msg = Message(
                pending.requester,
                LOBBY_ID,
                MessageType.REQUEST,
                payload,
                pending.conversation_id,
                message_id=pending.message_id,
                redelivered=True,
                traceparent=pending.traceparent,
                timeout_ms=pending.left_ms(self.state.clock()),  # the deadline goes with it
            )
        delivery = self.state.delivery
        home: str = away.home  # type: ignore[assignment]  # not None: a candidate elsewhere
        if sender is not None:  # from its requester, connected here: kept open here too
            actions = delivery.forward(away, msg, sender)
            self.conversations.deadlines.passed_on(pending.requester, away.agent_id, msg)
            return actions
        # Not decided here: the node it goes to routes it as its requester's own.
        msg.auth_token = None
        delivery.forwards.append(
            (home, away.agent_id, pending.requester, pending.message_id, encode(msg), False)
        )
        return []

    # -- dispatching ------------------------------------------------------------------------

    def _dispatch(
        self,
        pending: Addressed,
        chosen: Candidate,
        msg: Message,
        sender: Session | None,
        now: float,
    ) -> list[Action]:
        """Give `msg` (the REQUEST, any payload) to the chosen provider, as a direct REQUEST
        to it: in its capability's arguments form, opening (requester, provider, conversation).
        `sender` None: a re-dispatch (nothing to confirm; marked redelivered)."""
        target, entry = chosen
        name, provider = pending.capability, target.agent_id
        msg.receiver_id = provider
        timeout_ms = msg.timeout_ms
        if timeout_ms is not None:  # the first dispatch: forwarded as the lobby's deadline
            msg.timeout_ms = None
            pending.deadline = int(now * 1000) + timeout_ms
            pending.timeout_ms = timeout_ms
        deadline = msg.deadline = pending.deadline
        if entry.model.arguments_form == "object":
            msg.payload = {"capability_name": name, "arguments": pending.arguments}
        else:
            msg.payload = {"capability_name": name, **pending.arguments}
        actions = self.state.deliver(target, msg, sender, Effect.OPENS, now)
        if sender is None:
            actions = mark_redelivered(target, msg.seq, actions)
        message_id: str = msg.message_id  # type: ignore[assignment]  # set by deliver
        seq = msg.seq if target.home is None else None
        pending.message_id, pending.provider, pending.seq = message_id, provider, seq
        self.last[name] = provider
        requester, conversation_id = pending.requester, pending.conversation_id
        key = (requester, provider, conversation_id)
        conversations = self.conversations
        conversations._opens(key)
        if pending.traceparent is not None:
            conversations.traces[key] = pending.traceparent
        target.serving += 1
        # Kept one by one for CANCEL and deadlines, as `Conversations.request` does.
        one = (provider, message_id, seq, deadline)
        waiting = conversations._waiting.setdefault((requester, conversation_id), one)
        if waiting is not one or deadline is not None:
            conversations.deadlines.opened(requester, conversation_id, one, pending.timeout_ms)
        if self.pending.setdefault(key, pending) is not pending:
            self.queued.setdefault(key, []).append(pending)
        return actions

    def answered(self, key: ConversationKey, done: Addressed) -> None:
        """The conversation `key` of an addressed REQUEST was closed (its final RESPONSE) and
        its oldest addressed REQUEST, `done`, forgotten (`Conversations._closes`): the next one
        queued in it, if any, moves up."""
        later = self.queued.get(key)
        if later is not None:
            self.pending[key] = later.pop(0)
            if not later:
                del self.queued[key]

    def _forget(self, key: ConversationKey, done: Addressed) -> None:
        later = self.queued.get(key) if self.queued else None
        if later is None:
            del self.pending[key]
            return
        if self.pending[key] is done:
            self.pending[key] = later.pop(0)
        else:
            later.remove(done)
        if not later:
            del self.queued[key]

    # -- failover ---------------------------------------------------------------------------

    def provider_gone(self, agent: AgentRecord) -> list[Action]:
        """`agent`'s connection closed (network loss, kill, UNREGISTER, an operator's revoke or
        remove; not its own reconnection): re-dispatch each addressed REQUEST it held and had
        not answered, or answer it `no_provider`. Call after the agent is offline."""
        if not self.pending or self.paused or not agent.serving:
            return []  # serving nothing (direct or addressed): nothing of its to walk for
        agent_id = agent.agent_id
        held: list[tuple[ConversationKey, Addressed]] = []
        for key, one in self.pending.items():
            if key[1] == agent_id:
                if not isinstance(one, Addressed):  # `Given`: the record a failover needs
                    one = self.pending[key] = Addressed.given(key, one)
                held.append((key, one))
        for key, later in self.queued.items():
            if key[1] == agent_id:
                made = [a if isinstance(a, Addressed) else Addressed.given(key, a) for a in later]
                later[:] = made
                held += [(key, a) for a in made]
        actions: list[Action] = []
        now = self.state.clock()
        for key, pending in held:
            actions += self._fail_over(pending, key, agent, now)
        return actions

    def _fail_over(
        self, pending: Addressed, key: ConversationKey, gone: AgentRecord, now: float
    ) -> list[Action]:
        state, conversations = self.state, self.conversations
        self._forget(key, pending)
        conversations.deadlines.withdrawn(key, pending.message_id)
        count = conversations.open.get(key)
        if count is not None:
            conversations._closes(key, count, gone, forget=False)  # forgotten just above
        seq = pending.seq
        if seq is not None:
            drop_held(gone, seq)
        actions = self._redispatch(pending, gone, now)
        if seq is not None and gone.agent_id in state.registry.agents:
            # The copy dropped is still stored: a restart must not give it back (`restore`).
            dropped = {
                "receiver": gone.agent_id,
                "seq": seq,
                "requester": pending.requester,
                "conversation_id": pending.conversation_id,
                "failed_at": state.delivery.last_row,
            }
            key_of = f"{gone.agent_id} {seq}"
            state.journaled(StateSaved(DROPPED, key_of, orjson.dumps(dropped)))
        return actions

    def _redispatch(self, pending: Addressed, gone: AgentRecord, now: float) -> list[Action]:
        """Give `pending`, which `gone` held, to another candidate, or answer `no_provider`."""
        state = self.state
        tried = pending.tried = pending.tried or set()
        tried.add(gone.agent_id)
        requester = state.registry.agents.get(pending.requester)
        if requester is None:
            return []  # the requester is gone too: nobody to answer
        log.info(
            "REQUEST_FAILED_OVER",
            requester=pending.requester,
            provider=gone.agent_id,
            capability=pending.capability,
            conversation_id=clip(pending.conversation_id),
        )
        while True:
            chosen = self._choose(pending)
            if chosen is None:
                if state.shared is not None:  # a provider on another node, if any
                    away = choose_elsewhere(
                        state.registry.providers, self.last, pending, state.presence.elsewhere
                    )
                    if away is not None:
                        requester.open_requests = max(0, requester.open_requests - 1)
                        return self._pass_on(pending, away, None, None)
                break
            redo = Message(
                pending.requester,
                chosen[0].agent_id,
                MessageType.REQUEST,
                {},
                pending.conversation_id,
                message_id=pending.message_id,
                traceparent=pending.traceparent,
            )
            try:
                return self._dispatch(pending, chosen, redo, None, now)
            except Refusal:  # its mailbox is full: the next candidate
                tried.add(chosen[0].agent_id)
        requester.open_requests = max(0, requester.open_requests - 1)
        return self._no_provider(pending, requester, now, failed_over=True)

    def _no_provider(
        self, pending: Addressed, requester: AgentRecord, now: float, *, failed_over: bool
    ) -> list[Action]:
        """The lobby's final RESPONSE to `pending`, stored for its requester (who may be
        offline, or on another node, by now)."""
        state = self.state
        code, reason, path = no_candidate(pending, failed_over=failed_over)
        body: dict[str, Any] = {"status": ResponseStatus.ERROR, "code": code, "error": reason}
        if path is not None:
            body["path"] = path
        state.counters.refused[code] += 1
        answer = Message(
            LOBBY_ID,
            pending.requester,
            MessageType.RESPONSE,
            body,
            pending.conversation_id,
            in_reply_to=pending.message_id,
            traceparent=pending.traceparent,
        )
        return state.deliver(requester, answer, None, Effect.NONE, now, True)

    def restore(self, snapshot: Snapshot) -> None:
        """After a restart (call after `Conversations.restore`): the copies of failed-over
        REQUESTs still stored are not given back to their old providers, and their
        conversations stay closed. What no longer needs it (acknowledged since, or its
        provider gone) is forgotten."""
        state, conversations = self.state, self.conversations
        agents = state.registry.agents
        for data in snapshot.state.get(DROPPED, ()):
            doc = orjson.loads(data)
            receiver, seq = agents.get(doc["receiver"]), doc["seq"]
            # The checkpoint the store kept was taken after the failover: closed in it.
            covered = doc["failed_at"] <= snapshot.conversations_upto
            if receiver is None or (covered and receiver.acked_seq >= seq):
                state.journaled(StateRemoved(DROPPED, f"{doc['receiver']} {seq}"))
                continue
            drop_held(receiver, seq)
            if covered:
                continue
            key = (doc["requester"], receiver.agent_id, doc["conversation_id"])
            count = conversations.open.get(key)
            if count is not None:
                conversations._closes(key, count, receiver)
                requester = agents.get(key[0])
                if requester is not None and requester.open_requests:
                    requester.open_requests -= 1
