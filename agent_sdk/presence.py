"""Presence: watch a capability or some agents, and learn as they come, change and go.

    async with me.watch("quote") as watch:          # or me.watch(agent_ids=["b", "c"])
        async for change in watch:                  # a PresenceChange each
            print(change.agent_id, change.event, change.online, change.capabilities)

    me.watch("quote", on_change=print_it)           # or a callback, called in order

A watch first yields its snapshot (one change per matching agent, `event` SNAPSHOT), then each
change as the lobby reports it (PROTOCOL.md §4.1). `watch.agents` is the current view (the
latest change of each agent), complete once `await watch.synced()` returns. The lobby drops a
connection's watches when it closes: the agent sends them again after each reconnect, and the
new snapshot follows (changes missed while away are not replayed; the snapshot says how things
are). Changes wait in a bounded queue for a slow consumer: past `max_queued` the oldest is
dropped and counted (`watch.dropped`); `agents` is kept up to date either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from agent_sdk.caller import Caller
from agent_sdk.errors import AgentSDKError, LobbyError, NotConnectedError
from agent_sdk.logs import log
from protocol.models import LOBBY_ID, Message, MessageType
from protocol.presence import PresenceEvent

OnChange = Callable[["PresenceChange"], Awaitable[None] | None]
"""A watch's callback: a function or a coroutine function of one `PresenceChange`."""


@dataclass(frozen=True, slots=True)
class PresenceChange:
    """One PRESENCE: an agent as it is (`event` SNAPSHOT) or as it just changed."""

    agent_id: str
    event: PresenceEvent
    online: bool
    """Whether it has a connection to the lobby now."""
    capabilities: tuple[str, ...]
    """The names of the capabilities it offers that this agent may discover, sorted."""

    @classmethod
    def of(cls, payload: dict[str, Any]) -> PresenceChange:
        return cls(
            str(payload.get("agent_id")),
            PresenceEvent(payload["event"]),
            bool(payload.get("online")),
            tuple(payload.get("capabilities") or ()),
        )


class Watch:
    """One watch of a `Watcher`: an async iterator of `PresenceChange`s (ending after
    `close()`, or raising `LobbyError` if the lobby refused the WATCH), and `agents`, the
    current view. Made by `Watcher.watch()`; `async with` closes it."""

    def __init__(
        self,
        owner: Watcher,
        watch_id: str,
        payload: dict[str, Any],
        *,
        on_change: OnChange | None,
        max_queued: int,
    ) -> None:
        self.watch_id = watch_id
        """Its `conversation_id` on the wire."""
        self.payload = payload
        self.agents: dict[str, PresenceChange] = {}
        """Agent id -> its latest change (agents removed, or no longer offering the watched
        capability, are left out)."""
        self.dropped = 0
        """Changes dropped from the queue because the consumer fell `max_queued` behind."""
        self._owner = owner
        self._queue: deque[PresenceChange] = deque()
        self._max_queued = max_queued
        self._ready = asyncio.Event()
        """Set when the queue holds something or the watch ended."""
        self._synced = asyncio.Event()
        self._next_view: dict[str, PresenceChange] | None = None
        """The snapshot being received (it replaces `agents` at its end)."""
        self._ended: AgentSDKError | None = None
        self._closed = False
        self._callback: asyncio.Task[None] | None = None
        if on_change is not None:
            self._callback = asyncio.create_task(self._call_back(on_change))

    # -- the consumer's side ------------------------------------------------------------------

    def online(self) -> list[str]:
        """The ids of the watched agents that are online now, sorted."""
        return sorted(a for a, change in self.agents.items() if change.online)

    async def synced(self, timeout: float | None = None) -> None:
        """Return once the snapshot of the latest WATCH was received (`agents` complete)."""
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> PresenceChange:
        while not self._queue:
            if self._ended is not None:
                raise self._failure()
            if self._closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._queue.popleft()

    def _failure(self) -> AgentSDKError:
        """Why the watch ended, as its consumer gets it."""
        return self._ended or NotConnectedError(f"watch {self.watch_id!r} ended")

    async def close(self) -> None:
        """End the watch (UNWATCH); iteration stops once the queued changes are taken."""
        if self._closed:
            return
        self._end()
        await self._owner._unwatch(self)
        if self._callback is not None and self._callback is not asyncio.current_task():
            self._callback.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._callback

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the agent's side -----------------------------------------------------------------------

    def resent(self) -> None:
        """The WATCH was sent again (a reconnect): a new snapshot follows."""
        self._synced.clear()
        self._next_view = {}

    def receive(self, payload: dict[str, Any]) -> None:
        """One PRESENCE of this watch."""
        if payload.get("event") == PresenceEvent.SNAPSHOT_END:
            if self._next_view is not None:
                self.agents, self._next_view = self._next_view, None
            self._synced.set()
            return
        change = PresenceChange.of(payload)
        view = self._next_view if self._next_view is not None else self.agents
        if change.event is PresenceEvent.REMOVED or (
            "capability_name" in self.payload
            and self.payload["capability_name"] not in change.capabilities
        ):
            view.pop(change.agent_id, None)
        else:
            view[change.agent_id] = change
        if len(self._queue) >= self._max_queued:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(change)
        self._ready.set()

    def ended(self, error: AgentSDKError) -> None:
        """The lobby refused the WATCH (`LobbyError`), or the agent stopped: the iteration
        raises `error` once the queued changes are taken."""
        self._ended = error
        self._end()

    def _end(self) -> None:
        self._closed = True
        self._owner._watches.pop(self.watch_id, None)
        self._synced.set()
        self._ready.set()

    async def _call_back(self, on_change: OnChange) -> None:
        try:
            async for change in self:
                try:
                    result = on_change(change)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    owner = self._owner.agent_id
                    log.exception("WATCH_CALLBACK_FAILED", agent_id=owner, watch_id=self.watch_id)
        except AgentSDKError:
            pass  # refused (logged) or stopped


