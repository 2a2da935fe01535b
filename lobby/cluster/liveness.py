"""Which nodes are alive: KV bucket `nodes`, one key per node id, rewritten every second.

The bucket's entries expire `NODE_TTL` seconds after their last write (the bucket's max age),
so a node that stops writing (killed, cut off from NATS) drops out of every node's view within
`NODE_TTL` seconds; a node that stops cleanly deletes its key at once. Each node watches the
bucket and counts a node alive while it has heard from it within `NODE_TTL` (an expiry is not
announced to watchers): `/healthz` shows that view.

Being out of that view is not being dead (`lobby.cluster.verdicts`): a node judges others only
while its own link to NATS is up and its own heartbeats succeed on time, and gives every other
node a whole `dead_after` (`--cluster-dead-after`, 10 s) from the moment it became sound again.
`recovery` then asks for evidence before it fails a suspect over.
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

from lobby.cluster.verdicts import Verdicts
from lobby.store.jetstream import once_answered

log = structlog.get_logger("lobby.cluster")

NODES: Final = "nodes"
NODE_TTL: Final = 3.0
"""Seconds a node counts as alive after its last heartbeat."""
HEARTBEAT: Final = 1.0
"""Seconds between a node's heartbeats."""
DEAD_AFTER: Final = 10.0
"""Seconds of silence, while the judge itself was sound, after which a node is a suspect
(the default of `--cluster-dead-after`): longer than a NATS restart or a stalled server."""
_FAILED = (nats.errors.Error, TimeoutError)


class Liveness:
    """This node's heartbeat and its view of the others; `await start(js)`, `await stop()`."""

    def __init__(self, node_id: str, dead_after: float = DEAD_AFTER) -> None:
        self.node_id = node_id
        self.verdicts = Verdicts(node_id, ttl=NODE_TTL, dead_after=dead_after)
        self.heard = self.verdicts.heard
        """Node id -> when (monotonic) its last heartbeat was seen."""
        self._kv: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._beaten = 0.0
        """When (monotonic) this node's last heartbeat succeeded."""

    def alive(self) -> list[str]:
        """The nodes heard from within `NODE_TTL` seconds, this one included, sorted."""
        return self.verdicts.alive(time.monotonic())

    def suspects(self) -> list[str]:
        """Other nodes silent for `dead_after` while this node was sound (`Verdicts`); none
        while this node's own last heartbeat is older than `NODE_TTL` (it stalled, and has
        not noticed yet)."""
        now = time.monotonic()
        if now - self._beaten > NODE_TTL:
            return []
        return self.verdicts.suspects(now)

    def lost(self) -> None:
        """This node's connection to NATS dropped: it judges nobody until it beats again."""
        if self.verdicts.cut_off():
            log.warning("CLUSTER_JUDGEMENT_SUSPENDED", node_id=self.node_id, why="disconnected")

    async def start(self, js: JetStreamContext, replicas: int = 1) -> None:
        try:
            self._kv = await js.key_value(NODES)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await js.create_key_value(
                bucket=NODES, history=1, ttl=NODE_TTL, replicas=replicas
            )
        await once_answered(self._beat)
        watcher = await self._kv.watchall()
        self._tasks = [
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._watch(watcher)),
        ]

    async def stop(self, clean: bool = True) -> None:
        """Stop beating; `clean`: delete the key, so no node fails this one over (a node that
        steps down to rejoin keeps it: its agents wait for it rather than move on without
        what it holds for them)."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._kv is not None and clean:
            with contextlib.suppress(*_FAILED):
                await self._kv.delete(self.node_id)  # gone now, not in NODE_TTL

    async def _beat(self) -> None:
        assert self._kv is not None
        await self._kv.put(self.node_id, orjson.dumps({"at": time.time()}))
        now = time.monotonic()
        if self._beaten and now - self._beaten > NODE_TTL and self.verdicts.cut_off():
            # This process stalled (paused, starved) long enough for its own key to lapse:
            # what it heard of the others is as stale as what they heard of it.
            log.warning("CLUSTER_JUDGEMENT_SUSPENDED", node_id=self.node_id, why="stalled")
        self._beaten = now
        self.verdicts.restored(now)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self._beat()
            except _FAILED as exc:
                log.warning("CLUSTER_HEARTBEAT_FAILED", node_id=self.node_id, error=repr(exc))
                self.verdicts.cut_off()

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        while True:
            try:
                entry = await watcher.updates(3600)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                continue
            if entry is None:
                continue
            if entry.operation in ("DEL", "PURGE"):
                self.verdicts.gone(entry.key)
            else:
                self.verdicts.heard_from(entry.key, time.monotonic())
