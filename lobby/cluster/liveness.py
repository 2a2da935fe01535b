"""Which nodes are alive: KV bucket `nodes`, one key per node id, rewritten every second.

The bucket's entries expire `NODE_TTL` seconds after their last write (the bucket's max age),
so a node that stops writing (killed, cut off from NATS) drops out of every node's view within
`NODE_TTL` seconds; a node that stops cleanly deletes its key at once. Each node watches the
bucket and counts a node alive while it has heard from it within `NODE_TTL` (an expiry is not
announced to watchers). `/healthz` shows the result; `recovery` fails over a node that
expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final

import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

log = structlog.get_logger("lobby.cluster")

NODES: Final = "nodes"
NODE_TTL: Final = 3.0
"""Seconds a node counts as alive after its last heartbeat."""
HEARTBEAT: Final = 1.0
"""Seconds between a node's heartbeats."""
_FAILED = (nats.errors.Error, TimeoutError)


class Liveness:
    """This node's heartbeat and its view of the others; `await start(js)`, `await stop()`."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.heard: dict[str, float] = {}
        """Node id -> when (monotonic) its last heartbeat was seen."""
        self._kv: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def alive(self) -> list[str]:
        """The nodes heard from within `NODE_TTL` seconds, this one included, sorted."""
        now = time.monotonic()
        return sorted(n for n, at in self.heard.items() if now - at <= NODE_TTL)

    async def start(self, js: JetStreamContext, replicas: int = 1) -> None:
        try:
            self._kv = await js.key_value(NODES)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await js.create_key_value(
                bucket=NODES, history=1, ttl=NODE_TTL, replicas=replicas
            )
        await self._beat()
        watcher = await self._kv.watchall()
        self._tasks = [
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._watch(watcher)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._kv is not None:
            with contextlib.suppress(*_FAILED):
                await self._kv.delete(self.node_id)  # gone now, not in NODE_TTL

    async def _beat(self) -> None:
        assert self._kv is not None
        await self._kv.put(self.node_id, orjson.dumps({"at": time.time()}))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self._beat()
            except _FAILED as exc:
                log.warning("CLUSTER_HEARTBEAT_FAILED", node_id=self.node_id, error=repr(exc))

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        while True:
            try:
                entry = await watcher.updates(3600)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                continue
            if entry is None:
                continue
            if entry.operation in ("DEL", "PURGE"):
                self.heard.pop(entry.key, None)
            else:
                self.heard[entry.key] = time.monotonic()
