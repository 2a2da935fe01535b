"""Delivery paced by the reader, the I/O side (`LobbyServer` drives it; the decisions of what to
hold and what to write next are `lobby.core.delivery`'s).

Only the I/O layer sees a connection's outbound queue: the bytes `Link.flush` reports still
waiting. After a flush that leaves more than the window there, the agent is `paced`: what is
accepted for it is held in its mailbox, and the transport's buffer limits are set so that it
calls `drained` once the queue falls to the low-water mark (`Settings.outbound_low_water`);
then held messages are written, oldest first, while the queue stays within the window. A
connection whose queue, plus what was held for its agent since it connected, passes
`max_outbound_bytes` has stopped reading: it is closed with 4002.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from lobby.core.delivery import Delivery
from lobby.core.session import Session
from lobby.transport.base import Link

log = structlog.get_logger("lobby.server")


class Pacer:
    """Paces the writes to each connection by its outbound queue. Call `flushed` after a flush
    left more than `window` bytes waiting, `held` after each batch the core held messages in
    (`Delivery.paced`), and `drained` when the transport says a queue drained."""

    def __init__(
        self,
        delivery: Delivery,
        *,
        window: int,
        limit: int,
        too_slow: Callable[[Session], None],
    ) -> None:
        self.delivery = delivery
        self.window = window
        """Bytes in a connection's outbound queue past which its agent is paced."""
        self.limit = limit
        """`max_outbound_bytes`: the queue plus what is held for the agent since it connected."""
        self.too_slow = too_slow
        """Closes a connection with 4002."""

    def held(self) -> None:
        """Look at the connections whose agents the core held messages for, or that resumed
        to more than a window, in the batch that ended."""
        delivery = self.delivery
        paced, delivery.paced = delivery.paced, {}
        for session in paced:
            if session.agent is not None:  # else closed since: nothing to pace
                self.flushed(session)

    def drained(self, session: Session) -> bool:
        """The queue of `session`, once past the window, fell to the low-water mark: write
        what is held for its agent. True if anything may have been written."""
        agent = session.agent
        if agent is None or not agent.paced:
            return False
        self.flushed(session)
        return True

    def flushed(self, session: Session, waiting: int | None = None) -> None:
        """After a flush left `waiting` bytes in the queue of `session` (None: flush it now):
        4002 if they and what is held for its agent since it connected pass the limit; pace
        its agent if they pass the window (the transport calls `drained` when they fall to the
        low-water mark); else write held messages while there is room."""
        link: Link = session.link  # type: ignore[assignment]
        window, limit = self.window, self.limit
        agent = session.agent
        try:
            while True:
                if waiting is None:
                    waiting = link.flush()
                if agent is None or agent.session is not session:
                    # Not an agent's connection (yet): nothing held for it, no pacing.
                    if waiting > limit:
                        self.too_slow(session)
                    return
                if waiting + agent.held_bytes > limit:
                    self.too_slow(session)
                    return
                if waiting > window:
                    agent.paced = True
                    return
                if not agent.paced:
                    return
                for send in self.delivery.release(agent, window - waiting):
                    if not link.put(send.frame):
                        return  # closing: its agent is offline from here on
                waiting = None
        except Exception:
            log.debug("SEND_FAILED", exc_info=True)


__all__ = ["Pacer"]
