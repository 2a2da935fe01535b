"""The discovery worker: a child process holding a replica of the search index, which answers
DISCOVER_SERVICES off the lobby's event loop. A ranked page costs the worker milliseconds; the
lobby's loop only writes the query, and forwards the answer's bytes when they come back.

`DiscoveryWorker` (in the lobby) starts `python -m lobby.discovery_worker` at the first
DISCOVER_SERVICES, sends it the registry's agents and capabilities (`Registry.snapshot`), then
every change to them (`Registry.changes`) ahead of each query, on the same pipe: the worker
applies them in order, so a DISCOVER sent after a REGISTER_ACK always sees that agent.
`Replica` (in the worker) answers with the same code as the lobby's own `answer_query`
(`discovery.services_available`); only presence (`online`) is filled in by the lobby, when the
answer arrives (`discovery.with_presence`), as the in-process answer reads it when made.

Frames on both pipes: a 4-byte big-endian length, then orjson. To the worker: a change
(`["offer", agent_id, [capability, ...]]`, `["remove", agent_id]`),
`["query", requester_id, payload, room]`, or `["ready"]` once after the snapshot. From the
worker, one per query or ready, in their order: a second length (of the body) after the
first, the head `["ok", [agent_id, ...]]`, `["bad", problem]` (ERROR `malformed`),
`["failed", null]` (the lobby answers that query itself) or `["ready", null]` (the snapshot is
loaded: queries may come), then the body: the payload's JSON (for "ok").

While the worker starts and loads the snapshot (seconds for a large index), and after it died
`MAX_RESTARTS` times, the lobby answers in process (one query per pass of its loop). A worker
that dies is logged once, its unanswered queries are answered in process, and the next query
starts a new one.

The worker runs at the lowest CPU priority Linux has (`SCHED_IDLE`; nice 19 elsewhere): on
busy cores it gets what the lobby and everything else leave, so answering discovery never
takes a core from routing. Its answers come when they come; the loop never waits for one. So
that discovery is not starved forever on cores that are never idle, a query the worker has
not answered within `STARVED_AFTER` is taken back and answered in process, with every query
asked after it, and new queries are answered in process until the worker has caught up (its
late answers to the taken-back ones are dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Protocol

import orjson
import structlog

from lobby.core.discovery.discover import BadDiscovery, services_available, with_presence
from lobby.core.discovery.registry import Registry
from lobby.core.discovery.schemas import CapabilityEntry
from lobby.core.to_lobby import WaitingQuery
from protocol.payloads import Capability, DiscoverServicesPayload

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterable

    from lobby.core.router import Router
    from lobby.core.session import Action


class Server(Protocol):
    """What the worker uses of the server (`lobby.server.LobbyServer`)."""

    router: Router

    def execute(self, actions: Iterable[Action]) -> None: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...
    def queries_waiting(self) -> None: ...
    def answer_in_process(self) -> None: ...


log = structlog.get_logger("lobby.discovery")

MAX_RESTARTS: Final = 3
"""Workers started after the first one died; past that, discovery stays in process."""
SNAPSHOT_SLICE: Final = 1 << 20
"""Bytes of the snapshot written per pass of the loop when a worker starts."""
STARVED_AFTER: Final = 2.0
"""Seconds a query may wait in the worker before the lobby takes it back and answers it in
process: the worker runs only on cores nothing else wants (`lower_priority`), which a machine
busy for long may never have."""
_LENGTH: Final = struct.Struct(">I")
_ANSWER: Final = struct.Struct(">II")


def lower_priority() -> str:
    """Put this process at the lowest CPU priority the system has (call in the worker, at its
    start): Linux's `SCHED_IDLE`, which runs only when a core has nothing else to run and
    gives way at once to any other task that wakes; nice 19 where that policy is missing.
    The policy or nice value it set."""
    if hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass
        else:
            return "SCHED_IDLE"
    with contextlib.suppress(OSError):
        os.nice(19 - os.nice(0))
    return f"nice {os.nice(0)}"


@dataclass(slots=True)
class Asked:
    """A query written to the worker, not yet answered by it."""

    waiting: WaitingQuery
    at: float
    """When it was written (`time.monotonic`)."""
    taken_back: bool = False
    """Answered in process: the worker's answer, when it comes, is dropped."""


def frame(obj: Any) -> bytes:
    """`obj` as one length-prefixed frame."""
    data = orjson.dumps(obj)
    return _LENGTH.pack(len(data)) + data


