"""The core's side of the registry that lobby nodes share (`lobby serve --cluster`). Sans-I/O.

Nodes settle who holds an agent id by a compare-and-set in a shared store; the core never talks
to it. Instead:
- a REGISTER of an id this node does not know becomes a `Claim` (`claim`), answered only once
  the I/O layer has tried to create the id everywhere (`claimed`): REGISTER_ACK if this node won,
  `agent_id_taken` if another node did, `internal` if the shared store could not be reached;
- every registration change made here (capabilities, acks, a new token, a removal) is queued
  in `changes` for the I/O layer to write;
- what other nodes changed comes back in as `learned` / `forgot`, which change the registry
  without journaling or queueing anything, so DISCOVER stays local and sees every node's agents;
- a message to an agent this node has not learned of waits (`park`) while the I/O layer reads
  the agent's entry from the shared store (`lookups`, answered by `Router.looked_up`): it may
  have registered on another node a moment ago, its entry not yet watched here. Then it is
  routed, or refused `unknown_receiver` if the store does not hold it either; later messages to
  the same receiver wait behind it, so none overtakes another;
- a resume of an agent whose home is another node waits (`gate`) until that node answered a
  probe (`probes`, answered by `probed`): if it is up, the resume waits on (`release`) while
  that node hands the agent over (`releases`, answered by `Router.handed_over`:
  `lobby.core.cluster.handover`), then takes the agent over as on one node; if it is down (killed,
  cut off), its agents' state is in its journal, which a failover is about to adopt
  (`lobby.core.cluster.adoption`): the resume is held (`failing_over`) until that is done, so
  nothing is numbered twice or delivered out of order, then goes ahead (`failovers`); one held
  `FAILOVER_HOLD` is closed with 1013 (try again), and the agent's next attempt waits again.

A single-node lobby has no `SharedRegistry` (`LobbyState.shared` is None): nothing here runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import orjson
import structlog

from lobby.core.discovery.registry import Registry
from lobby.core.limits import TokenBucket
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.refusal import Refusal
from lobby.core.session import Action, AgentRecord, Close, Session
from protocol.models import CloseCode, ErrorCode, Message, MessageType
from protocol.payloads import Capability

log = structlog.get_logger("lobby")

PROBED_FRESH: Final = 2.0
"""Seconds an answered probe of a node lets resumes take its agents without asking again."""
FAILOVER_HOLD: Final = 8.0
"""Seconds a resume of an agent whose home node is down waits here for that node's failover
before it is closed with 1013 (try again): under the SDK's 10 s wait for REGISTER's answer, so
an agent meets at most one or two 1013s, where closing at once met one per attempt all through
`--cluster-dead-after` (10 s) and the adoption."""
FAILOVER_HELD_MAX: Final = 100_000
"""Resumes held at once for failovers; past it a resume is closed with 1013 at once."""
PARKED_MAX: Final = 10_000
"""Messages held at once for receivers being looked up; past it a message is routed or refused
at once, as on one node."""


@dataclass(slots=True, eq=False)
class Claim:
    """A REGISTER of a new id waiting for the shared store's verdict."""

    saved: AgentSaved
    """What the shared store is to hold: token hash (never the token), capabilities, acks."""
    session: Session | None
    """None once its connection closed: a won claim still registers the agent, offline."""
    msg: Message
    token: str
    """Kept only until REGISTER_ACK hands it to the agent."""
    bucket: TokenBucket | None


