"""`Sender`: the way out of an agent: sending on the current connection, with what the lobby
has not confirmed kept and sent again after a reconnect, and ACKs, batched."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from agent_sdk.connection import Link
from agent_sdk.dispatch import Dispatcher
from agent_sdk.errors import AgentSDKError, MessageRefusedError, NotConnectedError
from agent_sdk.logs import log
from agent_sdk.policy import Policy
from agent_sdk.stats import AgentStats
from agent_sdk.tasks import Handlers
from agent_sdk.tracing import Tracing
from protocol.codec import encode
from protocol.models import LOBBY_ID, Message, MessageType

ACK_DELAY = 0.005
"""Seconds to gather finished messages into one ACK."""


class Sender:
    """Owns the current connection's `Link` (None between connections) and the token every
    message carries; `AgentCore`'s connection loop `attach()`es and `detach()`es links. A
    message to another agent is kept in `outbound` (the dispatcher's) until the lobby confirms
    it, and `resend()` sends again after a reconnect what was not; anything else waits for the
    next connection. Sending waits for room under `max_unconfirmed` too, all up to
    `request_timeout`, and gives up with `NotConnectedError` once `stopping` is set; it is
    refused outright unless `open`. ACKs go out when the dispatcher says one is due, gathered
    over `ACK_DELAY` (`ack_soon()`), or at once when stopping (`ack_now()`)."""

    def __init__(
        self,
        agent_id: str,
        dispatcher: Dispatcher,
        handlers: Handlers,
        stopping: asyncio.Event,
        *,
        policy: Policy,
        new_id: Callable[[], str],
        lobby_url: str,
        request_timeout: float,
        tracing: Tracing | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.new_id = new_id
        """Draws the `message_id` of a message sent without one."""
        self.dispatcher = dispatcher
        self.outbound = dispatcher.outbound
        self.handlers = handlers
        self.stats: AgentStats = dispatcher.stats
        self.stopping = stopping
        self.policy = policy
        self.lobby_url = lobby_url
        self.request_timeout = request_timeout
        self.tracing = tracing or Tracing()
        """Gives a message sent without a traceparent the one of the message being handled."""
        self.open = False
        """True from `run()`'s start until a stop's last ACK: handlers may send until then,
        never after (an ACK must not cover a REQUEST whose RESPONSE could not go out)."""
        self.unregistered = False
        """True once UNREGISTER went out: the lobby dropped this agent's mailbox, so no ACK is
        due (one would be refused `not_registered`)."""
        self.link: Link | None = None
        self.token: str | None = None
        self.connected = asyncio.Event()
        """Set while a link is attached."""
        self.room = asyncio.Event()
        """Set when the lobby settles sends (`RoomFreed`): senders waiting for room re-check."""
        self.room.set()
        self._ack_timer: asyncio.TimerHandle | None = None

    def attach(self, link: Link) -> None:
        """Call once `link` is registered and what was unconfirmed is resent on it."""
        self.link = link
        self.unregistered = False  # registered (again): ACKs are due as before
        self.connected.set()

    def detach(self, link: Link) -> None:
        """Call when `link` closed (a no-op if another is attached by now)."""
        if link is self.link:
            self.link = None
            self.connected.clear()

    def send_now(self, message: Message) -> bool:
        """Send `message` as `send()` would if that needs no wait (running, connected, room
        under `max_unconfirmed`, the connection's buffer below its mark); else return False,
        having changed nothing, and leave it to `send()`. Raises `MessageRefusedError` as
        `send()` does. For code that may not await (an answer made as its REQUEST is read)."""
        link = self.link
        if not self.open or link is None or not link.ready or self.outbound.full:
            return False
        self._vet(message)
        if message.receiver_id != LOBBY_ID:
            if message.message_id is None:
                message.message_id = self.new_id()
            self.outbound.add(message)
        message.auth_token = self.token
        link.send_now(encode(message))
        self.stats.messages_sent += 1
        return True

    def _vet(self, message: Message) -> None:
        """Give `message` its trace context, and refuse it (`MessageRefusedError`) if an
        outgoing hook does: before anything is sent or kept."""
        if message.traceparent is None:
            message.traceparent = self.tracing.outgoing()
        outgoing = self.policy.outgoing
        if outgoing and not self.policy.allows(outgoing, message):
            raise MessageRefusedError(
                f"{message.message_type} to {message.receiver_id!r} refused by an outgoing hook"
            )

    async def send(self, message: Message) -> None:
        """Send `message` once connected (waiting up to `request_timeout`). A message for
        another agent is kept until the lobby confirms it, and resent after a reconnect."""
        if not self.open:
            raise NotConnectedError(f"agent {self.agent_id!r} is not running")
        self._vet(message)
        deadline = None  # read from the clock only if this send has to wait
        tracked = message.receiver_id != LOBBY_ID
        if tracked:
            if message.message_id is None:
                message.message_id = self.new_id()
            while self.outbound.full:
                self.room.clear()
                deadline = deadline or asyncio.get_running_loop().time() + self.request_timeout
                await self._wait_until(self.room, deadline)
            self.outbound.add(message)
        while True:
            link = self.link
            if link is None:
                if tracked:
                    return  # sent on reconnect, with everything else unconfirmed
                deadline = deadline or asyncio.get_running_loop().time() + self.request_timeout
                await self._wait_until(self.connected, deadline)
                continue
            message.auth_token = self.token
            try:
                await link.send(encode(message))
            except Exception:
                # The connection dropped under us. A tracked message is resent on reconnect;
                # anything else waits for the next connection here.
                self.detach(link)
                if tracked:
                    return
                continue
            self.stats.messages_sent += 1
            return

    async def send_quietly(self, message: Message) -> None:
        """`send()`, logging a failure instead of raising it (for answers nobody awaits)."""
        try:
            await self.send(message)
        except AgentSDKError as exc:
            log.warning("RESPONSE_NOT_SENT", agent_id=self.agent_id, error=str(exc))

    async def _wait_until(self, event: asyncio.Event, deadline: float) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                await event.wait()
        except TimeoutError:
            raise NotConnectedError(f"no room to send to {self.lobby_url} in time") from None
        if self.stopping.is_set():
            raise NotConnectedError(f"agent {self.agent_id!r} is stopping")

    async def resend(self, link: Link) -> bool:
        """After (re)registering: send again, in order, what the lobby never confirmed.
        False if the connection dropped meanwhile."""
        for message in self.outbound.unconfirmed():
            message.auth_token = self.token
            try:
                await link.send(encode(message))
            except Exception:
                return False
            self.stats.resent += 1
        return True

    async def wait_confirmed(self, timeout: float) -> int:
        """Wait up to `timeout` for the lobby to confirm (or refuse) everything sent; return
        how many are still unconfirmed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(self.outbound):
                    self.room.clear()  # set by each ACCEPTED or refusal
                    await self.room.wait()
        return len(self.outbound)

    def ack_soon(self) -> None:
        """Call when messages were done: if an ACK is due, it goes out within `ACK_DELAY`,
        covering whatever else is done by then."""
        if self._ack_timer is None and self.dispatcher.ack_due() is not None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._flush_ack)

    def _flush_ack(self) -> None:
        self._ack_timer = None
        link = self.link
        if link is None or not self.open or self.unregistered:
            return  # on resume the lobby redelivers what was not acknowledged
        up_to = self.dispatcher.take_ack()
        if up_to is not None:
            self.handlers.spawn(self._ack(link, up_to))

    async def ack_now(self) -> None:
        """Acknowledge what is done, if anything new (a clean stop's last message)."""
        link = self.link
        if self.unregistered:
            return
        if link is not None and (up_to := self.dispatcher.take_ack()) is not None:
            await self._ack(link, up_to)

    async def _ack(self, link: Link, up_to: int) -> None:
        if self.unregistered:
            return  # UNREGISTER went out since this ACK was due: nothing may follow it
        # A failure is left to the lobby's redelivery.
        ack = Message(self.agent_id, LOBBY_ID, MessageType.ACK, {"up_to": up_to})
        ack.auth_token = self.token
        with contextlib.suppress(Exception):
            await link.send(encode(ack))
