"""Presence between lobby nodes: who is connected where, over core NATS.

The shared registry (`lobby.cluster.node`) says which agents exist, what they offer and which
node is their home; not whether they are connected now, which changes too often to be written
there. Each node publishes the comings and goings of its own agents instead, once per pass of
its loop, on `lobby.presence` (`{"node": N, "changes": [[agent_id, online], ...]}`, in order);
every node feeds what the others publish to its core (`Router.presence_heard`), which tells
its watchers. A node that starts asks on `lobby.presence.hello`, and every other node answers
with the agents connected to it, so a watch's snapshot knows them too.

A node that drops out of this node's view of the live ones (`Liveness.alive`: killed, cut
off, stopped) takes its agents offline here; when a node comes (back) into view, this node asks
again (hello), so one that was only cut off for a while is heard of again. Core NATS may drop a
message (an outage, a reconnect): a change lost so is corrected by the next one of the same
agent. Nothing here runs on the REQUEST/RESPONSE path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final

import orjson
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from lobby.core.router import Router
from lobby.core.session import Action

log = structlog.get_logger("lobby.cluster")

PRESENCE: Final = "lobby.presence"
HELLO: Final = "lobby.presence.hello"
CHECK_EVERY: Final = 1.0
"""Seconds between two looks at which nodes are alive."""


class PresenceLink:
    """Made by `ClusterNode`; `await start(nc)` once connected, `kick()` after each batch the
    core handled, `await stop()` last."""

    def __init__(
        self,
        node_id: str,
        router: Router,
        execute: Callable[[Iterable[Action]], None],
        alive: Callable[[], list[str]],
    ) -> None:
        self.node_id = node_id
        self.router = router
        self._execute = execute
        self._alive = alive
        self._nc: Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._checking: asyncio.Task[None] | None = None

    async def start(self, nc: Client) -> None:
        self._nc = nc
        await nc.subscribe(PRESENCE, cb=self._heard)
        await nc.subscribe(HELLO, cb=self._hello)
        await nc.publish(HELLO, self.node_id.encode())
        self._checking = asyncio.create_task(self._check_nodes())

    async def stop(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _check_nodes(self) -> None:
        seen = set(self._alive())
        while True:
            await asyncio.sleep(CHECK_EVERY)
            alive = set(self._alive())
            elsewhere = self.router.state.presence.elsewhere
            for node in {n for n in elsewhere.values() if n not in alive}:
                gone = [(agent_id, False) for agent_id, n in elsewhere.items() if n == node]
                self._execute(self.router.presence_heard(node, gone))
            if alive - seen - {self.node_id} and self._nc is not None:
                self._spawn(self._nc.publish(HELLO, self.node_id.encode()))
            seen = alive

    def kick(self) -> None:
        """Publish the comings and goings of this node's agents the core queued."""
        outgoing = self.router.state.presence.outgoing
        if outgoing:
            self._publish([[agent_id, online] for agent_id, online in outgoing])
            outgoing.clear()

    def _publish(self, changes: list[list[Any]]) -> None:
        if self._nc is None:
            return
        data = orjson.dumps({"node": self.node_id, "changes": changes})
        self._spawn(self._nc.publish(PRESENCE, data))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _heard(self, msg: Msg) -> None:
        try:
            data = orjson.loads(msg.data)
            node = str(data["node"])
            changes = [(str(agent_id), bool(online)) for agent_id, online in data["changes"]]
        except (ValueError, KeyError, TypeError):
            log.warning("CLUSTER_PRESENCE_UNREADABLE", subject=msg.subject)
            return
        if node != self.node_id:
            self._execute(self.router.presence_heard(node, changes))

    async def _hello(self, msg: Msg) -> None:
        if msg.data.decode() != self.node_id:
            online = self.router.online_here()
            if online:
                self._publish([[agent_id, True] for agent_id in online])
