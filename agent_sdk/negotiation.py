"""Negotiation for agents: FIPA dialogues as handles, typed callbacks, and the Agora auction.

A `DialogueHandle` keeps the agent's own view of a dialogue with `protocol.fipa` (the same rules
the lobby enforces), so an illegal move raises `IllegalMove` here before it is sent. A
negotiation reads top to bottom:

    dialogue = await agent.cfp("seller", {"goods": {"r": 1}})
    move = await dialogue.next_move(timeout=5)        # the seller's PROPOSE
    await dialogue.accept()

Every move that arrives after the CFP is queued on its handle (for `next_move`) and every move
is passed to the matching callback (`on_cfp`, `on_propose`, ...); an agent may use either style.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from agent_sdk.caller import Caller
from agent_sdk.logs import log
from protocol.fipa import Dialogue, IllegalMove, Performative
from protocol.models import Message, MessageType

MOVE_QUEUE_SIZE = 64


@dataclass(frozen=True, slots=True)
class Move:
    """A move received in a dialogue, or a lobby notice about it (TRANSACTION_CONFIRMED,
    DIALOGUE_EXPIRED)."""

    kind: str
    payload: dict[str, Any]
    message: Message


class DialogueHandle:
    """One dialogue, from this agent's side: its state (`view`, the FIPA table's) and the
    moves received in it, queued for `next_move()`."""

    def __init__(self, agent: Negotiator, view: Dialogue) -> None:
        self._agent = agent
        self.view = view
        self.dialogue_id = view.dialogue_id
        self.counterpart = view.other(agent.agent_id)
        self._moves: asyncio.Queue[Move] = asyncio.Queue(MOVE_QUEUE_SIZE)

    @property
    def state(self) -> str:
        return self.view.state

    async def propose(self, proposal: dict[str, Any]) -> None:
        await self._move(Performative.PROPOSE, {"proposal": proposal})

    async def accept(self) -> None:
        await self._move(Performative.ACCEPT, {})

    async def decline(self, reason: str | None = None) -> None:
        await self._move(Performative.DECLINE, {"reason": reason} if reason else {})

    async def match_accept(self) -> None:
        await self._move(Performative.MATCH_ACCEPT, {})

    async def next_move(self, timeout: float | None = None) -> Move:
        """The next move (or notice) received in this dialogue; `TimeoutError` after
        `timeout` seconds."""
        async with asyncio.timeout(timeout):
            return await self._moves.get()

    async def _move(self, performative: Performative, payload: dict[str, Any]) -> None:
        me, loop = self._agent.agent_id, asyncio.get_running_loop()
        move_id = uuid.uuid4().hex
        target = self.view.last_move_id
        self.view.apply(me, self.counterpart, move_id, performative, target, payload, loop.time())
        await self._agent.send(
            self.counterpart,
            MessageType(performative.value),
            payload,
            conversation_id=self.dialogue_id,
            message_id=move_id,
            in_reply_to=target,
        )

    def _received(self, move: Move) -> None:
        if self._moves.full():
            self._moves.get_nowait()  # a handle nobody reads keeps the latest moves only
        self._moves.put_nowait(move)


class Negotiator(Caller):
    """Dialogues and their callbacks; mixed into `Agent`. Owns this agent's dialogues, by id,
    and the routes of the FIPA moves, TRANSACTION_CONFIRMED and DIALOGUE_EXPIRED."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self._dialogues: dict[str, DialogueHandle] = {}
        for performative in Performative:
            self._routes[MessageType(performative.value)] = self._on_move
        self._routes[MessageType.TRANSACTION_CONFIRMED] = self._on_transaction_confirmed
        self._routes[MessageType.DIALOGUE_EXPIRED] = self._on_dialogue_expired

    # -- callbacks (override) -------------------------------------------------------------

    async def on_cfp(self, dialogue: DialogueHandle, query: dict[str, Any]) -> None:
        """A CFP opened `dialogue`; answer with `dialogue.propose(...)` or `.decline()`."""

    async def on_propose(self, dialogue: DialogueHandle, proposal: dict[str, Any]) -> None:
        """The counterpart proposed."""

    async def on_accept(self, dialogue: DialogueHandle) -> None:
        """The counterpart accepted this agent's proposal; confirm with `match_accept()`."""

    async def on_decline(self, dialogue: DialogueHandle, reason: str | None) -> None:
        """The counterpart declined; the dialogue is over."""

    async def on_match_accept(self, dialogue: DialogueHandle) -> None:
        """The counterpart confirmed the accepted proposal; the dialogue is over."""

    async def on_transaction_confirmed(self, transaction: dict[str, Any]) -> None:
        """The lobby recorded a trade this agent is party to."""

    async def on_dialogue_expired(self, dialogue_id: str, reason: str) -> None:
        """The lobby ended a dialogue whose deadline passed."""

    # -- starting ---------------------------------------------------------------------------

    async def cfp(
        self,
        agent_id: str,
        query: dict[str, Any],
        *,
        reply_by: float | None = None,
        dialogue_id: str | None = None,
    ) -> DialogueHandle:
        """Open a dialogue with a CFP to `agent_id`; returns its handle."""
        dialogue_id = dialogue_id or uuid.uuid4().hex
        payload: dict[str, Any] = {"query": query}
        if reply_by is not None:
            payload["reply_by"] = reply_by
        move_id = uuid.uuid4().hex
        now = asyncio.get_running_loop().time()
        view = Dialogue.start(
            dialogue_id, self.agent_id, agent_id, move_id, "CFP", None, payload, now
        )
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
        self._notice(message.conversation_id or "", message)
        return self.on_transaction_confirmed(message.payload.get("transaction", {}))

    def _on_dialogue_expired(self, message: Message) -> Coroutine[Any, Any, None]:
        dialogue_id = message.conversation_id or ""
        handle = self._notice(dialogue_id, message)
        if handle is not None:
            handle.view.expire(asyncio.get_running_loop().time())
        return self.on_dialogue_expired(dialogue_id, str(message.payload.get("reason", "")))

    def _notice(self, dialogue_id: str, message: Message) -> DialogueHandle | None:
        handle = self._dialogues.get(dialogue_id)
        if handle is not None:
            handle._received(Move(message.message_type, message.payload, message))
        return handle

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
            await self.on_cfp(handle, payload.get("query", {}))
        elif kind is MessageType.PROPOSE:
            await self.on_propose(handle, payload.get("proposal", {}))
        elif kind is MessageType.ACCEPT:
            await self.on_accept(handle)
        elif kind is MessageType.DECLINE:
            await self.on_decline(handle, payload.get("reason"))
        elif kind is MessageType.MATCH_ACCEPT:
            await self.on_match_accept(handle)
