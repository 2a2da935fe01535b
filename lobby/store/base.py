"""The `Store` interface: what the lobby persists, and what it is rebuilt from at start.

The core never touches a store. It appends records (lobby/core/records.py) to its journal as
its state changes; the committer takes each batch (`Router.take_journal()`), hands its records
to `Store.write()` (a group commit, in a writer thread) and, once it returns, carries out what
the core says the commit causes (`Router.committed()`: senders told their messages are
accepted). At start, `Store.load()`
returns a `Snapshot` and `Router.restore()` rebuilds the state from it.

Hot lookups (dedupe window, per-receiver order, acknowledged watermarks) live in the core's
memory; the store only appends rows and answers `load()`.
"""

from __future__ import annotations

from typing import Protocol

from lobby.core.records import Compaction, Record, Snapshot


class StoreUnavailable(Exception):
    """The store cannot be opened (NATS unreachable, nats-py missing): `str()` is one line
    saying what and why, for `lobby serve` to print."""


class StoreFenced(Exception):
    """Another process claimed this node id (a restart of it, or a node failing it over):
    this one may not write any more (`lobby.store.jetstream`)."""


class Store(Protocol):
    """Persistence behind the lobby. `write` and `compact` run in one writer thread, one call
    at a time; `load` runs once, before serving."""

    durable: bool

    def load(self) -> Snapshot: ...

    def write(self, records: list[Record]) -> None:
        """Persist `records` atomically (one transaction); return once they are durable."""
        ...

    def compact(self, compaction: Compaction) -> None: ...

    def unwritable(self) -> str | None:
        """Why the store cannot take a write now, or None when it can: a cheap check (no
        write), for /readyz."""
        ...

    def close(self) -> None: ...
