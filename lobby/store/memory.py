"""The in-memory store: keeps nothing beyond the process (the core's memory is the state)."""

from __future__ import annotations

from lobby.core.records import Compaction, Record, Snapshot


class MemoryStore:
    """A `Store` that keeps nothing: the lobby's state lives and dies with the process."""

    durable = False

    def load(self) -> Snapshot:
        return Snapshot()

    def write(self, records: list[Record]) -> None:
        pass

    def compact(self, compaction: Compaction) -> None:
        pass

    def unwritable(self) -> str | None:
        return None

    def close(self) -> None:
        pass
