"""Persistence behind the lobby: the `Store` interface and its implementations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lobby.core.records import Compaction, Record, Snapshot
from lobby.store.base import Store
from lobby.store.memory import MemoryStore
from lobby.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from lobby.config import Settings


def open_store(settings: Settings) -> Store:
    """The store the settings ask for: sqlite in `data_dir` (default) or memory."""
    if settings.store == "memory":
        return MemoryStore()
    return SqliteStore(settings.data_dir, fsync=settings.fsync)


__all__ = ["Compaction", "MemoryStore", "Record", "Snapshot", "SqliteStore", "Store", "open_store"]
