"""Negotiation for agents: FIPA dialogues as handles, typed callbacks, and the Agora auction.

A `DialogueHandle` keeps the agent's own view of a dialogue with `protocol.fipa` (the same rules
the lobby enforces), so an illegal move raises `IllegalMoveError` (naming the rule) here before
it is sent. Queries and proposals are dicts or pydantic models (money as `Decimal`), as
capabilities' payloads are. A negotiation reads top to bottom:

    dialogue = await agent.cfp("seller", Wanted(goods=Apples(apples=3)))
    offer = await dialogue.next_proposal(Offer, timeout=5)    # the seller's PROPOSE, typed
    deal = await dialogue.conclude(timeout=5)                 # ACCEPT .. TRANSACTION_CONFIRMED
    deal.amount                                               # Decimal("12.00")

A CFP to a list of agents is a round, sealed by default when it asks more than one: the lobby
holds every PROPOSE until `reply_by` (or until all have answered) and reveals them together, in
an order it shuffles, so answering first wins nothing (PROTOCOL.md, 8.1):

    bids = await agent.cfp(["s1", "s2", "s3"], Wanted(...), reply_by=5)   # a `Round`
    best = min(bids.bids, key=lambda bid: bid.proposal["price"])
    deal = await best.dialogue.conclude(timeout=5)

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
from dataclasses import dataclass, field
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ValidationError

from agent_sdk.caller import Caller
from agent_sdk.dialogue import DialogueHandle, Move, Transaction, dump, parse_as
from agent_sdk.errors import IllegalMoveError, LobbyError, MoveTimeoutError, PayloadError
from agent_sdk.logs import log
from protocol.fipa import Dialogue, IllegalMove, Performative, SealedRound
from protocol.models import LOBBY_ID, Message, MessageType

__all__ = ["DialogueHandle", "Move", "Negotiator", "Round", "RoundBid", "Transaction"]

ROUND_REPLY_BY = 10.0
"""Seconds a round stays open when `cfp()` is not given `reply_by`."""
REVEAL_GRACE = 5.0
"""Seconds past a sealed round's deadline to wait for its reveal (the lobby reveals on its
once-a-second tick)."""


@dataclass(frozen=True, slots=True)
class RoundBid:
    """One PROPOSE of a round: answer it on `dialogue` (`accept()`, `conclude()`, ...)."""

    agent_id: str
    proposal: Any
    dialogue: DialogueHandle


@dataclass(slots=True)
class Round:
    """What a CFP to several agents brought: the `bids` (in the lobby's shuffled order for a
    sealed round, with its `seed`; in arrival order otherwise), who declined (with the
    reason) and who did not answer in time."""

    round_id: str
    bids: list[RoundBid] = field(default_factory=list)
    declined: dict[str, str | None] = field(default_factory=dict)
    unanswered: list[str] = field(default_factory=list)
    seed: str | None = None


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
        self._routes[MessageType.BIDS_REVEALED] = self._on_bids_revealed
        self._routes[MessageType.ERROR] = self._on_error
        self._reveals: dict[str, asyncio.Future[dict[str, Any]]] = {}
        """Sealed rounds this agent awaits -> their BIDS_REVEALED payload, once it comes."""

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

    @overload
    async def cfp(
        self,
        agent_id: str,
        query: dict[str, Any] | BaseModel,
        *,
        reply_by: float | None = None,
        dialogue_id: str | None = None,
    ) -> DialogueHandle: ...

    @overload
    async def cfp(
        self,
        agent_id: list[str],
        query: dict[str, Any] | BaseModel,
        *,
        reply_by: float | None = None,
        dialogue_id: str | None = None,
        sealed: bool | None = None,
    ) -> Round: ...

    async def cfp(
        self,
        agent_id: str | list[str],
        query: dict[str, Any] | BaseModel,
        *,
        reply_by: float | None = None,
        dialogue_id: str | None = None,
        sealed: bool | None = None,
    ) -> DialogueHandle | Round:
        """Open a dialogue with a CFP to `agent_id` (`query`: a dict or a model); returns its
        handle. `IllegalMoveError` if the CFP breaks a rule (e.g. `dialogue_id` in use).

        Given a list of agents, run a round and return it once its bids are in (`Round`):
        sealed (the default for more than one agent; `sealed=False` turns it off) the lobby
        reveals every bid at once after `reply_by` seconds (default `ROUND_REPLY_BY`, at most
        `protocol.fipa.MAX_ROUND_REPLY_BY`: `IllegalMoveError` before anything is sent) or when
        all have answered; unsealed, each agent gets its own CFP and the bids come as they
        arrive, within `reply_by`. `dialogue_id` is then the round id; each agent's dialogue
        is `<round id>:<agent id>`."""
        if isinstance(agent_id, list):
            round_id = dialogue_id or uuid.uuid4().hex
            seconds = ROUND_REPLY_BY if reply_by is None else reply_by
            if sealed is None:
                sealed = len(agent_id) > 1
            if sealed:
                return await self._sealed_round(agent_id, query, seconds, round_id)
            return await self._open_round(agent_id, query, seconds, round_id)
        return await self._cfp(agent_id, query, reply_by, dialogue_id)

    async def _cfp(
        self,
        agent_id: str,
        query: dict[str, Any] | BaseModel,
        reply_by: float | None,
        dialogue_id: str | None,
    ) -> DialogueHandle:
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

    async def _open_round(
        self,
        agent_ids: list[str],
        query: dict[str, Any] | BaseModel,
        reply_by: float,
        round_id: str,
    ) -> Round:
        """One plain CFP per agent; the first answer of each, as it arrives, within
        `reply_by`."""
        handles = [await self._cfp(a, query, reply_by, f"{round_id}:{a}") for a in agent_ids]
        result = Round(round_id)

        async def first_answer(handle: DialogueHandle) -> None:
            try:
                move = await handle.next_move(reply_by)
            except TimeoutError:
                result.unanswered.append(handle.counterpart)
                return
            if move.kind == MessageType.PROPOSE:
                result.bids.append(RoundBid(handle.counterpart, move.content, handle))
            elif move.kind == MessageType.DECLINE:
                result.declined[handle.counterpart] = move.payload.get("reason")
            else:
                result.unanswered.append(handle.counterpart)

        await asyncio.gather(*(first_answer(h) for h in handles))
        return result

    async def _sealed_round(
        self,
        agent_ids: list[str],
        query: dict[str, Any] | BaseModel,
        reply_by: float,
        round_id: str,
    ) -> Round:
        """One CFP to the lobby for all; the round as the lobby reveals it."""
        payload: dict[str, Any] = {
            "query": dump(query),
            "receivers": agent_ids,
            "sealed": {"reply_by": reply_by},
        }
        move_id = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        try:  # the lobby's own rules (e.g. `MAX_ROUND_REPLY_BY`), before anything is sent
            SealedRound.parse(round_id, self.agent_id, payload, "", loop.time())
        except IllegalMove as illegal:
            raise IllegalMoveError(illegal.rule, illegal.reason) from None
        offer = {"query": payload["query"], "reply_by": reply_by}
        views = {}
        for receiver in agent_ids:
            dialogue_id = f"{round_id}:{receiver}"
            if dialogue_id in self._dialogues or round_id in self._reveals:
                raise IllegalMoveError(
                    "conversation_id_in_use", f"dialogue {dialogue_id!r} exists already"
                )
            try:
                views[receiver] = Dialogue.start(
                    dialogue_id, self.agent_id, receiver, move_id, "CFP", None, offer, loop.time()
                )
            except IllegalMove as illegal:
                raise IllegalMoveError(illegal.rule, illegal.reason) from None
        handles = {r: DialogueHandle(self, view) for r, view in views.items()}
        for handle in handles.values():
            self._dialogues[handle.dialogue_id] = handle
        revealed = self._reveals[round_id] = loop.create_future()
        try:
            await self.send(
                LOBBY_ID, MessageType.CFP, payload, conversation_id=round_id, message_id=move_id
            )
            async with asyncio.timeout(reply_by + REVEAL_GRACE):
                reveal = await revealed
        except TimeoutError:
            raise MoveTimeoutError(f"sealed round {round_id!r} was not revealed in time") from None
        except LobbyError:
            for handle in handles.values():  # the lobby refused the round: it opened nothing
                self._dialogues.pop(handle.dialogue_id, None)
            raise
        finally:
            self._reveals.pop(round_id, None)
        result = Round(round_id, seed=reveal.get("seed"), unanswered=reveal.get("unanswered", []))
        now = loop.time()
        for bid in reveal.get("bids", []):
            bidder = handles.get(bid.get("sender_id"))
            if bidder is None:
                continue
            # The bid as if it had come on its own: this side's view is then `proposed`.
            bidder.view.apply(
                bidder.counterpart,
                self.agent_id,
                bid["message_id"],
                "PROPOSE",
                move_id,
                {"proposal": bid["proposal"]},
                now,
            )
            result.bids.append(RoundBid(bidder.counterpart, bid["proposal"], bidder))
        for declined in reveal.get("declined", []):
            refuser = handles.get(declined.get("sender_id"))
            if refuser is not None:
                view = refuser.view
                view.apply(view.responder, self.agent_id, "declined", "DECLINE", move_id, {}, now)
                result.declined[refuser.counterpart] = declined.get("reason")
        for agent_id in result.unanswered:
            if agent_id in handles:
                handles[agent_id].view.expire(now)
        return result

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
                handle.transaction = handle.confirmed(Transaction.model_validate(raw))
            except ValidationError as exc:
                log.warning("TRANSACTION_UNREADABLE", agent_id=self.agent_id, error=str(exc))
            handle._received(Move(message.message_type, message.payload, message))
            if self._content_models.get("transaction") is Transaction and handle.transaction:
                return self.on_transaction_confirmed(handle.transaction)  # goods typed too
        return self._typed_callback(self.on_transaction_confirmed, "transaction", raw)

    def _on_bids_revealed(self, message: Message) -> None:
        waiting = self._reveals.get(message.conversation_id or "")
        if waiting is not None and not waiting.done():
            waiting.set_result(message.payload)
        return None

    def _on_error(self, message: Message) -> Coroutine[Any, Any, None]:
        """A refused round CFP fails its `cfp()` at once; every ERROR still reaches
        `on_message`."""
        payload = message.payload
        waiting = self._reveals.get(str(payload.get("original_conversation_id") or ""))
        if (
            waiting is not None
            and not waiting.done()
            and message.sender_id == LOBBY_ID
            and payload.get("original_message_type") == MessageType.CFP
        ):
            code, error = str(payload.get("code")), str(payload.get("error"))
            waiting.set_exception(LobbyError(code, error))
        return self.on_message(message)

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
            model = self._content_models.get("proposal")
            if model is not None:
                handle.read_as(message.message_id, model)
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
    for name, content in (
        ("on_cfp", "query"),
        ("on_propose", "proposal"),
        ("on_transaction_confirmed", "transaction"),
    ):
        function = getattr(cls, name)
        annotation = get_type_hints(function).get(content)
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            found[content] = annotation
    return found
