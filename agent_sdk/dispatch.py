"""`Dispatcher`: what an agent does with each frame it receives, decided without I/O.

The read side of an agent in the sans-I/O style: `AgentCore`'s read loop hands each frame to
`Dispatcher.receive()` and carries out the actions it returns; nothing here awaits, sends or
touches a socket, so every decision is tested like a function (tests/sdk/test_dispatch.py).

For each frame, in this order:

    unreadable                        -> Unreadable (logged, dropped)
    (sender, message_id) seen before  -> nothing (a redelivery: counted, settled, dropped)
    REQUEST                           -> Deliver (its route answers it)
    ACCEPTED from the lobby           -> RoomFreed when the unconfirmed sends drop below the limit
    a lobby message naming one of our
      sends in `in_reply_to`          -> RoomFreed (that send is refused: never resent), then on
    RESPONSE in an awaited call       -> Answer (from the REQUEST's receiver, or the lobby)
    other RESPONSE                    -> Deliver (to `on_message`)
    the lobby's reply to a question   -> Reply (delivered instead if it was answered already)
    lobby ERROR naming an awaited call
      in `original_conversation_id`   -> Refusal
    the lobby's RESPONSE, or its ERROR
      `unknown_conversation`, in a
      conversation this agent ended   -> nothing (`ended`: cancelled or past its deadline)
    other lobby ERROR                 -> LobbyComplaint, then Deliver
    anything else                     -> Deliver

Delivery bookkeeping (`agent_sdk.delivery`) lives here too: a frame whose actions do not end
in `Deliver` (a duplicate, an answer, an ACCEPTED) is settled here, done at once; one
delivered to the application is settled by the I/O side (`settle()`) or started and later
finished (`start()`, `finish()`). After any of these, `ack_due()` says whether the watermark
moved, so that an ACK is due.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent_sdk.delivery import Inbound, Outbound
from agent_sdk.stats import AgentStats
from protocol.codec import decode
from protocol.errors import DecodeError
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType


@dataclass(slots=True)
class Deliver:
    """Hand `message` to the application: the route of its type, else `on_message`."""

    message: Message


@dataclass(slots=True)
class Answer:
    """A RESPONSE (in progress or final) to the awaited call in `conversation_id`."""

    conversation_id: str
    payload: dict[str, Any]


@dataclass(slots=True)
class Refusal:
    """The lobby refused the REQUEST of the awaited call in `conversation_id`."""

    conversation_id: str
    code: str
    error: str


@dataclass(slots=True)
class Reply:
    """The lobby's answer to the question asked in `conversation_id` (`ask_lobby`)."""

    conversation_id: str
    message: Message


@dataclass(slots=True)
class LobbyComplaint:
    """A lobby ERROR about nothing this agent awaits: worth a warning in its log."""

    code: object
    error: object


@dataclass(slots=True)
class Unreadable:
    """A frame that is not a message (`reason` says why): logged and dropped."""

    reason: str


@dataclass(slots=True)
class RoomFreed:
    """The lobby settled sends: wake whoever waits for room to send (or for all confirmed)."""


ENDED_REMEMBERED = 1_000
"""Conversations ended by this agent (or for it) remembered, to stay quiet about them."""

# Plain slotted classes, not frozen: a frozen dataclass costs about 1 us more to build, and one
# is built for most frames received.
Action = Deliver | Answer | Refusal | Reply | LobbyComplaint | Unreadable | RoomFreed
ROOM_FREED = RoomFreed()


class AwaitedCall(Protocol):
    """What the dispatcher reads of a call the agent awaits (`calls.Call`)."""

    @property
    def receiver_id(self) -> str:
        """The agent the REQUEST went to: its RESPONSEs (and the lobby's) answer the call."""


