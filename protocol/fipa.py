"""FIPA negotiation dialogues: every rule that decides whether a move is legal, in one file.

Two rules shape this module (as in h11's state machine):
- everything that affects a transition lives here, and the transitions are one table;
- the module does not know which side it plays: the lobby uses it to refuse illegal moves
  before they reach the counterpart, an agent uses it to know what may come next.

A dialogue is identified by its `conversation_id`; each move is a message whose `message_id` is
the move id and whose `in_reply_to` is the move it answers (absent on the CFP). The rules:

- a dialogue starts with CFP, which names its two parties (sender = initiator, receiver =
  responder); a conversation_id already used by a dialogue cannot start another one;
- PROPOSE replies to CFP or PROPOSE; ACCEPT replies to PROPOSE; DECLINE replies to CFP and,
  as an extension of the OEF table, to PROPOSE; MATCH_ACCEPT replies to ACCEPT (TAC);
- the parties take turns, and a move may only reply to the other party's latest move;
- after DECLINE or MATCH_ACCEPT (or expiry) the dialogue is over.

Who is not a party to a dialogue learns nothing about it: the first rule checked is
`not_a_party`, whose text names no state and reads the same whether the dialogue exists or not
(a move other than CFP into an unknown dialogue breaks it too).

Sealed rounds: a CFP sent to several receivers at once may be sealed (`SealedRound`). Each
receiver gets its own dialogue, which starts in `cfp_sealed`: its PROPOSE is held by the lobby
(`proposal_held`), its DECLINE too (`decline_held`), until the round's deadline or until every
receiver has answered; then all the held proposals are revealed together (`proposal_revealed`)
in an order shuffled by the round's seed (`reveal_order`), and the buyer answers each as usual.
A reply after the deadline breaks the rule `sealed_reply_by_passed`. Until the reveal the buyer
learns nothing from its own moves: each is refused `round_not_revealed` whatever the receiver
did; and a receiver that answered is refused the same before the reveal as after it, so it
cannot tell when the others have answered.

Roles for the TAC controller: the CFP's `query` may say `"role": "buyer"` or `"seller"` for the
CFP's sender (TAC's CFP says which side its sender is on); without it the sender is the buyer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, Final

from protocol.errors import ProtocolError
from protocol.limits import clip


class Performative(StrEnum):
    CFP = "CFP"
    PROPOSE = "PROPOSE"
    ACCEPT = "ACCEPT"
    DECLINE = "DECLINE"
    MATCH_ACCEPT = "MATCH_ACCEPT"


class DialogueState(StrEnum):
    CFP_SENT = "cfp_sent"
    PROPOSED = "proposed"
    ACCEPTED = "accepted"
    MATCHED = "matched"
    DECLINED = "declined"
    EXPIRED = "expired"
    SEALED = "cfp_sealed"
    """A CFP of a sealed round, not yet answered."""
    HELD = "proposal_held"
    """A sealed round's PROPOSE, held by the lobby until the round is revealed."""
    DECLINE_HELD = "decline_held"
    """A sealed round's DECLINE, not shown to the buyer (nor counted as over) until the reveal."""
    REVEALED = "proposal_revealed"
    """A held PROPOSE, revealed to the buyer with the round's other bids."""


TERMINAL: Final = frozenset({DialogueState.MATCHED, DialogueState.DECLINED, DialogueState.EXPIRED})

