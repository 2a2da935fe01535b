"""Capabilities in key order, (agent_id, name): all of them, by exact name and by keyword.

DISCOVER answers are pages, and a page must cost about its own size, not the registry's: the
lobby is one event loop, and a DISCOVER that reads 100,000 capabilities stalls every agent.
So each way the seed's discovery looks capabilities up (everything, `capability_name`,
`keywords`) is a sorted column here, read from a key onwards (`after`, `named`, `tagged`):
finding where a page starts is a bisection, and each further capability one step. `walk` reads
such an iteration with a bound on the entries it examines, so a lookup whose other conditions
reject most of what it reads still stops in time, with a position to go on from.

Costs, N capabilities: `add` / `discard` O(log N) comparisons plus a move inside one block of
at most 1,024 entries per column (`SortedColumn`); starting an iteration O(log N); each step
O(1), and O(log k) for `tagged` with k keywords (a heap merge).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, Final, NamedTuple

from lobby.core.discovery.filters import SortedColumn

DocKey = tuple[str, str]

SCAN_BUDGET: Final = 4_096
"""Entries one answer may examine beyond those it returns: about a millisecond of work."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page starts: after `key` in key order (None: from the first), then past `rank`
    results. Key-ordered answers go on after their last key; ranked ones count `rank` on."""

    key: DocKey | None = None
    rank: int = 0


@dataclass(frozen=True, slots=True)
class Walked:
    """What `walk` found: admitted doc ids in order, and the id of the last entry it examined
    when it stopped before the end (None: it read everything there was)."""

    found: list[int]
    stopped_at: int | None
    examined: int
    """Entries read: what the page cost."""


class Hit(NamedTuple):
    agent_id: str
    name: str
    score: float


new_hit = tuple.__new__
"""Makes a `Hit` without NamedTuple's argument handling: pages make many."""


@dataclass(frozen=True, slots=True)
class SearchPage:
    hits: list[Hit]
    total: int | None
    """Hits before paging; None when not counted (`simple` past one window, lookups)."""
    next: Position | None = None
    """Where the following page starts when every hit is taken; None: there is none."""
    keyed: bool = field(default=False, compare=False)
    """Hits in key order: a shorter page goes on after its last key (else counts ranks on)."""
    start: Position = field(default=Position(), compare=False)
    examined: int | None = field(default=None, compare=False)
    """Entries of the key order read to make the page (key-ordered and `simple` pages; an
    excluded agent's own capabilities, skipped in C, are not counted)."""
    exact: bool = True
    """False for a `lexical` page whose ranking was cut short (`ranking.THRESHOLD_READS`)."""

    def cut(self, taken: int) -> SearchPage:
        """This page with only its first `taken` hits (at least one), and where to go on."""
        if taken >= len(self.hits):
            return self
        if self.keyed:
            last = self.hits[taken - 1]
            resume = Position((last.agent_id, last.name))
        else:
            resume = Position(self.start.key, self.start.rank + taken)
        return SearchPage(
            self.hits[:taken],
            self.total,
            resume,
            self.keyed,
            self.start,
            self.examined,
            self.exact,
        )


class Listing:
    """Doc ids in key order, overall and per exact name and per keyword. Pure state; call
    `add` / `discard` whenever a capability is indexed or forgotten (`SearchIndex` does)."""

    def __init__(self, keys: Sequence[DocKey]) -> None:
        self.keys = keys
        """Doc id -> (agent_id, name), owned by the search index."""
        self.order = SortedColumn()
        """key -> doc id"""
        self._names = SortedColumn()
        """(name, agent_id) -> doc id"""
        self._keywords = SortedColumn()
        """(keyword lower-cased, agent_id, name) -> doc id"""

    def __len__(self) -> int:
        return len(self.order)

    def add(self, doc: int, key: DocKey, keywords: Iterable[str]) -> None:
        """Index a capability; `keywords` lower-cased, each once."""
        agent_id, name = key
        self.order.add(key, doc)
        self._names.add((name, agent_id), doc)
        for keyword in keywords:
            self._keywords.add((keyword, agent_id, name), doc)

    def discard(self, doc: int, key: DocKey, keywords: Iterable[str]) -> None:
        """Forget what `add` indexed, given the same arguments."""
        agent_id, name = key
        self.order.discard(key, doc)
        self._names.discard((name, agent_id), doc)
        for keyword in keywords:
            self._keywords.discard((keyword, agent_id, name), doc)

    def after(self, key: DocKey | None) -> Iterator[int]:
        """Every doc id whose key comes after `key` (None: all), in key order."""
        return _ids(self.order.spans(key, None, low_open=True))

    def named(self, name: str, key: DocKey | None) -> Iterator[int]:
        """The doc ids of capabilities called `name` after `key`, in key order."""
        # (name + NUL,) sorts after every (name, agent_id) and before any longer name.
        high = (name + "\x00",)
        if key is None:
            return _ids(self._names.spans((name,), high, high_open=True))
        # (agent_id, name) comes after `key` when agent_id is greater, or equal with a greater
        # name: the entry of `key`'s own agent is in when `name` sorts after `key`'s name.
        low, own_agent_in = (name, key[0]), name > key[1]
        return _ids(self._names.spans(low, high, low_open=not own_agent_in, high_open=True))

    def tagged(self, keywords: Iterable[str], key: DocKey | None) -> Iterator[int]:
        """The doc ids of capabilities with any of `keywords` (lower-cased) after `key`, in key
        order, each once."""
        runs = []
        for keyword in sorted(set(keywords)):
            high = (keyword + "\x00",)
            if key is None:
                spans = self._keywords.spans((keyword,), high, high_open=True)
            else:
                low = (keyword, *key)
                spans = self._keywords.spans(low, high, low_open=True, high_open=True)
            runs.append(_ids(spans))
        if len(runs) == 1:
            return runs[0]
        merged = heapq.merge(*runs, key=self.keys.__getitem__)
        return _distinct(merged)


def walk(
    source: Iterator[int],
    admits: Callable[[int], bool] | None,
    *,
    skip: int,
    want: int,
    budget: int,
) -> Walked:
    """Read `source` until `want` docs that `admits` (all, when None) are found past the first
    `skip` of them, or `budget` entries were examined beyond those found."""
    if admits is None:
        found = list(islice(source, skip, skip + want))
        return Walked(found, found[-1] if len(found) == want else None, skip + len(found))
    found = []
    limit = budget + skip + want
    examined = 0
    for examined, at in enumerate(source, 1):
        if admits(at):
            if skip:
                skip -= 1
            else:
                found.append(at)
                if len(found) == want:
                    return Walked(found, at, examined)
        if examined >= limit:
            return Walked(found, at, examined)
    return Walked(found, None, examined)


def _ids(spans: Iterator[tuple[list[int], int, int]]) -> Iterator[int]:
    return chain.from_iterable(ids[start:stop] for ids, start, stop in spans)


def _distinct(merged: Iterator[int]) -> Iterator[int]:
    """A merged run without repeats: a capability with several of the keywords comes once
    from each of their columns, side by side."""
    last: Any = None
    for at in merged:
        if at != last:
            yield at
            last = at


__all__ = [
    "SCAN_BUDGET",
    "DocKey",
    "Hit",
    "Listing",
    "Position",
    "SearchPage",
    "Walked",
    "new_hit",
    "walk",
]
