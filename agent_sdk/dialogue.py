"""`DialogueHandle`: one FIPA dialogue from this agent's side, its moves typed; `Transaction`.

How an agent opens and answers dialogues, and the whole story, is in `agent_sdk.negotiation`.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from agent_sdk.errors import (
    DialogueEndedError,
    DialogueError,
    IllegalMoveError,
    MoveTimeoutError,
    PayloadError,
)
from protocol.fipa import Dialogue, DialogueState, IllegalMove, Performative
from protocol.models import Message, MessageType

MOVE_QUEUE_SIZE = 64

M = TypeVar("M", bound=BaseModel)

_CONTENT = {
    MessageType.CFP: "query",
    MessageType.PROPOSE: "proposal",
    MessageType.TRANSACTION_CONFIRMED: "transaction",
}
"""The payload field a move carries its content in."""

_ENDINGS = {
    DialogueState.DECLINED: "it was declined",
    DialogueState.EXPIRED: "the lobby ended it (its deadline passed)",
}


class Transaction(BaseModel):
    """A trade the lobby recorded (TRANSACTION_CONFIRMED), with its amount as an exact
    `Decimal`."""

    transaction_id: str
    kind: str
    buyer: str
    seller: str
    amount: Decimal
    goods: Any = None
    """What was traded: as the accepted proposal's model declares its `goods` when this agent
    proposed it as a model or read it as one (`next_proposal(Offer)`, an annotated
    `on_propose`), else as the JSON came (a dict...)."""
    reference: str
    """The dialogue id (or, for a payment, the paid proposal's message_id)."""
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Move:
    """A move received in a dialogue, or a lobby notice about it (TRANSACTION_CONFIRMED,
    DIALOGUE_EXPIRED)."""

    kind: str
    payload: dict[str, Any]
    message: Message

    @property
    def traceparent(self) -> str | None:
        """The W3C trace the move came in (a dialogue's moves share one), if any."""
        return self.message.traceparent

    @property
    def content(self) -> Any:
        """What the move carries: a CFP's query, a PROPOSE's proposal, a
        TRANSACTION_CONFIRMED's transaction; else the whole payload."""
        field = _CONTENT.get(MessageType(self.kind))
        return self.payload.get(field) if field is not None else self.payload

    def parse(self, model: type[M]) -> M:
        """The move's `content` as `model`; `PayloadError` if it does not fit."""
        return parse_as(model, self.content, f"the {self.kind}")


def parse_as(model: type[M], data: Any, what: str) -> M:
    """`data` validated as `model`, or `PayloadError` naming `what` and the problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(f"{what} does not fit {model.__name__}: {exc}", exc.errors()) from None


def dump(value: dict[str, Any] | BaseModel) -> dict[str, Any]:
    """A query or proposal as sent: a model in JSON mode (a `Decimal` as its exact text)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


class Party(Protocol):
    """What a dialogue uses of its agent (`agent_sdk.negotiation.Negotiator`): who it is and
    how it sends a move."""

    @property
    def agent_id(self) -> str: ...

    async def send(
        self,
        receiver_id: str,
        message_type: MessageType,
        payload: dict[str, Any],
        *,
        conversation_id: str | None = None,
        in_reply_to: str | None = None,
        message_id: str | None = None,
        traceparent: str | None = None,
    ) -> None: ...


class DialogueHandle:
    """One dialogue, from this agent's side: its state (`view`, the FIPA table's), the moves
    received in it, queued for `next_move()`, and the lobby's `transaction` once confirmed."""

    def __init__(self, agent: Party, view: Dialogue) -> None:
        self._agent = agent
        self.view = view
        self.dialogue_id = view.dialogue_id
        self.counterpart = view.other(agent.agent_id)
        self.transaction: Transaction | None = None
        self.traceparent: str | None = None
        """The dialogue's W3C trace, from the first move received in one: this side's moves
        are sent in it."""
        self._moves: asyncio.Queue[Move] = asyncio.Queue(MOVE_QUEUE_SIZE)
        self._changed = asyncio.Event()
        self._declined: tuple[str, str | None] | None = None
        """Who declined the dialogue and the reason they gave, once one side did."""
        self._proposal_models: dict[str, type[BaseModel]] = {}
        """The model each PROPOSE was made from (this agent's) or read as (the counterpart's),
        by move id: the confirmed trade's `goods` come back as that model declares them."""
        self._last_proposal_id: str | None = None

    @property
    def state(self) -> str:
        return self.view.state

    async def propose(self, proposal: dict[str, Any] | BaseModel) -> None:
        """Propose (to the CFP or as a counter-proposal): a dict or a model, money as
        `Decimal` (sent as an exact decimal string)."""
        move_id = await self._move(Performative.PROPOSE, {"proposal": dump(proposal)})
        if isinstance(proposal, BaseModel):
            self._proposal_models[move_id] = type(proposal)

    async def accept(self) -> None:
        """Accept the counterpart's latest proposal (see `conclude()` to also await the
        trade)."""
        await self._move(Performative.ACCEPT, {})

    async def decline(self, reason: str | None = None) -> None:
        await self._move(Performative.DECLINE, {"reason": reason} if reason else {})

    async def match_accept(self) -> None:
        """Confirm the accepted proposal (this agent's); a no-op if it already did."""
        if self.view.state is DialogueState.MATCHED and self.view.last_sender == self._me:
            return
        await self._move(Performative.MATCH_ACCEPT, {})

    async def next_move(self, timeout: float | None = None) -> Move:
        """The next move (or notice) received in this dialogue; `MoveTimeoutError` after
        `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await self._moves.get()
        except TimeoutError:
            raise MoveTimeoutError(
                f"no move in dialogue {self.dialogue_id!r} from {self.counterpart!r} in time"
            ) from None

    async def next_proposal(self, model: type[M], timeout: float | None = None) -> M:
        """The counterpart's next PROPOSE, as `model`. Raises `DialogueEndedError` if it
        declines or the dialogue expires instead, `DialogueError` if it accepts,
        `MoveTimeoutError` after `timeout`, `PayloadError` if the proposal does not fit."""
        if self._moves.empty():
            self._check_not_ended()  # no move is coming any more
        move = await self.next_move(timeout)
        if move.kind == MessageType.PROPOSE:
            proposal = move.parse(model)
            self.read_as(move.message.message_id, model)
            return proposal
        self._check_not_ended()
        raise DialogueError(f"{self.counterpart!r} answered {move.kind}, not PROPOSE")

    async def conclude(self, timeout: float | None = None) -> Transaction | None:
        """End the dialogue in a trade and return it: accept the counterpart's latest proposal
        (or, if the latest is this agent's, wait for the counterpart's ACCEPT), send
        MATCH_ACCEPT when it is this agent's to send, then wait for MATCH_ACCEPT and the
        lobby's TRANSACTION_CONFIRMED. None if the accepted proposal had no `price` (the lobby
        records no trade then). Raises `DialogueEndedError` if the dialogue is declined or
        expires, `DialogueError` if the counterpart proposes again instead of accepting or
        nothing was proposed yet, `MoveTimeoutError` after `timeout` seconds in all."""
        view, me = self.view, self._me
        if view.state is DialogueState.CFP_SENT:
            raise DialogueError(f"nothing proposed in dialogue {self.dialogue_id!r} yet")
        self._check_not_ended()
        try:
            async with asyncio.timeout(timeout):
                if view.state is DialogueState.PROPOSED and view.last_sender != me:
                    await self.accept()
                while True:
                    self._changed.clear()
                    if view.state is DialogueState.ACCEPTED and view.last_sender != me:
                        await self.match_accept()
                    if view.state is DialogueState.MATCHED and (
                        self.transaction is not None
                        or "price" not in (view.accepted_proposal or {})
                    ):
                        return self.transaction
                    self._check_not_ended()
                    if view.state is DialogueState.PROPOSED and view.last_sender != me:
                        raise DialogueError(f"{self.counterpart!r} proposed again")
                    await self._changed.wait()
        except TimeoutError:
            raise MoveTimeoutError(
                f"dialogue {self.dialogue_id!r} did not end in a trade in time"
            ) from None

    def read_as(self, proposal_id: str | None, model: type[BaseModel]) -> None:
        """Note that the PROPOSE `proposal_id` was read as `model`."""
        if proposal_id is not None:
            self._proposal_models[proposal_id] = model

    def confirmed(self, transaction: Transaction) -> Transaction:
        """The lobby's record of this dialogue's trade, its `goods` as the accepted proposal's
        model declares them (the proposal accepted is the dialogue's last); as they came
        (JSON: a dict, a list...) when no model was used or it declares no `goods`."""
        model = self._proposal_models.get(self._last_proposal_id or "")
        field = model.model_fields.get("goods") if model is not None else None
        if field is None or field.annotation is None or transaction.goods is None:
            return transaction
        try:
            goods = TypeAdapter(field.annotation).validate_python(transaction.goods)
        except ValidationError:
            return transaction  # the lobby records what was proposed: this does not happen
        return transaction.model_copy(update={"goods": goods})

    @property
    def _me(self) -> str:
        return self._agent.agent_id

    def _check_not_ended(self) -> None:
        ending = _ENDINGS.get(self.view.state)
        if ending is None:
            return
        reason = None
        if self._declined is not None:
            who, reason = self._declined
            ending = f"{who!r} declined it" + (f": {reason}" if reason else "")
        raise DialogueEndedError(
            f"dialogue {self.dialogue_id!r} is over: {ending}",
            kind=self.view.state,
            reason=reason,
        )

    async def _move(self, performative: Performative, payload: dict[str, Any]) -> str:
        me, loop = self._me, asyncio.get_running_loop()
        move_id = uuid.uuid4().hex
        target = self.view.last_move_id
        try:
            self.view.apply(
                me, self.counterpart, move_id, performative, target, payload, loop.time()
            )
        except IllegalMove as illegal:
            raise IllegalMoveError(illegal.rule, illegal.reason) from None
        if performative is Performative.DECLINE:
            self._declined = (me, payload.get("reason"))
        elif performative is Performative.PROPOSE:
            self._last_proposal_id = move_id
        await self._agent.send(
            self.counterpart,
            MessageType(performative.value),
            payload,
            conversation_id=self.dialogue_id,
            message_id=move_id,
            in_reply_to=target,
            traceparent=self.traceparent,
        )
        return move_id

    def _received(self, move: Move) -> None:
        if self.traceparent is None:
            self.traceparent = move.message.traceparent
        if move.kind == MessageType.DECLINE:
            reason = move.payload.get("reason")
            self._declined = (self.counterpart, reason if isinstance(reason, str) else None)
        elif move.kind == MessageType.PROPOSE:
            self._last_proposal_id = move.message.message_id
        if self._moves.full():
            self._moves.get_nowait()  # a handle nobody reads keeps the latest moves only
        self._moves.put_nowait(move)
        self._changed.set()