TRANSITIONS: Final[dict[DialogueState, dict[Performative, DialogueState]]] = {
    DialogueState.CFP_SENT: {
        Performative.PROPOSE: DialogueState.PROPOSED,
        Performative.DECLINE: DialogueState.DECLINED,
    },
    DialogueState.PROPOSED: {
        Performative.PROPOSE: DialogueState.PROPOSED,
        Performative.ACCEPT: DialogueState.ACCEPTED,
        Performative.DECLINE: DialogueState.DECLINED,
    },
    DialogueState.ACCEPTED: {
        Performative.MATCH_ACCEPT: DialogueState.MATCHED,
    },
    DialogueState.SEALED: {
        Performative.PROPOSE: DialogueState.HELD,
        Performative.DECLINE: DialogueState.DECLINE_HELD,
    },
    DialogueState.HELD: {},
    DialogueState.DECLINE_HELD: {},
    DialogueState.REVEALED: {
        Performative.PROPOSE: DialogueState.PROPOSED,
        Performative.ACCEPT: DialogueState.ACCEPTED,
        Performative.DECLINE: DialogueState.DECLINED,
    },
}
"""state -> move -> next state. A move missing here is illegal in that state."""

LOBBY_TRANSITIONS: Final[dict[DialogueState, dict[str, DialogueState]]] = {
    DialogueState.CFP_SENT: {"reply_by passed": DialogueState.EXPIRED},
    DialogueState.SEALED: {"reply_by passed": DialogueState.EXPIRED},
    DialogueState.HELD: {"round revealed": DialogueState.REVEALED},
    DialogueState.DECLINE_HELD: {"round revealed": DialogueState.DECLINED},
}
"""state -> event -> next state: what the lobby's clock and sealed rounds do, not a party."""

START: Final = (Performative.CFP, DialogueState.CFP_SENT)
"""The only first move, and the state it leads to."""

BEFORE_REVEAL: Final = frozenset(
    {DialogueState.SEALED, DialogueState.HELD, DialogueState.DECLINE_HELD}
)
"""A sealed round's dialogue before the reveal: its buyer may not move in it."""


class IllegalMove(ProtocolError):
    """A move the rules forbid. `rule` is a stable identifier; the text names the move, the
    sender's role, the state and the rule."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{reason} (rule: {rule})")
        self.rule = rule
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Terms:
    """What a matched dialogue settled, for the controller's ledger."""

    buyer: str
    seller: str
    price: Decimal
    goods: Any