class SeenMessages:
    """The (sender, message_id) pairs seen lately, to drop a redelivered message. Bounded:
    the oldest are forgotten past `size`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def check_and_add(self, sender_id: str, message_id: str) -> bool:
        """True if this message was seen before (and so must be dropped)."""
        key = (sender_id, message_id)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return False

    def seen(self, sender_id: str, message_id: str) -> bool:
        return (sender_id, message_id) in self._seen

    def forget(self, sender_id: str, message_id: str) -> None:
        """Take a message out of the window: its redelivery is to be handled after all."""
        self._seen.pop((sender_id, message_id), None)


class Dispatcher:
    """Owns the agent's protocol state on the read side: the dedupe window, the delivery
    watermark (`inbound`) and the sends awaiting the lobby's ACCEPTED (`outbound`). Which
    conversations the agent awaits an answer in, it reads and never changes: `calls` (by
    conversation id, each with the agent its REQUEST went to) and `questions` to the lobby,
    both kept by `calls.Outstanding`. One per agent object; it outlives connections, so calls
    survive a reconnect. Counts into `stats` (messages received, duplicates)."""

    def __init__(
        self,
        stats: AgentStats,
        *,
        calls: Mapping[str, AwaitedCall],
        questions: Container[str],
        dedupe_window: int,
        max_unconfirmed: int,
    ) -> None:
        self.stats = stats
        self.inbound = Inbound()
        self.outbound = Outbound(max_unconfirmed)
        self._seen = SeenMessages(dedupe_window)
        self._calls = calls
        self._questions = questions
        self._ended = SeenMessages(ENDED_REMEMBERED)
        """Conversations this agent cancelled, or was told to stop serving (CANCEL): what
        the lobby says of them afterwards is expected, not worth a warning."""

    def ended(self, conversation_id: str) -> None:
        """This agent cancelled `conversation_id`, or stopped serving a REQUEST in it."""
        self._ended.check_and_add(LOBBY_ID, conversation_id)

    # -- the read side ---------------------------------------------------------------------

    def receive(self, frame: str | bytes) -> list[Action]:
        """Call with each frame the lobby sends; carry out the actions, in order. The steps
        follow the table in the module docstring (one function: this runs for every frame)."""
        try:
            message = decode(frame)
        except DecodeError as exc:
            return [Unreadable(exc.reason)]
        self.stats.messages_received += 1
        seq = message.seq
        if message.message_id is not None and self._seen.check_and_add(
            message.sender_id, message.message_id
        ):
            self.stats.duplicates_dropped += 1
            self.settle(seq)
            return []
        kind = message.message_type
        if kind is MessageType.REQUEST:
            return [Deliver(message)]
        from_lobby = message.sender_id == LOBBY_ID
        if from_lobby and kind is MessageType.ACCEPTED:
            self.outbound.confirmed(str(message.payload.get("message_id")))
            self.settle(seq)
            return [] if self.outbound.full else [ROOM_FREED]
        actions: list[Action] = []
        if from_lobby and message.in_reply_to is not None:
            self.outbound.refused(message.in_reply_to)
            actions.append(ROOM_FREED)
        conversation_id = message.conversation_id or ""
        if kind is MessageType.RESPONSE:
            call = self._calls.get(conversation_id)
            if call is not None and message.sender_id in (call.receiver_id, LOBBY_ID):
                self.settle(seq)
                actions.append(Answer(conversation_id, message.payload))
            elif from_lobby and self._ended.seen(LOBBY_ID, conversation_id):
                self.settle(seq)  # the `cancelled` answer to a call no longer awaited
            else:
                actions.append(Deliver(message))
            return actions
        if from_lobby:
            if conversation_id in self._questions:
                self.settle(seq)
                actions.append(Reply(conversation_id, message))
                return actions
            if kind is MessageType.ERROR:
                payload = message.payload
                code, error = payload.get("code"), payload.get("error")
                original = payload.get("original_conversation_id") or ""
                if original in self._calls:
                    self.settle(seq)
                    actions.append(Refusal(original, str(code), str(error)))
                    return actions
                if code == ErrorCode.UNKNOWN_CONVERSATION and self._ended.seen(LOBBY_ID, original):
                    self.settle(seq)  # a late RESPONSE (or CANCEL) in a conversation ended
                    return actions
                actions.append(LobbyComplaint(code, error))
        actions.append(Deliver(message))
        return actions

    # -- delivery: which messages are done, and when an ACK is due ---------------------------

    def registered(self, *, resumed: bool) -> None:
        """Call after each REGISTER_ACK: a fresh registration restarts the numbering."""
        if not resumed:
            self.inbound.reset()

    def settle(self, seq: int | None) -> None:
        """The message numbered `seq` is done: it needed no task (an answer, an ACCEPTED, a
        route that took it at once), or none could be had. A `seq` still in progress stays
        so: a task's `finish()` alone ends it."""
        if seq is not None:
            self.inbound.received(seq, done=True)

    def start(self, seq: int | None) -> int:
        """The message numbered `seq` is now handled by a task; pass the returned epoch to
        `finish()` when the task ends."""
        if seq is not None:
            self.inbound.received(seq, done=False)
        return self.inbound.epoch

    def finish(self, seq: int | None, epoch: int) -> None:
        """The task handling `seq` ended (answered, failed or cancelled: never retried)."""
        if seq is not None:
            self.inbound.done(seq, epoch)

    def abandon(self, message: Message, epoch: int) -> None:
        """The task handling `message` was cancelled before it ended (the agent stopped): the
        lobby delivers it again, and then it is handled, not dropped as a duplicate."""
        if message.seq is not None and epoch == self.inbound.epoch:
            self.inbound.abandon(message.seq, epoch)
            if message.message_id is not None:
                self._seen.forget(message.sender_id, message.message_id)

    def ack_due(self) -> int | None:
        """The `up_to` an ACK would carry now, if the watermark moved since the last one."""
        return self.inbound.ack_due()

    def take_ack(self) -> int | None:
        """Like `ack_due()`, and counts it as acknowledged: call when sending that ACK."""
        up_to = self.inbound.ack_due()
        if up_to is not None:
            self.inbound.acked = up_to
        return up_to
