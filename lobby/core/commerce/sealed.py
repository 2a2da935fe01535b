"""Sealed rounds: a CFP to several receivers whose PROPOSEs the lobby holds, then reveals at once.

A CFP addressed to `global_lobby` with `"sealed": {"reply_by": s}` and `receivers` (or a
`capability_name`) opens one dialogue per receiver, `<round_id>:<receiver>`, each starting in
`cfp_sealed` (protocol.fipa holds the rules). A receiver's PROPOSE or DECLINE is accepted,
confirmed and saved, but forwarded to nobody. When the deadline passes (`reveal_due`, from the
router's tick) or the last receiver answers, the buyer gets one BIDS_REVEALED with every held
proposal in `reveal_order` of the round's seed, and answers each dialogue as usual. The round
(with its seed) and its dialogues are saved whole, so a restart keeps held bids and deadline.
"""

from __future__ import annotations

import heapq
import secrets
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from lobby.core.records import Effect, StateRemoved, StateSaved
from lobby.core.refusal import unknown_receiver
from lobby.core.session import Action, AgentRecord, Session
from protocol.fipa import Dialogue, DialogueState, IllegalMove, SealedRound, reveal_order
from protocol.limits import clip
from protocol.models import ErrorCode, Message, MessageType

if TYPE_CHECKING:
    from lobby.core.state import LobbyState

KIND = "sealed_round"
"""The kind its rounds are saved under (`StateSaved`)."""

UNREVEALED = frozenset(
    {
        DialogueState.SEALED,
        DialogueState.HELD,
        DialogueState.DECLINE_HELD,
        DialogueState.EXPIRED,
    }
)
"""States in which a round's dialogue is handled here rather than forwarded."""


class Dialogues(Protocol):
    """What a sealed round uses of `Negotiations`: its dialogue bookkeeping, which it shares."""

    state: LobbyState
    dialogues: dict[str, Dialogue]
    traces: dict[str, str]
    started: dict[str, int]

    def opened(self, dialogue: Dialogue) -> None: ...
    def save(self, dialogue: Dialogue) -> None: ...
    def finish(self, dialogue: Dialogue) -> None: ...