@dataclass(slots=True)
class Dialogue:
    dialogue_id: str
    initiator: str
    responder: str
    state: DialogueState
    last_move_id: str
    last_sender: str
    query: dict[str, Any]
    created_at: float
    updated_at: float
    reply_by: float | None = None
    """Absolute deadline for the first reply, from the CFP's `reply_by` seconds."""
    last_proposal: dict[str, Any] | None = None
    last_proposer: str | None = None
    accepted_proposal: dict[str, Any] | None = None
    accepted_proposer: str | None = None
    moves: int = 1
    transaction_id: str | None = field(default=None)
    round_id: str | None = None
    """The sealed round this dialogue belongs to, if any."""
    sealed_by: float | None = None
    """The sealed round's deadline (absolute): no reply from the responder after it."""

    @classmethod
    def start(
        cls,
        dialogue_id: str,
        sender: str,
        receiver: str,
        move_id: str,
        performative: str,
        in_reply_to: str | None,
        payload: dict[str, Any],
        now: float,
    ) -> Dialogue:
        """A new dialogue from its first move; `IllegalMove` unless it is a proper CFP."""
        if performative != Performative.CFP:
            # Refused as a foreign dialogue is: no one learns from it whether the id is in use.
            raise not_a_party(performative, sender, dialogue_id, receiver)
        if in_reply_to is not None:
            raise IllegalMove(
                "first_move_must_be_cfp", "a CFP starts a dialogue and replies to no move"
            )
        if sender == receiver:
            raise IllegalMove("not_a_party", "a dialogue needs two different parties")
        query = payload.get("query")
        if not isinstance(query, dict):
            raise IllegalMove("bad_payload", "a CFP payload needs an object 'query'")
        reply_by = payload.get("reply_by")
        deadline = None
        if reply_by is not None:
            if isinstance(reply_by, bool) or not isinstance(reply_by, int | float) or reply_by <= 0:
                raise IllegalMove("bad_payload", "'reply_by' must be a positive number of seconds")
            deadline = now + float(reply_by)
        role = query.get("role", "buyer")
        if role not in ("buyer", "seller"):
            raise IllegalMove("bad_payload", "the CFP query's 'role' must be 'buyer' or 'seller'")
        return cls(
            dialogue_id,
            sender,
            receiver,
            DialogueState.CFP_SENT,
            move_id,
            sender,
            query,
            now,
            now,
            reply_by=deadline,
        )

    @property
    def is_over(self) -> bool:
        return self.state in TERMINAL

    def role_of(self, agent_id: str) -> str:
        if agent_id == self.initiator:
            return "initiator"
        if agent_id == self.responder:
            return "responder"
        return "outsider"

    def other(self, agent_id: str) -> str:
        return self.responder if agent_id == self.initiator else self.initiator

    def check(
        self,
        sender: str,
        receiver: str,
        performative: str,
        in_reply_to: str | None,
        payload: dict[str, Any],
        now: float | None = None,
    ) -> DialogueState:
        """The state this move leads to, or `IllegalMove`. Changes nothing. `now` is needed
        only to refuse a late reply in a sealed round."""
        # Who may move is settled first, before any state is looked at: an outsider's
        # refusal must read the same whatever the dialogue's state (`not_a_party`).
        role = self.role_of(sender)
        if role == "outsider" or receiver != self.other(sender):
            raise not_a_party(performative, sender, self.dialogue_id, receiver)
        if self.sealed_by is not None:
            self._check_sealed(performative, sender, self.sealed_by, now)
        where = f"dialogue {clip(self.dialogue_id)!r} is {self.state}"
        if self.is_over:
            raise IllegalMove("dialogue_over", f"{performative} refused: {where}, it is over")
        if performative == Performative.CFP:
            raise IllegalMove(
                "conversation_id_in_use",
                f"CFP refused: conversation_id {clip(self.dialogue_id)!r} already names a dialogue",
            )
        if sender == self.last_sender:
            raise IllegalMove(
                "turn_taking",
                f"{performative} from the {role} refused: {where} and it is the other party's turn",
            )
        if in_reply_to != self.last_move_id:
            raise IllegalMove(
                "reply_to_latest_move",
                f"{performative} from the {role} refused: it must reply to the latest move "
                f"{clip(self.last_move_id)!r}, not "
                f"{None if in_reply_to is None else clip(in_reply_to)!r}",
            )
        allowed = TRANSITIONS.get(self.state, {})
        try:
            state = allowed[Performative(performative)]
        except (KeyError, ValueError):
            legal = ", ".join(allowed) or "nothing"
            raise IllegalMove(
                "invalid_reply",
                f"{performative} from the {role} refused: {where}, where only {legal} may follow",
            ) from None
        if performative == Performative.PROPOSE:
            proposal = payload.get("proposal")
            if not isinstance(proposal, dict):
                raise IllegalMove("bad_payload", "a PROPOSE payload needs an object 'proposal'")
            if "price" in proposal:
                price_of(proposal)
        return state

    def _check_sealed(
        self, performative: str, sender: str, sealed_by: float, now: float | None
    ) -> None:
        """The rules of a sealed round's dialogue for its parties. Each refusal reads the same
        whatever the other receivers did: the buyer gets `round_not_revealed` in every state
        before the reveal, and a receiver that answered is refused alike before and after it."""
        round_id = clip(str(self.round_id))
        if sender == self.initiator:
            if self.state in BEFORE_REVEAL:
                raise IllegalMove(
                    "round_not_revealed",
                    f"{performative} refused: sealed round {round_id!r} is not revealed yet; "
                    f"its buyer moves in dialogue {clip(self.dialogue_id)!r} after BIDS_REVEALED",
                )
            return
        state = self.state
        if (
            now is not None
            and now >= sealed_by
            and state in (DialogueState.SEALED, DialogueState.EXPIRED)
        ):
            raise IllegalMove(
                "sealed_reply_by_passed",
                f"{performative} refused: sealed round {round_id!r} closed at "
                f"its reply_by deadline {sealed_by:.3f} (Unix time), before this reply",
            )
        if state in (DialogueState.DECLINE_HELD, DialogueState.DECLINED):
            raise IllegalMove(
                "dialogue_over",
                f"{performative} refused: dialogue {clip(self.dialogue_id)!r} is declined, "
                "it is over",
            )
        if state in (DialogueState.HELD, DialogueState.REVEALED):
            raise IllegalMove(
                "turn_taking",
                f"{performative} from the responder refused: dialogue "
                f"{clip(self.dialogue_id)!r} waits for the buyer's answer to the proposal "
                f"{clip(self.last_move_id)!r}",
            )

    def apply(
        self,
        sender: str,
        receiver: str,
        move_id: str,
        performative: str,
        in_reply_to: str | None,
        payload: dict[str, Any],
        now: float,
    ) -> DialogueState:
        """Check the move, then record it; returns the new state."""
        state = self.check(sender, receiver, performative, in_reply_to, payload, now)
        if performative == Performative.PROPOSE:
            self.last_proposal, self.last_proposer = payload["proposal"], sender
        elif performative == Performative.ACCEPT:
            self.accepted_proposal, self.accepted_proposer = self.last_proposal, self.last_proposer
        self.state = state
        self.last_move_id = move_id
        self.last_sender = sender
        self.updated_at = now
        self.reply_by = None
        self.moves += 1
        return state

    def reveal(self, now: float) -> None:
        """The lobby revealed this held proposal to the buyer (`LOBBY_TRANSITIONS`)."""
        self.state = LOBBY_TRANSITIONS[self.state]["round revealed"]
        self.updated_at = now

    def expire(self, now: float) -> None:
        self.state = DialogueState.EXPIRED
        self.updated_at = now

    def terms(self) -> Terms | None:
        """The settled trade, once MATCHED and if the accepted proposal carried a price."""
        proposal = self.accepted_proposal
        if self.state != DialogueState.MATCHED or proposal is None or "price" not in proposal:
            return None
        initiator_sells = self.query.get("role") == "seller"
        seller = self.initiator if initiator_sells else self.responder
        buyer = self.responder if initiator_sells else self.initiator
        return Terms(buyer, seller, price_of(proposal), proposal.get("goods"))

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Dialogue:
        values = dict(data)
        values["state"] = DialogueState(values["state"])
        return cls(**values)