class Replica:
    """The worker's copy of the registry's search index, and the answers it gives. Pure."""

    def __init__(self) -> None:
        self.registry = Registry()

    def apply(self, change: Sequence[Any]) -> None:
        """Apply one of `Registry.changes` (as decoded from a frame)."""
        if change[0] == "remove":
            self.registry.remove(change[1])
            return
        entries = {}
        for wire in change[2]:
            # Checked by the lobby already; the replica never routes: no authorization or input
            # check to build.
            model = Capability.model_construct(**wire)
            entries[model.name] = CapabilityEntry(model, None, wire, len(orjson.dumps(wire)), None)
        self.registry.offer(change[1], entries)

    def answer(self, requester_id: str, payload: dict[str, Any], room: int) -> tuple[Any, bytes]:
        """The head and body answering a query (`room` as `ToLobby.take_query` gives it)."""
        query = DiscoverServicesPayload.model_validate(payload)
        try:
            answer = services_available(self.registry, requester_id, query, room=room, marked=True)
        except BadDiscovery as bad:
            return ["bad", str(bad)], b""
        agent_ids = [service["agent_id"] for service in answer["services_found"]]
        return ["ok", agent_ids], orjson.dumps(answer)


def serve(reader: BinaryIO, writer: BinaryIO) -> None:
    """The worker's loop: apply changes and answer queries until `reader` ends."""
    replica = Replica()
    while True:
        head = reader.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        (length,) = _LENGTH.unpack(head)
        message = orjson.loads(reader.read(length))
        kind = message[0]
        if kind == "ready":  # the snapshot, and the changes after it so far, are applied
            meta, body = ["ready", None], b""
        elif kind != "query":
            replica.apply(message)
            continue
        else:
            try:
                meta, body = replica.answer(message[1], message[2], message[3])
            except Exception:
                traceback.print_exc()
                meta, body = ["failed", None], b""
        encoded = orjson.dumps(meta)
        writer.write(_ANSWER.pack(len(encoded), len(body)) + encoded + body)
        writer.flush()


