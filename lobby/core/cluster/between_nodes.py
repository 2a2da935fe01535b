"""The router's entry points for a cluster node (`lobby serve --cluster`). Sans-I/O.

The cluster layer (`lobby.cluster`) drives these: the shared registry's verdicts and what other
nodes changed (`lobby.core.cluster.shared`), messages other nodes forwarded (`relayed`) or decided
(`decided`, `lobby.core.cluster.decided`), agents handed over between live nodes (`release`,
`handed_over`, `take_back`: `lobby.core.cluster.handover`). A single-node lobby calls none of them.
`Router` inherits them; they work on its state, registrar and dispatch table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from lobby.core.cluster.decided import deliver_decided
from lobby.core.cluster.handover import release, released, take_back, take_over
from lobby.core.cluster.shared import SharedRegistry
from lobby.core.commerce.marketplace import Marketplace
from lobby.core.commerce.negotiation import Negotiations
from lobby.core.conversations import Conversations
from lobby.core.records import AgentRemoved, AgentSaved, Record
from lobby.core.refusal import Refusal
from lobby.core.registration import Registrar
from lobby.core.session import Action, AgentRecord, Close, Session
from lobby.core.state import LobbyState
from protocol.codec import decode
from protocol.errors import DecodeError
from protocol.models import CloseCode, ErrorCode, Message, MessageType, ResponseStatus

_LOST: Final = "messages it sent to another node were lost; resend what was not ACCEPTED"
Handler = Callable[[Session, AgentRecord, Message], list[Action]]


class BetweenNodes:
    """What a cluster node's core adds to `Router` (whose `__init__` sets these fields)."""

    state: LobbyState
    registrar: Registrar
    requests: Conversations
    negotiations: Negotiations
    market: Marketplace
    _handlers: dict[MessageType, Handler]
    _parked: dict[str, list[tuple[Session, Message]]]
    given_up: dict[str, list[Record]]
    """Agent handed over to another node that has not yet confirmed its adoption -> the
    records saying this node gave it up, journaled once it has (`released`)."""

    def share(self, node_id: str) -> SharedRegistry:
        """Make this core one node of a cluster: new ids are claimed in the shared registry
        before REGISTER_ACK, and registration changes are queued for it
        (`lobby.core.cluster.shared`). Call once, before any connection."""
        self.state.shared = SharedRegistry(self.state.registry, node_id)
        self._parked = self.state.shared.parked
        self.state.presence.sharing = True
        return self.state.shared

    def claimed(self, agent_id: str, won: bool | None) -> list[Action]:
        """The shared registry's verdict on this node's claim of `agent_id` (see
        `SharedRegistry.claimed`): REGISTER_ACK, or the ERROR that refuses the REGISTER."""
        return self.registrar.claimed(agent_id, won)

    def learned(self, saved: AgentSaved, home: str) -> list[Action]:
        """Another node (`home`) registered an agent, changed its registration or took its
        connection (`SharedRegistry.learned`): known here, not journaled here."""
        assert self.state.shared is not None, "share() first"
        known = self.state.registry.get(saved.agent_id)
        before = known.capabilities if known is not None else None
        # Connected here under the same token: a close now means it resumed at `home`.
        connected = (
            known is not None and known.session is not None and known.token_hash == saved.token_hash
        )
        actions = self.state.shared.learned(saved, home)
        record = self.state.registry.agents[saved.agent_id]
        moved = home if connected and record.session is None else None
        return actions + self.state.presence.learned(record, before, moved)

    def forgot(self, agent_id: str) -> list[Action]:
        """Another node removed an agent: gone here too (journaled, so a restart agrees)."""
        assert self.state.shared is not None, "share() first"
        record = self.state.registry.get(agent_id)
        actions, known = self.state.shared.forgot(agent_id)
        if known:
            self.state.journaled(AgentRemoved(agent_id))
        if record is not None:
            actions += self.state.presence.forgot(record)
        return actions

    def presence_heard(self, node: str, changes: list[tuple[str, bool]]) -> list[Action]:
        """Node `node` reports (agent id, online) of its agents, in order: PRESENCE to the
        watchers here (`lobby.core.discovery.presence`)."""
        return self.state.presence.heard(node, changes)

    def online_here(self) -> list[str]:
        """The agents connected to this node: what a node that just joined is told."""
        agents = self.state.registry.agents.values()
        return [a.agent_id for a in agents if a.session is not None and a.home is None]

    def probed(self, home: str, alive: bool) -> list[Action]:
        """Node `home` answered a probe (`alive`) or not: the resumes of its agents waiting
        for it go ahead or are closed with 1013 (`SharedRegistry.gate`)."""
        assert self.state.shared is not None, "share() first"
        shared = self.state.shared
        waiting, actions = shared.probed(home, alive, self.state.clock())
        for session, msg in waiting:
            shared.release(home, session, msg)
        return actions

    def failovers(self) -> list[Action]:
        """On the router's tick: the resumes held while their agent's home was down go ahead
        if it is no longer (failed over, or back), or are closed with 1013 once held
        `FAILOVER_HOLD` (`SharedRegistry.failovers`)."""
        assert self.state.shared is not None, "share() first"
        ready, actions = self.state.shared.failovers(self.state.clock())
        for session, msg in ready:
            try:
                actions += self.registrar.register(session, msg, again=True)
            except Refusal as refusal:
                actions += self.state.error(session, msg, refusal.code, refusal.reason)
        return actions

    def release(self, agent_id: str, to_node: str) -> tuple[bytes, list[Action]]:
        """Node `to_node` asks this node, `agent_id`'s home, to hand the agent over: what to
        answer (once committed) and what to do (`lobby.core.cluster.handover.release`)."""
        return release(self, agent_id, to_node)

    def released(self, agent_id: str) -> None:
        """The node `agent_id` was handed to committed its adoption: journal that this node
        gave it up (`lobby.core.cluster.handover.released`)."""
        released(self, agent_id)

    def take_back(self, to_node: str, data: bytes) -> list[Action]:
        """Node `to_node` never took the agent this node handed it: it is this node's again
        (`lobby.core.cluster.handover.take_back`)."""
        return take_back(self, to_node, data)

    def handed_over(self, home: str, agent_id: str, data: bytes | None) -> list[Action]:
        """Node `home` answered this node's request to release `agent_id` with `data` (empty:
        nothing of it is there), or did not answer (None): the resumes waiting for it are
        adopted and go ahead, or are closed with 1013 (try again)."""
        assert self.state.shared is not None, "share() first"
        waiting = self.state.shared.releasing.pop(agent_id, [])
        if data is None:
            reason = f"its home node {home} did not hand it over in time: try again"
            return [Close(session, CloseCode.TRY_AGAIN, reason) for session, _ in waiting]
        take_over(self, home, data)
        actions: list[Action] = []
        for session, msg in waiting:
            try:
                actions += self.registrar.register(session, msg, handed_over=True)
            except Refusal as refusal:
                actions += self.state.error(session, msg, refusal.code, refusal.reason)
        return actions

    def looked_up(self, agent_id: str) -> list[Action]:
        """The shared store was read for `agent_id` (and what it holds learned): the messages
        held for it (`SharedRegistry.park`) are routed now, in order, or refused if it is still
        unknown. One whose sender's connection closed meanwhile is dropped: never confirmed,
        it is resent after the sender reconnects."""
        assert self.state.shared is not None, "share() first"
        actions: list[Action] = []
        for session, msg in self.state.shared.unpark(agent_id):
            agent = session.agent
            if agent is None:
                continue
            try:
                actions += self._handlers[msg.message_type](session, agent, msg)
            except Refusal as refusal:
                actions += self.state.error(session, msg, refusal.code, refusal.reason)
        return actions

    def _park(self, session: Session, msg: Message) -> bool:
        shared = self.state.shared
        return shared is not None and shared.park(session, msg)

    def relayed(self, session: Session, frame: bytes) -> list[Action]:
        """A message another node authenticated and forwarded here, its receiver's home:
        routed as if sent here, by `session`, which stands for its sender on that node (what
        it is answered goes back there; its ACCEPTED that node decides: `stored_away`)."""
        agent = session.agent
        assert agent is not None, "a relay session stands for a known agent"
        try:
            msg = decode(frame)
        except DecodeError as exc:
            return self.state.error(session, None, ErrorCode.MALFORMED, exc.reason)
        try:
            return self._handlers[msg.message_type](session, agent, msg)
        except Refusal as refusal:
            return self.state.error(session, msg, refusal.code, refusal.reason)

    def stored_away(self, confirmed: Iterable[tuple[str, str]]) -> list[Action]:
        """Another node confirmed (committed, or refused) the forwarded messages `confirmed`,
        (sender, message_id) pairs: their senders connected here are told ACCEPTED for what is
        now settled of theirs, in order (`lobby.core.accepting`)."""
        agents = self.state.registry.agents
        told: dict[Session, str | None] = {}
        for sender_id, message_id in confirmed:
            agent = agents.get(sender_id)
            if agent is None or agent.home is not None or agent.session is None:
                continue
            session = agent.session
            unsettled = session.unsettled
            if unsettled is not None:
                last = unsettled.stored(message_id)
                if last is not None or session not in told:
                    told[session] = last
        actions: list[Action] = []
        for session, last in told.items():
            actions += self.state.told_accepted(session, last)
        return actions

    def lost_away(self, dropped: Iterable[tuple[str, str]]) -> list[Action]:
        """This node could not keep the forwarded messages `dropped`, (sender, message_id)
        pairs, until their homes confirmed them: each sender connected here that was not told
        one ACCEPTED is closed with 1013, to resume and resend what it was not told (the homes'
        dedupe absorbs what did arrive)."""
        agents = self.state.registry.agents
        closed: list[Action] = []
        for sender_id, message_id in dropped:
            agent = agents.get(sender_id)
            if agent is None or agent.home is not None or agent.session is None:
                continue
            session = agent.session
            if session.unsettled is not None and session.unsettled.waits_for(message_id):
                session.unsettled = None  # closed once
                closed.append(Close(session, CloseCode.TRY_AGAIN, _LOST))
        return closed

    def decided(self, session: Session | None, frame: bytes) -> list[Action] | None:
        """A message another node decided (a dialogue move, an order proposal, a payment, or
        one of its notices, `session` None), for an agent of this node: stored and delivered,
        not checked again (`lobby.core.cluster.decided`). None: the receiver's home is elsewhere
        now."""
        actions = deliver_decided(self.state, session, frame)
        deadlines = self.requests.deadlines
        if actions is not None and deadlines.elsewhere and b'"RESPONSE"' in frame:
            # Maybe the final RESPONSE to a capability-addressed REQUEST of an agent of this
            # node's, decided on the provider's node: no longer open here either.
            msg = decode(frame)
            if (
                msg.message_type is MessageType.RESPONSE
                and msg.conversation_id is not None
                and msg.payload.get("status") != ResponseStatus.IN_PROGRESS
            ):
                deadlines.settled_elsewhere(
                    msg.receiver_id, msg.conversation_id, msg.in_reply_to, exact=False
                )
        return actions