class SealedRounds:
    """Every sealed round, open or revealed (until forgotten with its dialogues); part of
    `Negotiations`, whose dialogue bookkeeping it shares."""

    def __init__(self, negotiations: Dialogues) -> None:
        self.negotiations = negotiations
        self.rounds: dict[str, SealedRound] = {}
        self.waiting: dict[str, int] = {}
        """Open round -> receivers that have neither proposed nor declined."""
        self.revealed: dict[str, float] = {}
        """Revealed rounds -> when, oldest first, for `forget`."""
        self._due: list[tuple[float, str]] = []

    def cfp(self, session: Session, agent: AgentRecord, msg: Message, now: float) -> list[Action]:
        """A CFP to `global_lobby`: open a sealed round and send each receiver its CFP."""
        negotiations = self.negotiations
        state = negotiations.state
        round_id, move_id = msg.conversation_id, msg.message_id
        assert round_id is not None  # checked by `move`
        assert move_id is not None  # set by `move`
        payload = dict(msg.payload)
        if round_id in self.rounds:
            state.refuse(
                ErrorCode.INVALID_DIALOGUE,
                f"CFP refused: conversation_id {clip(round_id)!r} already names a sealed round "
                "(rule: conversation_id_in_use)",
            )
        name = payload.get("capability_name")
        if payload.get("receivers") is None and isinstance(name, str):
            payload["receivers"] = sorted(
                a.agent_id
                for a in state.registry.agents.values()
                if name in a.capabilities and a.agent_id != agent.agent_id
            )
            if not payload["receivers"]:
                state.refuse(
                    ErrorCode.UNKNOWN_RECEIVER,
                    f"no other agent offers capability {clip(name)!r}; the CFP reached nobody",
                )
        try:
            sealed = SealedRound.parse(
                round_id, agent.agent_id, payload, secrets.token_hex(16), now
            )
        except IllegalMove as illegal:
            state.refuse(ErrorCode.INVALID_DIALOGUE, str(illegal))
        targets = []
        for receiver in sealed.receivers:
            target = state.registry.agents.get(receiver)
            if target is None:
                state.refuse(ErrorCode.UNKNOWN_RECEIVER, unknown_receiver(receiver))
            if sealed.dialogue_id(receiver) in negotiations.dialogues:
                state.refuse(
                    ErrorCode.INVALID_DIALOGUE,
                    f"CFP refused: dialogue {clip(sealed.dialogue_id(receiver))!r} exists "
                    "already (rule: conversation_id_in_use)",
                )
            if len(target.mailbox) >= state.delivery.mailbox_limit:
                state.refuse(
                    ErrorCode.MAILBOX_FULL,
                    f"agent {receiver!r} already holds {state.delivery.mailbox_limit} "
                    "undelivered messages; the sealed CFP reached nobody",
                )
            targets.append(target)
        limit = state.limits.max_open_dialogues
        started = negotiations.started.get(agent.agent_id, 0)
        if limit and started + len(targets) > limit:
            state.refuse(
                ErrorCode.LIMIT_EXCEEDED,
                f"agent {agent.agent_id!r} has {started} open dialogues it started; a round of "
                f"{len(targets)} more would pass {limit}: this CFP was not routed",
            )
        seconds = payload["sealed"]["reply_by"]
        offer = {
            "query": payload.get("query"),
            "reply_by": seconds,
            "sealed": {"reply_by": seconds, "round_id": round_id},
        }
        dialogues = []
        try:
            for receiver in sealed.receivers:
                dialogues.append(
                    Dialogue.start(
                        sealed.dialogue_id(receiver),
                        agent.agent_id,
                        receiver,
                        move_id,
                        MessageType.CFP,
                        msg.in_reply_to,
                        offer,
                        now,
                    )
                )
        except IllegalMove as illegal:
            state.refuse(ErrorCode.INVALID_DIALOGUE, str(illegal))
        actions: list[Action] = []
        traces = negotiations.traces
        for target, dialogue in zip(targets, dialogues, strict=True):
            dialogue.state, dialogue.reply_by = DialogueState.SEALED, None
            dialogue.round_id, dialogue.sealed_by = round_id, sealed.reply_by
            copy = Message(
                agent.agent_id,
                target.agent_id,
                MessageType.CFP,
                offer,
                dialogue.dialogue_id,
                message_id=move_id,
                traceparent=msg.traceparent,
            )
            # Not forced: every mailbox had room for its one CFP (checked above, before any).
            actions += state.deliver(target, copy, None, Effect.NONE, now)
            if copy.traceparent is not None:  # the dialogue's first traced move, as in `move`
                traces[dialogue.dialogue_id] = copy.traceparent
            negotiations.opened(dialogue)
        state.delivery.seen[(agent.agent_id, move_id)] = now
        state.delivery.confirm(session, move_id, msg.traceparent)
        self.rounds[round_id] = sealed
        self.waiting[round_id] = len(dialogues)
        heapq.heappush(self._due, (sealed.reply_by, round_id))
        self._save(sealed)
        return actions

    def answer(
        self, session: Session, agent: AgentRecord, msg: Message, dialogue: Dialogue, now: float
    ) -> list[Action]:
        """A move in a round's dialogue not yet revealed: a receiver's PROPOSE and DECLINE are
        held, and neither forwarded; anything else is refused by the rules. Nothing here may
        depend on what the other receivers did: the buyer, and every other agent, must learn
        nothing of it before the reveal (a DECLINE even leaves the dialogue open till then, so
        the buyer's count of open dialogues does not tell it either)."""
        state = self.negotiations.state
        move_id = msg.message_id
        assert move_id is not None  # set by `move`
        if (
            dialogue.state is DialogueState.HELD
            and move_id == dialogue.last_move_id
            and agent.agent_id == dialogue.responder  # no one else may learn the bid's id
        ):
            state.delivery.confirm(session, move_id)  # a resend of the held bid
            return []
        try:
            dialogue.apply(
                agent.agent_id,
                msg.receiver_id,
                move_id,
                msg.message_type,
                msg.in_reply_to,
                msg.payload,
                now,
            )
        except IllegalMove as illegal:
            state.refuse(ErrorCode.INVALID_DIALOGUE, str(illegal))
        state.delivery.seen[(agent.agent_id, move_id)] = now
        state.delivery.confirm(session, move_id, msg.traceparent)
        assert dialogue.round_id is not None  # set with `sealed_by`, which brought it here
        sealed = self.rounds[dialogue.round_id]
        if dialogue.state is DialogueState.DECLINE_HELD:
            sealed.declined[agent.agent_id] = msg.payload.get("reason")
            self._save(sealed)
        self.negotiations.save(dialogue)
        waiting = self.waiting[sealed.round_id] - 1
        self.waiting[sealed.round_id] = waiting
        return self._reveal(sealed, now) if waiting == 0 else []

    def reveal_due(self, now: float) -> list[Action]:
        """Reveal every open round whose deadline has passed. Call from the router's tick."""
        actions: list[Action] = []
        due = self._due
        while due and due[0][0] <= now:
            _, round_id = heapq.heappop(due)
            sealed = self.rounds.get(round_id)
            if sealed is not None and sealed.revealed_at is None:
                actions += self._reveal(sealed, now)
        return actions

    def _reveal(self, sealed: SealedRound, now: float) -> list[Action]:
        negotiations = self.negotiations
        bids: dict[str, dict[str, Any]] = {}
        declined, unanswered, expired = [], [], []
        for receiver in sealed.receivers:
            dialogue_id = sealed.dialogue_id(receiver)
            dialogue = negotiations.dialogues.get(dialogue_id)
            if dialogue is None or dialogue.state is DialogueState.SEALED:
                unanswered.append(receiver)
                if dialogue is not None:
                    dialogue.expire(now)
                    negotiations.finish(dialogue)
                    negotiations.save(dialogue)
                    expired.append(dialogue)
            elif dialogue.state is DialogueState.HELD:
                bids[receiver] = {
                    "dialogue_id": dialogue_id,
                    "sender_id": receiver,
                    "message_id": dialogue.last_move_id,
                    "proposal": dialogue.last_proposal,
                }
                dialogue.reveal(now)
                negotiations.save(dialogue)
            elif receiver in sealed.declined:
                # (A round saved by an earlier version ended its DECLINEs at once.)
                if dialogue.state is DialogueState.DECLINE_HELD:
                    dialogue.reveal(now)
                    negotiations.finish(dialogue)
                    negotiations.save(dialogue)
                declined.append(
                    {
                        "dialogue_id": dialogue_id,
                        "sender_id": receiver,
                        "reason": sealed.declined[receiver],
                    }
                )
        sealed.revealed_at = self.revealed[sealed.round_id] = now
        del self.waiting[sealed.round_id]  # only an open round is revealed
        self._save(sealed)
        payload = {
            "round_id": sealed.round_id,
            "seed": sealed.seed,
            "reply_by": sealed.reply_by,
            "bids": [bids[bidder] for bidder in reveal_order(sealed.seed, list(bids))],
            "declined": declined,
            "unanswered": unanswered,
        }
        state, traces = negotiations.state, negotiations.traces
        actions = state.notify(
            (sealed.buyer,),
            MessageType.BIDS_REVEALED,
            payload,
            sealed.round_id,
            now,
            traces.get(sealed.dialogue_id(sealed.receivers[0])),
        )
        for dialogue in expired:
            actions += state.notify(
                (dialogue.responder,),
                MessageType.DIALOGUE_EXPIRED,
                {
                    "dialogue_id": dialogue.dialogue_id,
                    "reason": "the sealed round's reply_by passed with no bid",
                },
                dialogue.dialogue_id,
                now,
                traces.get(dialogue.dialogue_id),
            )
        return actions

    def restore(self, documents: list[bytes]) -> None:
        """Load saved rounds; call after the dialogues are restored."""
        dialogues = self.negotiations.dialogues
        for document in documents:
            sealed = SealedRound.from_dict(orjson.loads(document))
            self.rounds[sealed.round_id] = sealed
            if sealed.revealed_at is not None:
                self.revealed[sealed.round_id] = sealed.revealed_at
            else:
                self.waiting[sealed.round_id] = sum(
                    1
                    for r in sealed.receivers
                    if (d := dialogues.get(sealed.dialogue_id(r))) is not None
                    and d.state is DialogueState.SEALED
                )
                heapq.heappush(self._due, (sealed.reply_by, sealed.round_id))
        self.revealed = dict(sorted(self.revealed.items(), key=lambda item: item[1]))

    def forget(self, cutoff: float) -> None:
        """Forget the rounds revealed before `cutoff` (their dialogues go the same way)."""
        revealed = self.revealed
        while revealed:
            round_id, at = next(iter(revealed.items()))
            if at >= cutoff:
                break  # pragma: no mutate (`return`: nothing follows the loop)
            del revealed[round_id]
            del self.rounds[round_id]  # a revealed round is kept until here
            self.negotiations.state.journaled(StateRemoved(KIND, round_id))

    def _save(self, sealed: SealedRound) -> None:
        data = orjson.dumps(sealed.to_dict())
        self.negotiations.state.journaled(StateSaved(KIND, sealed.round_id, data))
