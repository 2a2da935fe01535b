"""Negotiation for agents: FIPA dialogues as handles, typed callbacks, and the Agora auction.

A `DialogueHandle` keeps the agent's own view of a dialogue with `protocol.fipa` (the same rules
the lobby enforces), so an illegal move raises `IllegalMoveError` (naming the rule) here before
it is sent. Queries and proposals are dicts or pydantic models (money as `Decimal`), as
capabilities' payloads are. A negotiation reads top to bottom:

    dialogue = await agent.cfp("seller", Wanted(goods=Apples(apples=3)))
    offer = await dialogue.next_proposal(Offer, timeout=5)    # the seller's PROPOSE, typed
    deal = await dialogue.conclude(timeout=5)                 # ACCEPT .. TRANSACTION_CONFIRMED
    deal.amount                                               # Decimal("12.00")

`conclude()` is the one call that ends a dialogue in a trade, from either side: it accepts the
counterpart's proposal (or waits for this agent's own to be accepted), sends MATCH_ACCEPT when
it is this agent's to send, and returns the lobby's confirmed `Transaction`. An agent whose
proposal is accepted sends MATCH_ACCEPT by itself unless it overrides `on_accept`.

Every move that arrives after the CFP is queued on its handle (for `next_move`) and every move
is passed to the matching callback (`on_cfp`, `on_propose`, ...); an agent may use either style.
Annotate a callback's `query`, `proposal` or `transaction` with a pydantic model to receive one;
a CFP or PROPOSE that does not fit the model is declined with a reason naming the problem.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Coroutine
from typing import Any, get_type_hints

from pydantic import BaseModel, ValidationError

from agent_sdk.caller import Caller
from agent_sdk.dialogue import DialogueHandle, Move, Transaction, dump, parse_as
from agent_sdk.errors import IllegalMoveError, PayloadError
from agent_sdk.logs import log
from protocol.fipa import Dialogue, IllegalMove, Performative
from protocol.models import Message, MessageType

__all__ = ["DialogueHandle", "Move", "Negotiator", "Transaction"]


class Negotiator(Caller):
    """Dialogues and their callbacks; mixed into `Agent`. Owns this agent's dialogues, by id,
    and the routes of the FIPA moves, TRANSACTION_CONFIRMED and DIALOGUE_EXPIRED."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self._dialogues: dict[str, DialogueHandle] = {}
        self._content_models = _content_models(type(self))
        for performative in Performative:
            self._routes[MessageType(performative.value)] = self._on_move
        self._routes[MessageType.TRANSACTION_CONFIRMED] = self._on_transaction_confirmed
        self._routes[MessageType.DIALOGUE_EXPIRED] = self._on_dialogue_expired

    # -- callbacks (override) -------------------------------------------------------------

    async def on_cfp(self, dialogue: DialogueHandle, query: Any) -> None:
        """A CFP opened `dialogue`; answer with `dialogue.propose(...)` or `.decline()`.
        `query` is a dict, or the pydantic model `query` is annotated with."""

    async def on_propose(self, dialogue: DialogueHandle, proposal: Any) -> None:
        """The counterpart proposed: a dict, or the model `proposal` is annotated with."""

    async def on_accept(self, dialogue: DialogueHandle) -> None:
        """The counterpart accepted this agent's proposal. By default, confirm it with
        MATCH_ACCEPT (the only move left); override to do more, and call `match_accept()`."""
        await dialogue.match_accept()

    async def on_decline(self, dialogue: DialogueHandle, reason: str | None) -> None:
        """The counterpart declined; the dialogue is over."""

    async def on_match_accept(self, dialogue: DialogueHandle) -> None:
        """The counterpart confirmed the accepted proposal; the dialogue is over."""

    async def on_transaction_confirmed(self, transaction: Any) -> None:
        """The lobby recorded a trade this agent is party to: a dict, or a `Transaction` if
        `transaction` is annotated so."""

    async def on_dialogue_expired(self, dialogue_id: str, reason: str) -> None:
        """The lobby ended a dialogue whose deadline passed."""

    # -- starting ---------------------------------------------------------------------------

    async def cfp(
        self,
        agent_id: str,
        query: dict[str, Any] | BaseModel,
        *,
        reply_by: float | None = None,
        dialogue_id: str | None = None,
    ) -> DialogueHandle:
        """Open a dialogue with a CFP to `agent_id` (`query`: a dict or a model); returns its
        handle. `IllegalMoveError` if the CFP breaks a rule (e.g. `dialogue_id` in use)."""
        dialogue_id = dialogue_id or uuid.uuid4().hex
        payload: dict[str, Any] = {"query": dump(query)}
        if reply_by is not None:
            payload["reply_by"] = reply_by
        move_id = uuid.uuid4().hex
        now = asyncio.get_running_loop().time()
        if dialogue_id in self._dialogues:
            raise IllegalMoveError(
                "conversation_id_in_use", f"dialogue {dialogue_id!r} exists already"
            )
        try:
            view = Dialogue.start(
                dialogue_id, self.agent_id, agent_id, move_id, "CFP", None, payload, now
            )
        except IllegalMove as illegal:
            raise IllegalMoveError(illegal.rule, illegal.reason) from None
        handle = DialogueHandle(self, view)
        self._dialogues[dialogue_id] = handle
        await self.send(
            agent_id,
            MessageType.CFP,
            payload,
            conversation_id=dialogue_id,
            message_id=move_id,
        )
        return handle

    def dialogue(self, dialogue_id: str) -> DialogueHandle | None:
        return self._dialogues.get(dialogue_id)

    # -- dispatch ---------------------------------------------------------------------------

    def _on_move(self, message: Message) -> Coroutine[Any, Any, None] | None:
        handle = self._incoming_move(message)
        if handle is None:
            return None
        if message.message_type is not MessageType.CFP:  # the CFP is what the handle starts from
            handle._received(Move(message.message_type, message.payload, message))
        return self._move_callback(handle, message)

    def _on_transaction_confirmed(self, message: Message) -> Coroutine[Any, Any, None]:
        raw = message.payload.get("transaction", {})
        handle = self._dialogues.get(message.conversation_id or "")
        if handle is not None:
            try:
                handle.transaction = Transaction.model_validate(raw)
            except ValidationError as exc:
                log.warning("TRANSACTION_UNREADABLE", agent_id=self.agent_id, error=str(exc))
            handle._received(Move(message.message_type, message.payload, message))
        return self._typed_callback(self.on_transaction_confirmed, "transaction", raw)

    def _on_dialogue_expired(self, message: Message) -> Coroutine[Any, Any, None]:
        dialogue_id = message.conversation_id or ""
        handle = self._dialogues.get(dialogue_id)
        if handle is not None:
            handle.view.expire(asyncio.get_running_loop().time())
            handle._received(Move(message.message_type, message.payload, message))
        return self.on_dialogue_expired(dialogue_id, str(message.payload.get("reason", "")))

    def _incoming_move(self, message: Message) -> DialogueHandle | None:
        """Apply a move the lobby let through to this agent's view of the dialogue."""
        dialogue_id = message.conversation_id or ""
        move_id = message.message_id or ""
        now = asyncio.get_running_loop().time()
        handle = self._dialogues.get(dialogue_id)
        try:
            if handle is None:
                view = Dialogue.start(
                    dialogue_id,
                    message.sender_id,
                    self.agent_id,
                    move_id,
                    message.message_type,
                    message.in_reply_to,
                    message.payload,
                    now,
                )
                handle = self._dialogues[dialogue_id] = DialogueHandle(self, view)
                handle.traceparent = message.traceparent
            else:
                handle.view.apply(
                    message.sender_id,
                    self.agent_id,
                    move_id,
                    message.message_type,
                    message.in_reply_to,
                    message.payload,
                    now,
                )
        except IllegalMove as illegal:
            # The lobby checks the same rules, so this only happens if the views diverged
            # (e.g. this agent restarted mid-dialogue).
            log.warning("DIALOGUE_OUT_OF_STEP", agent_id=self.agent_id, error=str(illegal))
            return None
        return handle

    async def _move_callback(self, handle: DialogueHandle, message: Message) -> None:
        payload, kind = message.payload, message.message_type
        if kind is MessageType.CFP:
            await self._typed_move(handle, self.on_cfp, "query", payload.get("query", {}))
        elif kind is MessageType.PROPOSE:
            await self._typed_move(handle, self.on_propose, "proposal", payload.get("proposal"))
        elif kind is MessageType.ACCEPT:
            await self.on_accept(handle)
        elif kind is MessageType.DECLINE:
            await self.on_decline(handle, payload.get("reason"))
        elif kind is MessageType.MATCH_ACCEPT:
            await self.on_match_accept(handle)

    async def _typed_move(
        self, handle: DialogueHandle, callback: Any, field: str, raw: Any
    ) -> None:
        """Call `callback(handle, content)`, the content parsed into the callback's model; a
        move that does not fit it is declined, with the reason."""
        model = self._content_models.get(field)
        if model is None:
            await callback(handle, raw)
            return
        try:
            content = parse_as(model, raw, f"the {field}")
        except PayloadError as exc:
            await handle.decline(str(exc)[:500])
            return
        await callback(handle, content)

    async def _typed_callback(self, callback: Any, field: str, raw: Any) -> None:
        model = self._content_models.get(field)
        await callback(raw if model is None else parse_as(model, raw, f"the {field}"))


def _content_models(cls: type) -> dict[str, type[BaseModel]]:
    """The pydantic models the callbacks of `cls` annotate their content with, by field."""
    found: dict[str, type[BaseModel]] = {}
    for name, field in (
        ("on_cfp", "query"),
        ("on_propose", "proposal"),
        ("on_transaction_confirmed", "transaction"),
    ):
        function = getattr(cls, name)
        annotation = get_type_hints(function).get(field)
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            found[field] = annotation
    return found