class Watcher(Caller):
    """Watches and their routes; mixed into `Agent` first, so that its ERROR route sees the
    refusals of WATCH before the other layers' (it passes every other ERROR on)."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self._watches: dict[str, Watch] = {}
        self._routes[MessageType.PRESENCE] = self._on_presence
        self._other_errors = self._routes.get(MessageType.ERROR, self.on_message)
        self._routes[MessageType.ERROR] = self._on_watch_error
        self._after_connect.append(self._watch_again)

    def watch(
        self,
        capability_name: str | None = None,
        *,
        agent_ids: Iterable[str] | None = None,
        on_change: OnChange | None = None,
        max_queued: int = 1000,
    ) -> Watch:
        """Watch the agents offering `capability_name`, or the agents `agent_ids` (exactly one
        of the two; at most 1,000 ids, 16 watches at once). Returns at once; the WATCH goes out
        now if connected, else on connecting. Iterate the `Watch`, or pass `on_change` to have
        each change given to it in order (a callback that raises is logged, not re-raised)."""
        if (capability_name is None) == (agent_ids is None):
            raise ValueError("watch() takes a capability_name or agent_ids, not both or neither")
        payload: dict[str, Any] = (
            {"capability_name": capability_name}
            if capability_name is not None
            else {"agent_ids": sorted(set(agent_ids or ()))}
        )
        watch = Watch(self, self.new_id(), payload, on_change=on_change, max_queued=max_queued)
        self._watches[watch.watch_id] = watch
        if self._sender.connected.is_set():
            self._handlers.spawn(self._send_watch(watch))
        return watch

    async def _send_watch(self, watch: Watch) -> None:
        # Not connected after all: it is sent on the next connection (`_watch_again`).
        with contextlib.suppress(NotConnectedError):
            await self.send(
                LOBBY_ID, MessageType.WATCH, watch.payload, conversation_id=watch.watch_id
            )

    async def _shutdown(self) -> None:
        await super()._shutdown()
        stopped = NotConnectedError(f"agent {self.agent_id!r} stopped")
        for watch in list(self._watches.values()):
            watch.ended(stopped)

    def _watch_again(self) -> None:
        for watch in self._watches.values():
            watch.resent()
            self._handlers.spawn(self._send_watch(watch))

    async def _unwatch(self, watch: Watch) -> None:
        if self._sender.connected.is_set():
            with contextlib.suppress(AgentSDKError):
                await self.send(LOBBY_ID, MessageType.UNWATCH, {}, conversation_id=watch.watch_id)

    def _on_presence(self, message: Message) -> None:
        watch = self._watches.get(message.conversation_id or "")
        if watch is None or message.sender_id != LOBBY_ID:
            return  # a watch closed meanwhile, its last PRESENCE still on the way
        try:
            watch.receive(message.payload)
        except (ValueError, KeyError, TypeError) as exc:  # e.g. an event of a newer lobby
            log.warning("UNREADABLE_FRAME", agent_id=self.agent_id, error=f"PRESENCE: {exc!r}")

    def _on_watch_error(self, message: Message) -> Coroutine[Any, Any, None] | None:
        payload = message.payload
        watch = self._watches.get(str(payload.get("original_conversation_id") or ""))
        if (
            watch is not None
            and message.sender_id == LOBBY_ID
            and payload.get("original_message_type") == MessageType.WATCH
        ):
            error = LobbyError(str(payload.get("code")), str(payload.get("error")))
            log.warning("WATCH_REFUSED", agent_id=self.agent_id, error=str(error))
            watch.ended(error)
            return None
        return self._other_errors(message)


__all__ = ["OnChange", "PresenceChange", "PresenceEvent", "Watch", "Watcher"]