class DiscoveryWorker:
    """The lobby's side of the worker: hands it the waiting queries (`dispatch`), feeds it the
    registry's changes (`feed`), answers what it sends back; `close` on shutdown."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.router = server.router
        self.process: asyncio.subprocess.Process | None = None
        """The worker, once it holds the whole index; None while it starts or when none runs."""
        self._loading: asyncio.subprocess.Process | None = None
        """The worker while it loads the snapshot: it is fed changes, not yet queries."""
        self._starting = False
        """A worker is starting or loading."""
        self._closed = False
        self.deaths = 0
        self.started = 0
        """Workers started (one at a time)."""
        self._asked: deque[Asked] = deque()
        """Queries written to the worker, not yet answered by it, oldest first."""
        self._behind = 0
        """Taken-back queries the worker has yet to answer: while any, new queries are
        answered in process."""
        self.taken_back = 0
        """Queries taken back from a starved worker and answered in process."""
        self._reader: asyncio.Task[None] | None = None
        self._watch: asyncio.TimerHandle | None = None

    @property
    def behind(self) -> bool:
        """Queries were taken back from the worker (`STARVED_AFTER`) and it has yet to answer
        them all: new queries are answered in process."""
        return self._behind > 0

    def dispatch(self) -> bool:
        """Hand every waiting query to the worker (the registry's changes first). False when no
        worker holds the index yet (one is started), or while it is behind (`STARVED_AFTER`):
        answer one in process meanwhile."""
        process = self.process
        if process is None:
            if not self._starting and not self._closed and self.deaths <= MAX_RESTARTS:
                self._starting = True
                self.server.spawn(self._start())
            return False
        self.feed()
        if self._behind:
            return False
        to_lobby = self.router.to_lobby
        assert process.stdin is not None
        now = time.monotonic()
        while to_lobby.queries:
            waiting = to_lobby.take_query()
            if waiting is None:
                continue
            self._asked.append(Asked(waiting, now))
            query = ["query", waiting.agent.agent_id, waiting.msg.payload, waiting.room]
            process.stdin.write(frame(query))
        if self._asked and self._watch is None:
            self._watch = asyncio.get_running_loop().call_later(STARVED_AFTER, self._check)
        return True

    def _check(self) -> None:
        """Take back every query asked of the worker if the oldest has waited `STARVED_AFTER`
        (the ones after it wait behind it in the worker); else look again when it will have."""
        self._watch = None
        pending = [asked for asked in self._asked if not asked.taken_back]
        if not pending or self.process is None:
            return
        left = pending[0].at + STARVED_AFTER - time.monotonic()
        if left > 0:
            self._watch = asyncio.get_running_loop().call_later(left, self._check)
            return
        for asked in pending:
            asked.taken_back = True
        self._behind += len(pending)
        self.taken_back += len(pending)
        log.warning("DISCOVERY_WORKER_STARVED", taken_back=len(pending), fallback="in_process")
        # First in line, in their order, to be answered in process.
        self.router.to_lobby.queries.extendleft(reversed([asked.waiting for asked in pending]))
        self.server.queries_waiting()

    def feed(self) -> None:
        """Write the registry's changes to the worker (call before any query, and often enough
        that they do not pile up: the server does at the end of each batch that made some)."""
        changes = self.router.registry.changes
        process = self.process or self._loading
        if process is None or not changes:
            return
        assert process.stdin is not None
        process.stdin.write(b"".join(frame(change) for change in changes))
        changes.clear()

    async def _start(self) -> None:
        """Start a worker and send it the index; `process` is set once it has loaded it (until
        then the lobby answers in process: a large index takes the worker seconds)."""
        registry = self.router.registry
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "lobby.discovery_worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            log.warning("DISCOVERY_WORKER_FAILED", error=str(exc), fallback="in_process")
            self.deaths = MAX_RESTARTS + 1
            self._starting = False
            return
        self.started += 1
        # From here every change is recorded, and sent after the snapshot it follows.
        registry.changes.clear()
        registry.replicating = not self._closed
        assert process.stdin is not None
        written = 0
        for change in registry.snapshot():
            if self._closed:
                break
            data = frame(change)
            process.stdin.write(data)
            written += len(data)
            if written >= SNAPSHOT_SLICE:
                written = 0
                await asyncio.sleep(0)  # let the loop route between slices of a large index
        if self._closed:
            self._starting = registry.replicating = False
            await _end(process)
            return
        process.stdin.write(frame(["ready"]))
        self._loading = process
        self.feed()
        self._reader = asyncio.create_task(self._read(process))

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        stdout = process.stdout
        try:
            while True:
                head = await stdout.readexactly(_ANSWER.size)
                meta_length, body_length = _ANSWER.unpack(head)
                meta = orjson.loads(await stdout.readexactly(meta_length))
                body = await stdout.readexactly(body_length)
                if meta[0] == "ready":
                    self.process, self._loading, self._starting = process, None, False
                    self.server.queries_waiting()
                    continue
                asked = self._asked.popleft()
                if asked.taken_back:  # answered in process meanwhile
                    self._behind -= 1
                    if not self._behind:
                        self.server.queries_waiting()
                    continue
                waiting = asked.waiting
                try:
                    self._answered(waiting, meta, body)
                except Exception:
                    # A bug must cost this one query, not discovery.
                    log.exception("ROUTER_FAILED", session=waiting.session.id)
                    self.server.execute(self.router.failed(waiting.session))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if not self._closed:
            self._died(process)

    def _answered(self, waiting: WaitingQuery, meta: list[Any], body: bytes) -> None:
        to_lobby = self.router.to_lobby
        kind, value = meta
        if kind == "ok":
            payload = with_presence(self.router.registry, body, value)
            self.server.execute(to_lobby.answered(waiting, payload))
        elif kind == "bad":
            self.server.execute(to_lobby.answered(waiting, None, value))
        else:  # the worker failed on it: the lobby answers it (and logs what fails)
            to_lobby.queries.appendleft(waiting)
            self.server.answer_in_process()

    def _died(self, process: asyncio.subprocess.Process) -> None:
        self.deaths += 1
        self.process = self._loading = None
        self._starting = False
        registry = self.router.registry
        registry.replicating = False
        registry.changes.clear()
        log.warning(
            "DISCOVERY_WORKER_FAILED",
            returncode=process.returncode,
            unanswered=sum(not asked.taken_back for asked in self._asked),
            fallback="restart" if self.deaths <= MAX_RESTARTS else "in_process",
        )
        # Its unanswered queries go first in line, in their order, to be answered in process.
        unanswered = [asked.waiting for asked in self._asked if not asked.taken_back]
        self.router.to_lobby.queries.extendleft(reversed(unanswered))
        self._asked.clear()
        self._behind = 0
        self.server.queries_waiting()
        self.server.spawn(_end(process))

    async def close(self) -> None:
        """Stop the worker (its unanswered queries stay unanswered: the lobby is stopping)."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        process = self.process or self._loading
        self.process = self._loading = None
        self.router.registry.replicating = False
        if process is not None:
            await _end(process)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


async def _end(process: asyncio.subprocess.Process) -> None:
    """Let `process` end (its input closed), killing it if it does not within a second."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        async with asyncio.timeout(1.0):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


def main() -> None:
    """`python -m lobby.discovery_worker`: serve the lobby on stdin/stdout."""
    # Only frames go to the lobby: anything else printed goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    lower_priority()
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
