"""`Reader`: the I/O side of the read loop: carries out what `dispatch.Dispatcher` decides for
each frame, delivering messages to their routes as tasks (`tasks.Handlers`)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from agent_sdk.calls import Outstanding
from agent_sdk.capability import error_response_to
from agent_sdk.dispatch import (
    Answer,
    Deliver,
    Dispatcher,
    LobbyComplaint,
    Refusal,
    Reply,
    RoomFreed,
    Unreadable,
)
from agent_sdk.logs import log
from agent_sdk.policy import Policy
from agent_sdk.sending import Sender
from agent_sdk.tasks import Handlers
from agent_sdk.tracing import Tracing
from protocol.models import ErrorCode, Message, MessageType

Route = Callable[[Message], Coroutine[Any, Any, None] | None]
"""Runs a delivered message: the coroutine to run as a task, or None if there is nothing to
run (the message is done)."""


class Reader:
    """One per agent object, outliving connections. Reads the agent's route table (`routes`,
    filled by its layers) and its `policy`; a type without a route goes to `fallback`
    (`on_message`)."""

    def __init__(
        self,
        agent_id: str,
        *,
        dispatcher: Dispatcher,
        outstanding: Outstanding,
        sender: Sender,
        handlers: Handlers,
        routes: Mapping[MessageType, Route],
        fallback: Route,
        policy: Policy,
        tracing: Tracing,
    ) -> None:
        self.agent_id = agent_id
        self._dispatcher = dispatcher
        self._outstanding = outstanding
        self._sender = sender
        self._handlers = handlers
        self._routes = routes
        self._fallback = fallback
        self._policy = policy
        self._tracing = tracing
        self._spans = tracing.spans
        self.stats = dispatcher.stats

    def receive(self, frame: str | bytes) -> None:
        """Carry out what the dispatcher decides for one frame (see `agent_sdk.dispatch`)."""
        # An if-chain, not `match`: class patterns cost about 1 us a frame here.
        actions = self._dispatcher.receive(frame)
        for action in actions:
            if isinstance(action, Deliver):
                self._deliver(action.message)
            elif isinstance(action, Answer):
                self._outstanding.answer(action.conversation_id, action.payload, action.sender_id)
            elif isinstance(action, RoomFreed):
                self._sender.room.set()
            elif isinstance(action, Reply):
                if not self._outstanding.reply(action.conversation_id, action.message):
                    self._deliver(action.message)  # answered already: as if never awaited
            elif isinstance(action, Refusal):
                self._outstanding.refuse(action.conversation_id, action.code, action.error)
            elif isinstance(action, LobbyComplaint):
                log.warning(
                    "LOBBY_ERROR", agent_id=self.agent_id, code=action.code, error=action.error
                )
            elif isinstance(action, Unreadable):
                log.warning("UNREADABLE_FRAME", agent_id=self.agent_id, error=action.reason)
        if not actions or not isinstance(actions[-1], Deliver):
            self._sender.ack_soon()  # the dispatcher settled it

    def _deliver(self, message: Message) -> None:
        """Run the route of the message's type (a layer's), else `on_message`, as a task."""
        incoming = self._policy.incoming
        if incoming and not self._policy.allows(incoming, message):
            self._refuse(message, ErrorCode.UNAUTHORIZED, "refused by the receiver's policy")
            return
        route = self._routes.get(message.message_type, self._fallback)
        work = route(message)
        if work is None:
            self._dispatcher.settle(message.seq)  # the route took it without a task
            self._sender.ack_soon()
        elif self._handlers.full:
            work.close()
            self.stats.overflow_dropped += 1
            log.warning("AGENT_OVERLOADED", agent_id=self.agent_id, type=message.message_type)
            self._refuse(message, ErrorCode.RATE_LIMITED, f"agent {self.agent_id!r} is overloaded")
        else:
            if message.traceparent is not None or self._spans:
                work = self._tracing.serving(work, message)
            epoch = self._dispatcher.start(message.seq)
            self._handlers.run(work, self._finished, message, epoch, cancelled=self._abandoned)

    def _refuse(self, message: Message, code: str, error: str) -> None:
        """Drop `message` as done; a REQUEST is answered with status `error`, `code`."""
        self._dispatcher.settle(message.seq)
        self._sender.ack_soon()
        if message.message_type is MessageType.REQUEST:
            reply = error_response_to(message, code, error)
            self._handlers.spawn(self._sender.send_quietly(reply))

    def _finished(self, message: Message, epoch: int) -> None:
        if message.seq is not None:
            self._dispatcher.finish(message.seq, epoch)
            self._sender.ack_soon()

    def _abandoned(self, message: Message, epoch: int) -> None:
        self._dispatcher.abandon(message, epoch)
