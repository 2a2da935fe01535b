"""REGISTER: new agents, resumed agents, and the limits on registering.

A REGISTER without a valid token for a known agent id is refused (`agent_id_taken`); with it,
the agent resumes: same token, capabilities replaced only if given, the old connection closed
with 4001, and everything held for it delivered. Tokens are UUID4, kept only as SHA-256.
"""

from __future__ import annotations

import hmac
import uuid

import orjson
import structlog

from lobby.core.discovery.schemas import check_input_schemas
from lobby.core.limits import Limits, TokenBucket
from lobby.core.records import AgentSaved
from lobby.core.refusal import Refusal, hash_token, require_lobby_receiver, validate
from lobby.core.session import REVOKED, Action, AgentRecord, Close, Send, Session
from lobby.core.state import LobbyState
from protocol.limits import MAX_AGENT_ID_LENGTH, MAX_SENTENCE_LENGTH, clip
from protocol.models import (
    AGENT_ID_RE,
    LOBBY_ID,
    CloseCode,
    ErrorCode,
    Message,
    MessageType,
    RegisterStatus,
)
from protocol.payloads import Capability, RegisterPayload

log = structlog.get_logger("lobby")


class Registrar:
    """Owns the REGISTER attempt counters; handles REGISTER (a new agent or a resumed one) and
    checks a declaration of capabilities."""

    def __init__(self, state: LobbyState) -> None:
        self.state = state
        self.limits: Limits = state.limits
        self.attempts: dict[str, TokenBucket] = {}
        """REGISTER attempts per source address."""

    def register(
        self, session: Session, msg: Message, handed_over: bool = False, again: bool = False
    ) -> list[Action]:
        """A REGISTER (new id, resume, or takeover of a revoked id). `handed_over`: a resume
        whose agent's old home has just handed it over (`Router.handed_over`): not gated.
        `again`: a REGISTER that waited (for a failover, or, as every `handed_over` one, a
        handover) and is run again: its attempt was counted against its address's rate when
        it came."""
        agent_id = msg.sender_id
        if not AGENT_ID_RE.match(agent_id) or agent_id == LOBBY_ID:
            raise Refusal(
                ErrorCode.MALFORMED,
                f"invalid agent id {clip(agent_id)!r}: sender_id must be "
                f"1-{MAX_AGENT_ID_LENGTH} characters of "
                f"[A-Za-z0-9._:@-] and not {LOBBY_ID!r}",
            )
        require_lobby_receiver(msg)
        if not (again or handed_over):
            self._check_registration_rate(session)
        payload = validate(RegisterPayload, msg)
        self._check_registration_key(payload.registration_key)
        self.check_capabilities(payload.capabilities)
        record = self.state.registry.get(agent_id)
        token = msg.auth_token
        if (
            record is not None
            and not handed_over
            and (instead := self._gated(session, record, msg)) is not None
        ):
            return instead
        if record is not None and record.token_hash == REVOKED and token is None:
            # An operator revoked its token: this REGISTER takes the id over under a new one.
            token = str(uuid.uuid4())
            record.token_hash = hash_token(token)
            return self._resume(session, record, token, payload, RegisterStatus.REGISTERED)
        if record is not None:
            if record.token_hash == REVOKED:
                raise Refusal(
                    ErrorCode.AGENT_ID_TAKEN,
                    f"the auth_token of agent {agent_id!r} was revoked by an operator: "
                    "REGISTER without auth_token to get a new one",
                )
            if token is None or not hmac.compare_digest(hash_token(token), record.token_hash):
                raise Refusal(
                    ErrorCode.AGENT_ID_TAKEN,
                    f"agent id {agent_id!r} is already registered: resume with its auth_token "
                    "or register under another id",
                )
            return self._resume(session, record, token, payload)
        token = str(uuid.uuid4())
        shared = self.state.shared
        if shared is not None:
            # A cluster node: the id is this node's only once the shared registry says so.
            capabilities = [
                c.model_dump(mode="json", exclude_none=True) for c in payload.capabilities or []
            ]
            saved = AgentSaved(
                agent_id, hash_token(token), orjson.dumps(capabilities), payload.acks
            )
            shared.claim(session, msg, saved, token, self._message_bucket())
            return []
        record = AgentRecord(agent_id, hash_token(token), acks=payload.acks)
        record.bucket = self._message_bucket()
        self.state.registry.add(record)
        self.state.registry.set_capabilities(record, payload.capabilities or [])
        record.session = session
        session.agent = record
        self.state.save(record)
        log.info(
            "AGENT_REGISTERED",
            agent_id=agent_id,
            capabilities=clip(", ".join(sorted(record.capabilities)), MAX_SENTENCE_LENGTH),
            remote=session.remote,
        )
        log.info("AGENT_REGISTRATION_FINALIZED", agent_id=agent_id)
        return [
            self._register_ack(session, agent_id, RegisterStatus.REGISTERED, token),
            *self.state.presence.came_online(record),
        ]

    def claimed(self, agent_id: str, won: bool | None) -> list[Action]:
        """Answer a REGISTER claimed in the shared registry (`SharedRegistry.claimed`)."""
        assert self.state.shared is not None
        claim, record = self.state.shared.claimed(agent_id, won)
        session = claim.session
        if record is None:
            if session is None:
                return []
            if won is None:
                code = ErrorCode.INTERNAL
                reason = "the cluster's shared registry could not be reached: try again"
            else:
                code = ErrorCode.AGENT_ID_TAKEN
                reason = (
                    f"agent id {agent_id!r} is already registered (on another node): resume "
                    "with its auth_token or register under another id"
                )
            return self.state.error(session, claim.msg, code, reason)
        self.state.journaled(claim.saved)
        log.info(
            "AGENT_REGISTERED",
            agent_id=agent_id,
            capabilities=clip(", ".join(sorted(record.capabilities)), MAX_SENTENCE_LENGTH),
            remote=session.remote if session is not None else None,
        )
        if session is None:
            return []
        record.session = session
        session.agent = record
        return [
            self._register_ack(session, agent_id, RegisterStatus.REGISTERED, claim.token),
            *self.state.presence.came_online(record),
        ]

    def _resume(
        self,
        session: Session,
        record: AgentRecord,
        token: str,
        payload: RegisterPayload,
        status: RegisterStatus = RegisterStatus.RESUMED,
    ) -> list[Action]:
        actions: list[Action] = []
        old = record.session
        if old is not None:
            old.agent = None
            actions.append(Close(old, CloseCode.REPLACED, "replaced by a newer connection"))
        before = record.capabilities  # replaced, not changed, by set_capabilities
        if payload.capabilities is not None:
            self.state.registry.set_capabilities(record, payload.capabilities)
        changed = (
            payload.capabilities is not None
            or payload.acks != record.acks
            or status is RegisterStatus.REGISTERED  # a new token
        )
        record.acks = payload.acks
        record.bucket = record.bucket or self._message_bucket()
        record.home = None
        record.session = session
        session.agent = record
        if changed or self.state.shared is not None:
            # On a cluster node a resume is always saved: the shared registry learns that
            # this node is the agent's home now, and the old home closes its connection.
            self.state.save(record)
        log.info(
            "AGENT_RESUMED" if status is RegisterStatus.RESUMED else "AGENT_REGISTERED",
            agent_id=record.agent_id,
            replaced_connection=old is not None,
            held_messages=len(record.mailbox),
        )
        actions.append(self._register_ack(session, record.agent_id, status, token))
        actions.extend(self.state.delivery.replay(record, session))
        presence = self.state.presence
        if old is None:
            actions.extend(presence.came_online(record, before))
        else:
            actions.extend(presence.declared(record, before))
        return actions

    def _gated(self, session: Session, record: AgentRecord, msg: Message) -> list[Action] | None:
        """On a cluster node, a resume of an agent whose home is another node waits for that
        node to be known up (`SharedRegistry.gate`); None: go ahead. Only a REGISTER that
        would resume (the token matches, or was revoked) is gated."""
        shared = self.state.shared
        if shared is None or record.home is None:
            return None
        token = msg.auth_token
        if record.token_hash == REVOKED:
            if token is not None:
                return None  # refused below
        elif token is None or not hmac.compare_digest(hash_token(token), record.token_hash):
            return None  # refused below
        return shared.gate(record.home, session, msg, self.state.clock())

    def _check_registration_rate(self, session: Session) -> None:
        limits = self.limits
        if not limits.registration_rate:
            return
        now = self.state.clock()
        bucket = self.attempts.get(session.host)
        if bucket is None:
            bucket = TokenBucket(limits.registration_rate, limits.registration_burst, now)
            self.attempts[session.host] = bucket
        if not bucket.take(now):
            log.warning("REGISTRATION_RATE_LIMITED", host=session.host)
            raise Refusal(
                ErrorCode.RATE_LIMITED,
                f"too many REGISTER attempts from {session.host or 'this address'}; "
                "wait and try again",
            )

    def _check_registration_key(self, presented: str | None) -> None:
        expected = self.limits.registration_key
        if expected is None:
            return
        if presented is None or not hmac.compare_digest(presented.encode(), expected.encode()):
            raise Refusal(
                ErrorCode.AUTH_FAILED,
                "this lobby requires a valid 'registration_key' in the REGISTER payload",
            )

    def check_capabilities(self, capabilities: list[Capability] | None) -> None:
        """Refuse a declaration of too many capabilities, or one whose input schema does not
        compile; call before anything is changed."""
        limit = self.limits.max_capabilities
        if capabilities is not None and len(capabilities) > limit:
            raise Refusal(
                ErrorCode.LIMIT_EXCEEDED,
                f"{len(capabilities)} capabilities declared; at most {limit} are allowed",
            )
        check_input_schemas(capabilities)

    def _message_bucket(self) -> TokenBucket | None:
        limits = self.limits
        if not limits.message_rate:
            return None
        return TokenBucket(limits.message_rate, limits.message_burst, self.state.clock())

    def _register_ack(
        self, session: Session, agent_id: str, status: RegisterStatus, token: str
    ) -> Send:
        payload = {"status": status, "lobby_id": LOBBY_ID, "auth_token": token}
        if self.state.identity is not None:
            payload["lobby_identity"] = self.state.identity
        return Send(session, self.state.from_lobby(agent_id, MessageType.REGISTER_ACK, payload))

    def forget_idle(self, now: float) -> None:
        """Drop the attempt counters of addresses that have been quiet long enough."""
        for host in [h for h, b in self.attempts.items() if b.is_full(now)]:
            del self.attempts[host]
