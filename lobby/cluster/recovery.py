"""Failover of a dead node: one survivor adopts its agents from its journal.

A node killed (or cut off from NATS) stops rewriting its key in the bucket `nodes`, which
expires `NODE_TTL` (3 s) later; a node stopped cleanly deletes its key and is not failed over
(its agents wait for its restart). Once a second after a node's last heartbeat is older than
`NODE_TTL`, every survivor checks that NATS agrees (the key is gone) and races
`kv.create(<node>)` in the bucket `recoveries`: exactly one wins. The winner
1. claims the dead node's journal epoch (`JetStreamStore`, as a restart of it would), so a
   zombie of it that comes back can no longer write;
2. loads its snapshot plus the journal after it and adopts, into its own core, the agents
   whose home that node still was (`lobby.core.adoption`): mailboxes, seq marks, dedupe ids,
   open conversations, journaled here; their keys in `agents` name the winner, so every node
   forwards to it from then on and resends what the dead node never confirmed
   (`lobby.cluster.routing`);
3. once that is committed, purges the dead node's journal and snapshots: a process started
   later with its node id starts empty and deletes the recovery key.
Meanwhile resumes of the dead node's agents are closed with 1013 on every node
(`SharedRegistry.held`), so they come back once their state is in one place. A failed attempt
(NATS away) deletes the key, and the next check tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from lobby.cluster.liveness import HEARTBEAT, NODE_TTL, Liveness
from lobby.core.adoption import adopt
from lobby.core.records import Snapshot
from lobby.core.router import Router
from lobby.core.session import Action
from lobby.store.jetstream import SNAPSHOTS, STREAM, JetStreamStore

log = structlog.get_logger("lobby.cluster")

RECOVERIES: Final = "recoveries"
"""The KV bucket whose key `<node>` names the node that adopted `<node>`'s agents."""
_FAILED = (nats.errors.Error, TimeoutError, OSError)


class Recovery:
    """Watches for dead nodes and fails them over; `await start(js)`, `await stop()`.
    `rehome(agent_id, old, new)` is called for each adopted agent (the relay's resends);
    `flush()` waits until this node's journal is committed."""

    def __init__(
        self,
        node_id: str,
        servers: list[str],
        router: Router,
        liveness: Liveness,
        execute: Callable[[Iterable[Action]], None],
        rehome: Callable[[str, str, str | None], None],
        flush: Callable[[], Awaitable[None]],
        *,
        reclaim: Callable[[str, list[str]], None] = lambda dead, adopted: None,
    ) -> None:
        self.node_id = node_id
        self.servers = servers
        self.router = router
        self.liveness = liveness
        self._execute = execute
        self._rehome = rehome
        self._flush = flush
        self._reclaim = reclaim
        self.recovered: dict[str, int] = {}
        """Node -> how many of its agents this node adopted."""
        self._settled: set[str] = set()
        """Dead nodes this node recovered or saw another recover (until heard from again)."""
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._nodes: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._replicas = 1

    async def start(self, js: JetStreamContext, replicas: int = 1) -> None:
        self._js, self._replicas = js, replicas
        try:
            self._kv = await js.key_value(RECOVERIES)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await js.create_key_value(bucket=RECOVERIES, history=1, replicas=replicas)
        self._nodes = await js.key_value("nodes")
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self._kv.delete(self.node_id)  # this node is back: it may fail over again
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def dead(self) -> list[str]:
        """Nodes heard from once whose last heartbeat is older than `NODE_TTL`."""
        now = time.monotonic()
        return sorted(
            n for n, at in self.liveness.heard.items() if n != self.node_id and now - at > NODE_TTL
        )

    async def _watch(self) -> None:
        shared = self.router.state.shared
        assert shared is not None
        while True:
            await asyncio.sleep(HEARTBEAT)
            dead = self.dead()
            # A node heard again (restarted) is no longer held, nor settled.
            for node_id in list(shared.held):
                if node_id in self.liveness.alive():
                    shared.held.discard(node_id)
            self._settled &= set(dead)
            if time.monotonic() - self._started < NODE_TTL:
                continue  # this node's view of the others is not complete yet
            for node_id in dead:
                shared.held.add(node_id)
                if node_id not in self._settled:
                    try:
                        await self._recover(node_id)
                    except _FAILED as exc:
                        log.warning("CLUSTER_RECOVERY_FAILED", node_id=node_id, error=repr(exc))
                    except Exception:  # its journal unreadable, say: logged, tried again
                        log.exception("CLUSTER_RECOVERY_FAILED", node_id=node_id)

    async def _recover(self, dead: str) -> None:
        assert self._kv is not None
        assert self._nodes is not None
        try:
            await self._nodes.get(dead)
            return  # NATS still has its heartbeat: alive after all (this loop was slow)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            pass
        claim = orjson.dumps({"by": self.node_id, "at": time.time()})
        try:
            await self._kv.create(dead, claim)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._settled.add(dead)  # another node won: its writes to `agents` re-home them
            return
        log.info("CLUSTER_RECOVERY_STARTED", node_id=dead)
        try:
            snapshot, upto = await asyncio.to_thread(_load, self.servers, dead, self._replicas)
        except BaseException:
            with contextlib.suppress(*_FAILED):
                await self._kv.delete(dead)  # the next check tries again
            raise
        adopted = adopt(self.router, snapshot, dead)
        for agent_id in adopted:
            self._rehome(agent_id, dead, None)
        # Agents this node handed to the dead node, which died before its adoption of them
        # was committed (not in its journal): this node's again (the handover's two phases).
        self._reclaim(dead, adopted)
        self._execute([])  # the server's pass: the adoption's records and writes go out
        await self._flush()
        await self._purge(dead, upto)
        self.recovered[dead] = len(adopted)
        self._settled.add(dead)
        agents = self.router.registry.agents
        held = sum(len(agents[a].mailbox) for a in adopted if a in agents)
        log.info("CLUSTER_NODE_RECOVERED", node_id=dead, agents=len(adopted), held_messages=held)

    async def _purge(self, dead: str, upto: int) -> None:
        """The dead node's journal and snapshots up to stream sequence `upto` are this node's
        now: drop them (not what a process restarted with its node id wrote since)."""
        assert self._js is not None
        js = self._js
        await js.purge_stream(STREAM, subject=f"journal.{dead}", seq=upto + 1)
        store = await js.object_store(SNAPSHOTS)
        prefix = f"{dead}."
        with contextlib.suppress(nats.js.errors.NotFoundError):
            for info in await store.list(ignore_deletes=True):
                seq = info.name[len(prefix) :]
                if info.name.startswith(prefix) and seq.isdigit() and int(seq) <= upto:
                    await store.delete(info.name)


def _load(servers: list[str], dead: str, replicas: int) -> tuple[Snapshot, int]:
    """Fence node `dead` (claim its epoch) and read its state, with the last stream sequence
    read; in a thread of its own (the store runs its own event loop)."""
    store = JetStreamStore(servers, dead, replicas=replicas)
    try:
        return store.load(), max(store.last_seq, store.epoch)
    finally:
        store.close()
