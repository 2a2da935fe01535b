"""Multi-turn conversations: a provider asks its requester for input, the requester answers.

An `in_progress` RESPONSE carrying `input_required` (an object) leaves its open conversation
(requester, provider, conversation_id) waiting for input. An INPUT from the requester is
forwarded only to a conversation that waits, and ends the wait until the next `input_required`;
a conversation that closes stops waiting. Which conversations wait is saved as state
(`StateSaved("waiting", ...)`), not replayed from the messages, because a store's compaction
folds old messages into bare counts of open conversations and would lose it. On a cluster, an
INPUT for a capability-addressed REQUEST that another node decides (its provider chosen there)
goes on to that node, which checks it (`Deadlines.passed_on`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol

import orjson

from lobby.core.deadlines import Deadlines
from lobby.core.records import Effect, StateRemoved, StateSaved
from lobby.core.refusal import Refusal, unknown_receiver
from lobby.core.session import Action, AgentRecord, Session
from lobby.core.state import LobbyState
from protocol.limits import clip
from protocol.models import ErrorCode, Message

ConversationKey = tuple[str, str, str]
"""(requester, provider, conversation_id), as `conversations.ConversationKey`."""

WAITING: Final = "waiting"
"""The kind of the saved state that marks one conversation waiting for input."""


class OpenConversations(Protocol):
    """What turns read of `conversations.Conversations`: which conversations are open, and
    the REQUESTs open one by one (a cluster's decided on another node among them)."""

    @property
    def open(self) -> dict[ConversationKey, int]: ...

    @property
    def deadlines(self) -> Deadlines: ...


def asks_for_input(payload: dict[str, Any], final: bool) -> bool:
    """Whether a RESPONSE payload that has `input_required` asks for input; a refusal
    (`malformed`) when it is not an object or comes with a final status. Call only for a payload
    that has the field, so a RESPONSE without it costs one dict lookup."""
    if type(payload["input_required"]) is not dict:
        raise Refusal(ErrorCode.MALFORMED, "'input_required' must be an object")
    if final:
        raise Refusal(
            ErrorCode.MALFORMED,
            "'input_required' comes only with status 'in_progress': a final RESPONSE "
            "asks for nothing",
        )
    return True


class Turns:
    """Owns which open conversations wait for input (`waiting`); handles INPUT."""

    def __init__(self, state: LobbyState, conversations: OpenConversations) -> None:
        self.state = state
        self.conversations = conversations
        self.waiting: set[ConversationKey] = set()

    def asked(self, key: ConversationKey) -> None:
        """The provider of open conversation `key` asked for input (its RESPONSE is accepted)."""
        if key not in self.waiting:
            self.waiting.add(key)
            name = _name(key)
            self.state.journaled(StateSaved(WAITING, name, name.encode()))

    def ended(self, key: ConversationKey) -> None:
        """Conversation `key` closed: it waits for nothing any more."""
        if key in self.waiting:
            self.waiting.discard(key)
            self.state.journaled(StateRemoved(WAITING, _name(key)))

    def restore(self, saved: Iterable[bytes]) -> None:
        """The waiting conversations after a restart: those saved, if still open. Call after
        the open conversations are restored."""
        open_now = self.conversations.open
        self.waiting = set()
        for data in saved:
            requester, provider, conversation_id = orjson.loads(data)
            key = (requester, provider, conversation_id)
            if key in open_now:
                self.waiting.add(key)

    def input(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """Forward an INPUT to the provider of an open conversation waiting for it."""
        state = self.state
        conversation_id = msg.conversation_id
        if conversation_id is None:
            raise Refusal(ErrorCode.MALFORMED, "an INPUT needs a conversation_id")
        key = (agent.agent_id, msg.receiver_id, conversation_id)
        if key not in self.conversations.open:
            target = state.registry.agents.get(msg.receiver_id)
            if (
                target is not None
                and target.home is not None
                and self.conversations.deadlines.decided_elsewhere(agent.agent_id, conversation_id)
            ):
                # A capability-addressed REQUEST the provider's node decides (its provider
                # chosen there): that node checks and routes the INPUT as its requester's own.
                return state.delivery.forward(target, msg, session)
            raise Refusal(
                ErrorCode.UNKNOWN_CONVERSATION,
                f"no open REQUEST from {agent.agent_id!r} to {clip(msg.receiver_id)!r} in "
                f"conversation {clip(conversation_id)!r}",
            )
        target = state.registry.agents.get(msg.receiver_id)
        if target is None:
            raise Refusal(ErrorCode.UNKNOWN_RECEIVER, unknown_receiver(msg.receiver_id))
        now = state.clock()
        # A resend of an INPUT already accepted is confirmed, though it ended the wait.
        if state.is_duplicate(msg, session, now):
            return []
        if key not in self.waiting:
            raise Refusal(
                ErrorCode.INVALID_DIALOGUE,
                f"{target.agent_id!r} has not asked for input in conversation "
                f"{clip(conversation_id)!r}",
            )
        actions = state.deliver(target, msg, session, Effect.NONE, now)
        self.waiting.discard(key)
        state.journaled(StateRemoved(WAITING, _name(key)))
        return actions


def _name(key: ConversationKey) -> str:
    """The saved state's key (and data) for conversation `key`: its three ids as JSON."""
    return orjson.dumps(key).decode()