MAX_ROUND_RECEIVERS: Final = 1000
"""Receivers one sealed round may ask."""
MAX_ROUND_REPLY_BY: Final = 86_400
"""Seconds a sealed round may stay open (24 h): its dialogues count toward the buyer's open
dialogues and cannot idle out until it is revealed, so an endless round would hold them."""
MAX_ROUND_ID_LENGTH: Final = 100
"""A round's dialogue ids are `<round_id>:<receiver>`, which must fit the id limit (256)."""


@dataclass(slots=True)
class SealedRound:
    """A sealed-bid CFP: one dialogue per receiver (`dialogue_id(receiver)`), their PROPOSEs
    held until `reply_by` (absolute) or until every receiver has answered, then revealed to
    the `buyer` together in `reveal_order(seed, ...)`."""

    round_id: str
    buyer: str
    receivers: list[str]
    reply_by: float
    seed: str
    created_at: float
    revealed_at: float | None = None
    declined: dict[str, str | None] = field(default_factory=dict)
    """Receiver -> the reason of its DECLINE, for the reveal."""

    @classmethod
    def parse(
        cls, round_id: str, buyer: str, payload: dict[str, Any], seed: str, now: float
    ) -> SealedRound:
        """The round a CFP to the lobby asks for; `IllegalMove` (`bad_payload`) unless its
        `sealed` is `{"reply_by": seconds}` and `receivers` a list of other agents' ids (the
        lobby resolves a `capability_name` to that list before)."""
        sealed = payload.get("sealed")
        reply_by = sealed.get("reply_by") if isinstance(sealed, dict) else None
        if isinstance(reply_by, bool) or not isinstance(reply_by, int | float) or reply_by <= 0:
            raise IllegalMove(
                "bad_payload",
                "a CFP to several receivers needs 'sealed': {'reply_by': positive seconds}",
            )
        if reply_by > MAX_ROUND_REPLY_BY:
            raise IllegalMove(
                "bad_payload",
                f"a sealed round stays open at most {MAX_ROUND_REPLY_BY} seconds (24 h); "
                "its 'sealed' 'reply_by' asks for longer",
            )
        if len(round_id) > MAX_ROUND_ID_LENGTH:
            raise IllegalMove(
                "bad_payload",
                f"a sealed round's conversation_id has at most {MAX_ROUND_ID_LENGTH} characters",
            )
        receivers = payload.get("receivers")
        if (
            not isinstance(receivers, list)
            or not receivers
            or not all(isinstance(r, str) for r in receivers)
        ):
            raise IllegalMove(
                "bad_payload", "a sealed CFP needs 'receivers': a non-empty list of agent ids"
            )
        if len(receivers) > MAX_ROUND_RECEIVERS:
            raise IllegalMove(
                "bad_payload", f"a sealed CFP asks at most {MAX_ROUND_RECEIVERS} receivers"
            )
        if len(set(receivers)) != len(receivers) or buyer in receivers:
            raise IllegalMove(
                "bad_payload",
                "a sealed CFP's receivers must be distinct and not include its sender",
            )
        return cls(round_id, buyer, list(receivers), now + float(reply_by), seed, now)

    def dialogue_id(self, receiver: str) -> str:
        return f"{self.round_id}:{receiver}"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SealedRound:
        return cls(**data)


