"""Carrying out the router's actions on the connections' links, the server's outbound side:
a `Send` frames the message on the receiver's `Link`, and `end_of_batch` flushes every link
written to, one write for a burst; a `Close` detaches the agent at once and closes the link
as a tracked task; a `Pause` stops reading a link for a while.

`Outbound` is a base of `lobby.server.LobbyServer` rather than an object of its own, so the
routing path calls these methods on the server itself, with no hop per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from lobby.core.session import Action, Close, Send, Session
from lobby.transport.base import Link
from protocol.models import CloseCode

if TYPE_CHECKING:
    from lobby.core.router import Router

log = structlog.get_logger("lobby.server")


class Outbound:
    """What `LobbyServer` sets in `__init__` and the outbound side uses."""

    router: Router
    _written: dict[Link, Session]
    """Links with frames waiting to be flushed at the end of this batch."""
    _batch_due: bool
    _tasks: set[asyncio.Task[None]]

    def end_of_batch(self) -> None:
        """Flush every link written to (`LobbyServer.end_of_batch`)."""
        raise NotImplementedError

    def _batch(self) -> None:
        """Make sure `end_of_batch` runs soon (for frames sent outside a read: timers, commit
        confirmations, closes)."""
        if not self._batch_due:
            self._batch_due = True
            asyncio.get_running_loop().call_soon(self.end_of_batch)

    def execute(self, actions: Iterable[Action]) -> None:
        """Carry out actions decided outside a read (an /admin command), then flush."""
        self._execute(actions)
        self._batch()

    def execute_now(self, actions: Iterable[Action]) -> None:
        """Carry out actions decided outside a read and flush them at once, as a read does:
        what another cluster node forwarded goes out without waiting a turn of the loop."""
        self._execute(actions)
        self.end_of_batch()

    def send(self, session: Session, frame: bytes) -> None:
        """Write one frame to `session` (flushed at the end of this batch)."""
        self._send(session, frame)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task that shutdown waits for (or cancels past its bound)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _execute(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.session, action.frame)
            elif isinstance(action, Close):
                self._close(action.session, action.code, action.reason)
            else:
                link: Link = action.session.link  # type: ignore[assignment]
                link.pause(action.seconds)

    def _send(self, session: Session, frame: bytes) -> None:
        link: Link = session.link  # type: ignore[assignment]
        try:
            if not link.put(frame):
                return
        except Exception:
            log.debug("SEND_FAILED", exc_info=True)
            return
        self._written[link] = session
        self._batch()

    def _close(self, session: Session, code: int, reason: str) -> None:
        """Close `session`'s connection. Its agent goes offline at the decision, not when the
        peer finishes the closing handshake: nothing sent to it after this is written to the
        closing connection (or, for an agent without acks, counted as delivered)."""
        self._execute(self.router.close(session, code))
        link: Link = session.link  # type: ignore[assignment]
        closing = link.shut(code, reason)
        if closing is not None:
            task = asyncio.ensure_future(closing)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _too_slow(self, session: Session) -> None:
        """Detach at once so nothing more is written to it: what was held for its agent, or
        is unacknowledged, it finds in its mailbox when it resumes."""
        link: Link = session.link  # type: ignore[assignment]
        log.warning("CONNECTION_TOO_SLOW", remote=link.remote)
        self._close(session, CloseCode.TOO_SLOW, "too slow: outbound queue overflowed")
