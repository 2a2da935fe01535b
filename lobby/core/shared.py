"""The core's side of the registry that lobby nodes share (`lobby serve --cluster`). Sans-I/O.

Nodes settle who holds an agent id by a compare-and-set in a shared store; the core never talks
to it. Instead:
- a REGISTER of an id this node does not know becomes a `Claim` (`claim`), answered only once
  the I/O layer has tried to create the id everywhere (`claimed`): REGISTER_ACK if this node won,
  `agent_id_taken` if another node did, `internal` if the shared store could not be reached;
- every registration change made here (capabilities, acks, a new token, a removal) is queued
  in `changes` for the I/O layer to write;
- what other nodes changed comes back in as `learned` / `forgot`, which change the registry
  without journaling or queueing anything, so DISCOVER stays local and sees every node's agents.

A single-node lobby has no `SharedRegistry` (`LobbyState.shared` is None): nothing here runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import structlog

from lobby.core.limits import TokenBucket
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.refusal import Refusal
from lobby.core.registry import AgentRecord, Registry
from lobby.core.session import Action, Close, Session
from protocol.models import CloseCode, ErrorCode, Message
from protocol.payloads import Capability

log = structlog.get_logger("lobby")


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
        """`session`'s connection is gone: a claim it made no longer has anyone to answer."""
        for claim in self.claims.values():
            if claim.session is session:
                claim.session = None

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
