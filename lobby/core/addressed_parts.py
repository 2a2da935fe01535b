"""The pieces of a capability-addressed REQUEST that `lobby.core.addressed.Addressing` works
with: the record kept per REQUEST (`Addressed`), the payload's check (`parse_payload`), the
walks over a capability's providers that rank its candidates (`scan`, `choose_elsewhere`),
the verdict of each distinct input schema, asked once (`verdict`), the lobby's final answer
when no provider takes it (`no_candidate`), and what a failover does to the copies held for
providers (`drop_held`, `mark_redelivered`). Pure functions and data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

from lobby.core.discovery.filters import BadFilter, Filter, parse_filters
from lobby.core.discovery.schemas import CapabilityEntry, InvalidInput
from lobby.core.refusal import Refusal
from lobby.core.session import Action, AgentRecord, Send
from protocol.limits import clip
from protocol.models import LOBBY_ID, ErrorCode
from protocol.payloads import MAX_FILTERS

FIELDS: Final = frozenset(("capability_name", "arguments", "filters"))
_REDELIVERED: Final = b',"redelivered":true}'

Candidate = tuple[AgentRecord, CapabilityEntry]
Ranked = tuple[tuple[int, int], Candidate]
"""A candidate with its rank: (REQUESTs it is serving, its turn)."""


Given = tuple[str, str, bytes, bool, str | None, int | None]
"""A capability-addressed REQUEST as it is kept in the usual case (given on its first try, no
filters, no deadline): (message_id, capability, the frame given to the provider, whether that
frame has the arguments in the object form, traceparent, seq). The frame is the one already
written or held for the provider (an acknowledging one's mailbox holds the same bytes): keeping
the decoded arguments instead, a dict and its values freed a whole round trip later, cost the
lobby about as much as choosing the provider (BENCHMARKS.md, "Capability-addressed
REQUESTs"). An `Addressed` is made from it only if a failover needs one (`Addressed.given`)."""


class Addressed:
    """One capability-addressed REQUEST waiting for its final RESPONSE: what re-dispatching it
    needs. A plain slotted class, what is needed only for a failover or a schema made on
    demand: one is made per such REQUEST."""

    __slots__ = (
        "arguments",
        "capability",
        "conversation_id",
        "deadline",
        "filters",
        "message_id",
        "provider",
        "refusal",
        "refused_by",
        "requester",
        "seq",
        "timeout_ms",
        "traceparent",
        "tried",
        "verdicts",
    )

    def __init__(
        self,
        requester: str,
        conversation_id: str,
        message_id: str,
        capability: str,
        arguments: dict[str, Any],
        filters: Sequence[Filter],
        traceparent: str | None,
    ) -> None:
        self.requester = requester
        self.conversation_id = conversation_id
        self.message_id = message_id
        self.capability = capability
        self.arguments = arguments
        self.filters = filters
        self.traceparent = traceparent
        self.provider = ""
        self.deadline: int | None = None
        """Its deadline (Unix ms, the lobby's clock), kept by every provider it goes to."""
        self.timeout_ms = 0
        self.seq: int | None = None
        """The `seq` of the copy given to `provider` (None: forwarded to another node)."""
        self.tried: set[str] | None = None
        """The providers that went before answering it (or whose mailbox was full): never
        chosen again."""
        self.verdicts: dict[object, InvalidInput | None] | None = None
        """Input schema (`InputCheck.key`) -> its verdict on `arguments`."""
        self.refusal: InvalidInput | None = None
        """The first input-schema refusal met, and by whose capability (`refused_by`): the
        answer when every candidate refuses the arguments."""
        self.refused_by = ""

    @classmethod
    def given(cls, key: tuple[str, str, str], brief: Given) -> Addressed:
        """The record of a REQUEST given on its first try in the usual case (`Given`), made
        when a failover needs it; `key` is its conversation (requester, provider, id)."""
        message_id, capability, frame, object_form, traceparent, seq = brief
        payload = orjson.loads(frame)["payload"]
        if object_form:
            arguments = payload["arguments"]
        else:
            arguments = {k: v for k, v in payload.items() if k != "capability_name"}
        made = cls(key[0], key[2], message_id, capability, arguments, (), traceparent)
        made.provider, made.seq = key[1], seq
        return made

    def left_ms(self, now: float) -> int | None:
        """What is left of its deadline at `now`, as the `timeout_ms` of the REQUEST passed on
        to another node (at least 1: one already passed fires there at once); None: none."""
        return None if self.deadline is None else max(1, self.deadline - int(now * 1000))


def given_frame(target: AgentRecord, actions: list[Action]) -> bytes:
    """The frame `Delivery.accept` just wrote (its one `Send`) or held for `target`."""
    if actions:
        return actions[0].frame  # type: ignore[union-attr]  # a Send, the only action made
    return target.mailbox[-1][1]


def parse_payload(payload: dict[str, Any]) -> tuple[dict[str, Any], Sequence[Filter]]:
    """The arguments and filters of an addressed REQUEST's payload; `malformed` naming the
    problem."""
    if len(payload) > 1 and not payload.keys() <= FIELDS:
        unknown = sorted(str(k) for k in payload.keys() - FIELDS)[0]
        raise Refusal(
            ErrorCode.MALFORMED,
            f"a REQUEST to {LOBBY_ID!r} has unknown field {clip(unknown)!r} "
            "(fields: capability_name, arguments, filters)",
        )
    arguments = payload.get("arguments", {})
    if type(arguments) is not dict:
        raise Refusal(
            ErrorCode.MALFORMED, f"a REQUEST to {LOBBY_ID!r} needs 'arguments' to be an object"
        )
    raw = payload.get("filters")
    if raw is None:
        return arguments, ()
    if isinstance(raw, list) and len(raw) > MAX_FILTERS:
        raise Refusal(
            ErrorCode.MALFORMED,
            f"invalid REQUEST filters: at most {MAX_FILTERS} filters, not {len(raw)}",
        )
    try:
        return arguments, parse_filters(raw)
    except BadFilter as bad:
        raise Refusal(ErrorCode.MALFORMED, f"invalid REQUEST filters: {bad}") from None


def drop_held(agent: AgentRecord, seq: int) -> None:
    """Take the message numbered `seq` out of `agent`'s mailbox (if still held): it is never
    delivered to it again."""
    mailbox = agent.mailbox
    for at, (held, _) in enumerate(mailbox):
        if held == seq:
            del mailbox[at]
            return
        if held > seq:
            return


def mark_redelivered(target: AgentRecord, seq: int | None, actions: list[Action]) -> list[Action]:
    """A re-dispatched REQUEST (numbered `seq` for `target`) is marked `redelivered`, as it is
    written now and as it is held for a resume (the copy stored is the plain one: a restart
    marks whatever it replays so anyway)."""
    mailbox = target.mailbox
    if mailbox and mailbox[-1][0] == seq:
        mailbox[-1] = (seq, mailbox[-1][1][:-1] + _REDELIVERED)
    return [
        Send(a.session, a.frame[:-1] + _REDELIVERED)
        if isinstance(a, Send) and a.session is target.session
        else a
        for a in actions
    ]


def no_candidate(pending: Addressed, *, failed_over: bool) -> tuple[ErrorCode, str, str | None]:
    """The final RESPONSE's code, sentence and path when no candidate takes `pending`: the
    first input-schema refusal met, if every candidate refused the arguments (a provider
    failed over had taken them: then none is left), else `no_provider`."""
    refusal = pending.refusal
    if refusal is not None and not failed_over:
        sentence = refusal.sentence(pending.capability, pending.refused_by)
        return ErrorCode.INVALID_INPUT, sentence, refusal.path
    matching = " matching the filters" if pending.filters else ""
    return (
        ErrorCode.NO_PROVIDER,
        f"no online agent offers capability '{clip(pending.capability)}' to "
        f"'{pending.requester}'{matching}",
        None,
    )


def scan(
    offering: dict[str, AgentRecord],
    last: str | None,
    pending: Addressed,
    ranked: list[Ranked] | None,
) -> Candidate | None:
    """One pass over the providers of `pending`'s capability (`offering`, `last` the one chosen
    last): the best candidate; each candidate with its rank (serving, turn) appended to
    `ranked` if given."""
    name = pending.capability
    requester, tried, filters = pending.requester, pending.tried, pending.filters
    after_last = last is None
    size = len(offering)
    best: Candidate | None = None
    best_rank = (0, 0)
    for position, (agent_id, record) in enumerate(offering.items()):
        turn = position if after_last else size + position
        if agent_id == last:
            after_last = True
        if (
            agent_id == requester
            or record.session is None  # offline (or on another node: see lobby.core.addressed)
            or (tried is not None and agent_id in tried)
        ):
            continue
        entry = record.capabilities[name]
        if entry.allowed is not None and requester not in entry.allowed:
            continue
        if filters:
            attributes = entry.model.attributes or {}
            if not all(f.test(attributes) for f in filters):
                continue
        found = (record.serving, turn)
        if ranked is not None:
            ranked.append((found, (record, entry)))
        if best is None or found < best_rank:
            best, best_rank = (record, entry), found
    return best


def rank(found: Ranked) -> tuple[int, int]:
    return found[0]


def verdict(pending: Addressed, entry: CapabilityEntry) -> InvalidInput | None:
    """What `entry`'s input schema says of `pending`'s arguments (None: accepted), each
    distinct schema asked once per REQUEST."""
    check = entry.input_check
    if check is None:
        return None
    verdicts = pending.verdicts
    if verdicts is None:
        verdicts = pending.verdicts = {}
    key = check.key
    if key in verdicts:
        return verdicts[key]
    invalid = check.invalid({"capability_name": pending.capability, **pending.arguments})
    verdicts[key] = invalid
    return invalid


def choose_elsewhere(
    providers: dict[str, dict[str, AgentRecord]],
    last: dict[str, str],
    pending: Addressed,
    online: dict[str, str],
) -> AgentRecord | None:
    """Cluster only, when no agent connected here can take `pending`: a provider connected
    to another node, in turn: one `online` there as the cluster's presence says first
    (`Presence.elsewhere`); failing that, one whose node last had it (the shared registry's
    home; its presence may not have reached here yet). Its node chooses among its own
    connected agents (`Addressing._pass_on`)."""
    name = pending.capability
    offering = providers.get(name)
    if not offering:
        return None
    requester, tried, filters = pending.requester, pending.tried, pending.filters
    previous = last.get(name)
    after_last = previous is None
    size = len(offering)
    best: AgentRecord | None = None
    best_turn = 0
    for position, (agent_id, record) in enumerate(offering.items()):
        turn = position if after_last else size + position
        if agent_id == previous:
            after_last = True
        if record.home is None or agent_id == requester or (tried and agent_id in tried):
            continue
        if agent_id not in online:
            turn += 2 * size  # after every provider online
        entry = record.capabilities[name]
        if entry.allowed is not None and requester not in entry.allowed:
            continue
        if filters and not all(f.test(entry.model.attributes or {}) for f in filters):
            continue
        if verdict(pending, entry) is not None:
            continue
        if best is None or turn < best_turn:
            best, best_turn = record, turn
    return best