def not_a_party(performative: str, sender: str, dialogue_id: str, receiver: str) -> IllegalMove:
    """The refusal of a move by someone who is not a party to `dialogue_id` (or not to
    `receiver`), or into a dialogue that does not exist: it names no state, so it tells the
    sender nothing it did not send."""
    return IllegalMove(
        "not_a_party",
        f"{performative} refused: {sender!r} has no dialogue {clip(dialogue_id)!r} with "
        f"{receiver!r}; only a dialogue's two parties may move in it, to each other",
    )


def reveal_order(seed: str, bidders: list[str]) -> list[str]:
    """The order a sealed round reveals its bids in: by SHA-256 of `"<seed>:<agent_id>"` (hex),
    so anyone holding the recorded seed can check it, in any language."""
    return sorted(bidders, key=lambda b: hashlib.sha256(f"{seed}:{b}".encode()).hexdigest())


def price_of(proposal: dict[str, Any]) -> Decimal:
    raw = proposal.get("price")
    not_a_number = IllegalMove(
        "bad_payload", "PROPOSE refused: the proposal's 'price' is no number"
    )
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise not_a_number
    try:
        price = Decimal(str(raw))
    except InvalidOperation:
        raise not_a_number from None
    if not price.is_finite() or price < 0:
        raise IllegalMove(
            "bad_payload", "PROPOSE refused: the proposal's 'price' must be a non-negative number"
        )
    return price


def mermaid_diagram() -> str:
    """The state diagram, generated from `TRANSITIONS` so the docs cannot drift from the code."""
    lines = ["stateDiagram-v2", f"    [*] --> {START[1]}: {START[0]}"]
    for state, moves in TRANSITIONS.items():
        for move, target in moves.items():
            lines.append(f"    {state} --> {target}: {move}")
    for state, events in LOBBY_TRANSITIONS.items():
        for event, target in events.items():
            lines.append(f"    {state} --> {target}: {event}")
    lines += [f"    {state} --> [*]" for state in sorted(TERMINAL)]
    return "\n".join(lines)