class SharedRegistry:
    """Pending claims and outgoing changes of this node, and the entry points for what other
    nodes changed. Made by `Router.share()`; driven by the cluster layer (`lobby.cluster`)."""

    def __init__(self, registry: Registry, node_id: str) -> None:
        self.registry = registry
        self.node_id = node_id
        self.claims: dict[str, Claim] = {}
        """Agent id -> its claim, until `claimed`."""
        self.new_claims: list[Claim] = []
        """Claims the I/O layer has not taken yet (`take`)."""
        self.changes: list[AgentSaved | AgentRemoved] = []
        """Registration changes made here, in order, for the I/O layer to write (`take`)."""
        self.held: set[str] = set()
        """Nodes known down and not back: their agents' resumes here wait (`failing_over`)."""
        self.failing_over: dict[Session, tuple[Message, float]] = {}
        """Resumes of agents whose home is held down (session -> its REGISTER and when, the
        clock, it first came), in order: they wait for the failover (`failovers`)."""
        self.answered: dict[str, float] = {}
        """Node -> when (the clock) it last answered a probe."""
        self.waiting: dict[str, list[tuple[Session, Message]]] = {}
        """Node -> resumes of its agents waiting for its probe's answer, in order."""
        self.probes: list[str] = []
        """Nodes the I/O layer is to probe (then call `Router.probed`)."""
        self.parked: dict[str, list[tuple[Session, Message]]] = {}
        """Receiver not known here -> the messages to it waiting for its lookup, in order."""
        self.parked_count = 0
        self.lookups: list[str] = []
        """Agent ids the I/O layer is to read from the shared store (then call
        `Router.looked_up`)."""
        self.releasing: dict[str, list[tuple[Session, Message]]] = {}
        """Agent id -> resumes of it waiting for its old home's handover, in order."""
        self.releases: list[tuple[str, str]] = []
        """(home, agent id): the I/O layer is to ask that node to release that agent (then
        call `Router.handed_over`)."""

    def take(self) -> tuple[list[Claim], list[AgentSaved | AgentRemoved]]:
        """What the I/O layer must write to the shared store now; call after each batch."""
        claims, self.new_claims = self.new_claims, []
        changes, self.changes = self.changes, []
        return claims, changes

    def claim(
        self,
        session: Session,
        msg: Message,
        saved: AgentSaved,
        token: str,
        bucket: TokenBucket | None,
    ) -> None:
        if saved.agent_id in self.claims:
            raise Refusal(
                ErrorCode.AGENT_ID_TAKEN,
                f"agent id {saved.agent_id!r} is being registered by another connection",
            )
        claim = Claim(saved, session, msg, token, bucket)
        self.claims[saved.agent_id] = claim
        self.new_claims.append(claim)

    def closed(self, session: Session) -> None:
        """`session`'s connection is gone: a claim it made no longer has anyone to answer,
        a resume it made waits for nothing."""
        for claim in self.claims.values():
            if claim.session is session:
                claim.session = None
        for waiting in (*self.waiting.values(), *self.releasing.values()):
            waiting[:] = [w for w in waiting if w[0] is not session]
        self.failing_over.pop(session, None)

    def registering(self, session: Session) -> bool:
        """`session`'s REGISTER waits here (for a claim's verdict, a probe, a handover or a
        failover, each bounded): it is not late."""
        return (
            session in self.failing_over  # the many, during a failover: looked up, not scanned
            or any(claim.session is session for claim in self.claims.values())
            or any(
                w[0] is session
                for waiting in (*self.waiting.values(), *self.releasing.values())
                for w in waiting
            )
        )

    def park(self, session: Session, msg: Message) -> bool:
        """Hold `msg`, to an agent this node does not know or whose earlier messages are held,
        until its receiver has been looked up. False (not held): a RESPONSE (it answers a
        REQUEST this node routed, so its receiver is known), a receiver known with nothing
        held for it, or `PARKED_MAX` messages held already."""
        receiver = msg.receiver_id
        if (
            msg.message_type is MessageType.RESPONSE
            or (receiver in self.registry.agents and receiver not in self.parked)
            or self.parked_count >= PARKED_MAX
        ):
            return False
        waiting = self.parked.get(receiver)
        if waiting is None:
            waiting = self.parked[receiver] = []
            self.lookups.append(receiver)
        waiting.append((session, msg))
        self.parked_count += 1
        return True

    def hold(self, agent_id: str) -> None:
        """From now on, messages to `agent_id` wait (`park`) until `Router.looked_up`: this
        node handed it over, and its new home has not taken it yet
        (`lobby.core.cluster.handover`)."""
        self.parked.setdefault(agent_id, [])

    def unpark(self, agent_id: str) -> list[tuple[Session, Message]]:
        """The messages held for `agent_id`, in order; none is held for it any more."""
        waiting = self.parked.pop(agent_id, [])
        self.parked_count -= len(waiting)
        return waiting

    def gate(self, home: str, session: Session, msg: Message, now: float) -> list[Action] | None:
        """A resume on this node of an agent whose home is node `home`: None if it may go
        ahead now, else what to do instead (nothing yet: it waits for `home`'s probe or
        handover, or, while `home` is down, for its failover)."""
        if home in self.held:
            return self._hold(home, session, msg, now)
        at = self.answered.get(home)
        if at is not None and 0 <= now - at <= PROBED_FRESH:
            self.release(home, session, msg)
            return []
        waiting = self.waiting.get(home)
        if waiting is None:
            self.waiting[home] = [(session, msg)]
            self.probes.append(home)
        else:
            waiting.append((session, msg))
        return []

    def release(self, home: str, session: Session, msg: Message) -> None:
        """A resume on this node of an agent whose home is `home`, a node that is up: it waits
        for `home` to hand the agent over (`lobby.core.cluster.handover`)."""
        agent_id = msg.sender_id
        waiting = self.releasing.get(agent_id)
        if waiting is None:
            self.releasing[agent_id] = [(session, msg)]
            self.releases.append((home, agent_id))
        else:
            waiting.append((session, msg))

    def probed(
        self, home: str, alive: bool, now: float
    ) -> tuple[list[tuple[Session, Message]], list[Action]]:
        """`home` answered its probe (`alive`) or not: the resumes that may go ahead now
        (the caller runs them again), and the closes of those that may not."""
        waiting = self.waiting.pop(home, [])
        if alive:
            self.answered[home] = now
            return waiting, []
        self.held.add(home)
        log.warning("CLUSTER_NODE_DOWN", node_id=home, resumes_held=len(waiting))
        return [], [a for session, msg in waiting for a in self._hold(home, session, msg, now)]

    def _hold(self, home: str, session: Session, msg: Message, now: float) -> list[Action]:
        held = self.failing_over.get(session)
        if held is not None:  # a second REGISTER behind the first: it waits from the first's time
            self.failing_over[session] = (msg, held[1])
        elif len(self.failing_over) >= FAILOVER_HELD_MAX:
            return [Close(session, CloseCode.TRY_AGAIN, _failing_over(home))]
        else:
            self.failing_over[session] = (msg, now)
        return []

    def failovers(self, now: float) -> tuple[list[tuple[Session, Message]], list[Action]]:
        """The held resumes whose agent's home is no longer a node held down (failed over to
        this node or another, or back), which the caller runs again, in order; and the closes
        (1013) of those held `FAILOVER_HOLD` already."""
        ready: list[tuple[Session, Message]] = []
        closes: list[Action] = []
        agents = self.registry.agents
        for session, (msg, since) in list(self.failing_over.items()):
            record = agents.get(msg.sender_id)
            home = None if record is None else record.home
            if home is None or home not in self.held:
                ready.append((session, msg))
            elif now - since >= FAILOVER_HOLD:
                closes.append(Close(session, CloseCode.TRY_AGAIN, _failing_over(home)))
                del self.failing_over[session]
        for session, _ in ready:
            del self.failing_over[session]
        return ready, closes

    def claimed(self, agent_id: str, won: bool | None) -> tuple[Claim, AgentRecord | None]:
        """The shared store's verdict on the claim of `agent_id`: `won` True (this node
        created it), False (another node holds it), None (the store could not be reached).
        Returns the claim and, when won, the agent's new record (the caller journals,
        attaches and answers)."""
        claim = self.claims.pop(agent_id)
        if not won:
            return claim, None
        saved = claim.saved
        stale = self.registry.remove(agent_id)  # never expected: the id was claimed here
        if stale is not None:
            log.warning("CLUSTER_REGISTRY_STALE", agent_id=agent_id)
        record = AgentRecord(agent_id, saved.token_hash, acks=saved.acks)
        record.bucket = claim.bucket
        self.registry.add(record)
        self.registry.set_capabilities(record, _capabilities(saved.capabilities))
        return claim, record

    def learned(self, saved: AgentSaved, home: str) -> list[Action]:
        """Another node registered `saved.agent_id`, changed its registration, or (`home`,
        the node that wrote it) took the agent's connection: then a connection of it here is
        closed with 4001, as a newer connection on this node would."""
        record = self.registry.get(saved.agent_id)
        actions: list[Action] = []
        if record is None:  # its acks, capabilities and home are set below
            record = AgentRecord(saved.agent_id, saved.token_hash)
            self.registry.add(record)
        elif record.token_hash != saved.token_hash:
            record.token_hash = saved.token_hash
            session, record.session = record.session, None
            if session is not None:  # its token was replaced or revoked elsewhere
                session.agent = None
                actions.append(Close(session, CloseCode.UNREGISTERED, "token revoked"))
        elif home != self.node_id and record.session is not None:
            session, record.session = record.session, None
            session.agent = None
            log.info("AGENT_MOVED", agent_id=saved.agent_id, node_id=home)
            reason = f"replaced by a newer connection on node {home}"
            actions.append(Close(session, CloseCode.REPLACED, reason))
        record.acks = saved.acks
        record.home = None if home == self.node_id else home
        self.registry.set_capabilities(record, _capabilities(saved.capabilities))
        return actions

    def forgot(self, agent_id: str) -> tuple[list[Action], bool]:
        """Another node removed `agent_id` (UNREGISTER, `lobby remove`). Returns the actions
        and whether this node knew it (then the caller journals the removal)."""
        record = self.registry.remove(agent_id)
        if record is None:
            return [], False
        session, record.session = record.session, None
        if session is None:
            return [], True
        session.agent = None
        return [Close(session, CloseCode.UNREGISTERED, "unregistered")], True


def _capabilities(data: bytes) -> list[Capability]:
    return [Capability.model_validate(c) for c in orjson.loads(data)]


def _failing_over(home: str) -> str:
    return f"its home node {home} is down and being failed over: try again"
