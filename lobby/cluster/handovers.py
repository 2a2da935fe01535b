"""Agents handed over between live lobby nodes, over core NATS and the object store: the
cluster layer of `lobby.core.cluster.handover`.

A resume of an agent whose home is another live node asks that node on
`lobby.release.<home>` (`ask_release`, `RELEASE_TIMEOUT` at most). The old home releases it in
its core (`Router.release`) and answers, once what it journaled meanwhile is committed, with
the handover itself or, past `HANDOVER_INLINE_MAX`, the name of an object in `HANDOVERS`
holding it. The new node adopts it, and once that is committed tells the old home on
`lobby.adopted.<home>` (`adopted`): only then does the old home journal the agent as given up
(`Router.released`), so a failover of either node at any step finds the agent's messages on
one of them. The old home takes an agent back (`Router.take_back`) when its new node never
wrote its key (`UNTAKEN_AFTER`), or died before confirming (`reclaim`, from the failover).
The named steps of `lobby.cluster.steps` let fault tests kill a node at each step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final

import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from lobby.cluster import steps
from lobby.core.router import Router
from lobby.core.session import Action

log = structlog.get_logger("lobby.cluster")

RELEASE_TIMEOUT: Final = 2.0
"""Seconds a node waits for an agent's old home to hand it over (`lobby.release`)."""
HANDOVER_INLINE_MAX: Final = 256 * 1024
"""Bytes of a handover sent in the answer itself; a larger one (a full mailbox) goes through
the object store `HANDOVERS` (NATS refuses messages over its `max_payload`, 1 MiB by default)
and the answer names the object."""
HANDOVERS: Final = "LOBBY_HANDOVERS"
_STORED: Final = b"@"
"""Starts an answer to `lobby.release` that names an object in `HANDOVERS`."""
UNTAKEN_AFTER: Final = 10.0
"""Seconds after which an agent this node handed over, and whose new home has not written its
key, is taken back (that node gave up waiting for the handover)."""


class Handovers:
    """This node's part in handovers, both as old home and as new node. `start` subscribes;
    `stop` waits for the answers in flight. `durable` runs a callback once what was journaled
    so far is committed (the committer's marks)."""

    def __init__(
        self,
        node_id: str,
        router: Router,
        execute: Callable[[Iterable[Action]], None],
        durable: Callable[[Callable[[], None]], None],
        *,
        replicas: int = 1,
    ) -> None:
        self.node_id = node_id
        self.router = router
        self._execute = execute
        self._durable = durable
        self.replicas = replicas
        """Copies NATS keeps of the object store `HANDOVERS` (`--cluster-replicas`)."""
        self._nc: Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._checking: asyncio.Task[None] | None = None
        self.released: dict[str, tuple[str, bytes, float]] = {}
        """Agent this node handed over and has not yet seen its new home write its key -> (the
        new home, the handover, when, monotonic)."""

    async def start(self, nc: Client) -> None:
        self._nc = nc
        js = nc.jetstream()
        try:  # made now: at the first large handover, making it could outlast the wait
            await js.object_store(HANDOVERS)
        except nats.js.errors.BucketNotFoundError:
            await js.create_object_store(HANDOVERS, replicas=self.replicas)
        await nc.subscribe(f"lobby.release.{self.node_id}", cb=self._release_asked)
        await nc.subscribe(f"lobby.adopted.{self.node_id}", cb=self._adopted)
        self._checking = asyncio.create_task(self._take_back_untaken())

    async def stop(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the new node ----------------------------------------------------------------------

    async def ask_release(self, home: str, agent_id: str) -> bytes | None:
        """Ask node `home` to hand `agent_id` over to this node: its handover (empty: nothing
        there, fetched from the object store `HANDOVERS` when the answer names an object), or
        None if it did not answer within `RELEASE_TIMEOUT` or its handover could not be read."""
        if self._nc is None:
            return None
        try:
            reply = await self._nc.request(
                f"lobby.release.{home}",
                f"{agent_id} {self.node_id}".encode(),
                timeout=RELEASE_TIMEOUT,
            )
            data: bytes = reply.data
            if data.startswith(_STORED):
                name = data[len(_STORED) :].decode()
                store = await self._nc.jetstream().object_store(HANDOVERS)
                found = await store.get(name)
                data = found.data or b""
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await store.delete(name)
        except (nats.errors.Error, TimeoutError):
            return None
        return data

    def adopted(self, home: str, agent_id: str) -> None:
        """This node adopted `agent_id` from node `home`: tell it once that is committed, so
        it journals the agent as given up (the handover's second phase)."""
        nc = self._nc
        if nc is not None:
            subject, data = f"lobby.adopted.{home}", agent_id.encode()
            self._durable(lambda: self._spawn(nc.publish(subject, data)))

    # -- the old home ----------------------------------------------------------------------

    async def _release_asked(self, msg: Msg) -> None:
        """Another node resumes one of this node's agents: hand it over, answering once what
        this node gave up is committed."""
        agent_b, _, node_b = msg.data.partition(b" ")
        agent_id = agent_b.decode()
        try:
            data, actions = self.router.release(agent_id, node_b.decode())
        except Exception:
            log.exception("CLUSTER_RELEASE_FAILED", agent_id=agent_id)
            return  # unanswered: the resume there is closed with 1013 and tried again
        if data:
            self.released[agent_id] = (node_b.decode(), data, time.monotonic())
        steps.reached("handover_released")
        self._execute(actions)
        reply = msg.reply
        self._durable(lambda: self._spawn(self._answer_release(reply, data)))

    async def _adopted(self, msg: Msg) -> None:
        self.router.released(msg.data.decode())
        self._execute([])  # the server's pass: the records go to the committer

    def reclaim(self, dead: str, adopted: Iterable[str]) -> None:
        """Node `dead` died (its failover adopted `adopted` here) before confirming its
        adoption of agents this node handed it: they are this node's again."""
        taken = set(adopted)
        for agent_id, (node_id, data, _) in list(self.released.items()):
            if node_id == dead and agent_id in self.router.given_up and agent_id not in taken:
                del self.released[agent_id]
                self._execute(self.router.take_back(node_id, data))

    async def _answer_release(self, reply: str, data: bytes) -> None:
        """Answer a `lobby.release`: the handover itself, or the name of the object holding it
        when it is too large for one NATS message. Unanswered if that fails: the node that
        asked closes its resume with 1013, and this node takes the agent back."""
        assert self._nc is not None
        steps.reached("handover_committed")
        try:
            if len(data) > HANDOVER_INLINE_MAX:
                store = await self._nc.jetstream().object_store(HANDOVERS)
                name = uuid.uuid4().hex
                await store.put(name, data)
                data = _STORED + name.encode()
            await self._nc.publish(reply, data)
            await self._nc.flush()
            steps.reached("handover_answered")
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("CLUSTER_HANDOVER_UNSENT", error=repr(exc))

    async def _take_back_untaken(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for agent_id, (node_id, data, at) in list(self.released.items()):
                if now - at > UNTAKEN_AFTER:
                    del self.released[agent_id]
                    if agent_id in self.router.given_up:
                        self._execute(self.router.take_back(node_id, data))
                    else:  # adopted there, its key not seen yet: route what waited
                        self._execute(self.router.looked_up(agent_id))
