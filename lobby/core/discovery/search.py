"""Ranked search over registered capabilities: `simple`, `filtered` and `lexical` (BM25).

Call `add` on register and update (it replaces), `remove` / `remove_agent` on unregister; the
index changes in place, never rebuilt. Documents are capabilities, keyed (agent_id, name).

Algorithms (higher scores rank first; equal scores by agent_id, then name):

- `simple`: the query, lower-cased, as a substring of the lower-cased name (3 points), of any
  keyword (2) and of the description (1), summed; a capability scoring 0 is no hit.
- `filtered`: the restrictions alone; every hit scores 1.0, so hits come by (agent_id, name).
- `lexical`: Okapi BM25, k1 = 1.2, b = 0.75, idf = ln(1 + (N - n + 0.5) / (n + 0.5)), summed
  over the query's distinct tokens (`ranking.py`). A capability's tokens are those of its name
  and keywords, each counted twice (a field weight), and of its description, once; its length
  is their count. It is a hit when it has a query token, except that a token found in more
  than half of all capabilities (common, like a stop word) only adds to the hits of the
  query's rarer tokens, when it has any.
- No query text (None or blank) with `simple` or `lexical`: every capability passing the
  restrictions is a hit scoring 0.0. Text with no word in it ("?!") finds nothing in `lexical`.

Restrictions, with any algorithm: `capability_name` (exact), `keywords` (one of them equals a
keyword of the capability, case-insensitively), `filters` (all hold; `filters.py`) and
`exclude_agent`. `total` counts every hit before paging, unless counting would cost more than
a page: None past one `simple` window, and for restrictions too wide to count within
`READ_BUDGET` / `COUNT_BUDGET` (`filters.py`).

Paging (`SearchPage.next`, a `listing.Position`): key-ordered pages (`filtered`, no query text,
and `lookup`, the seed's discovery) go on after their last key; `lexical` pages by rank, up to
`RANKED_WINDOW`; `simple` reads the capabilities in key order in windows of `SIMPLE_WINDOW`,
ranks the hits of a window and serves them by rank, then moves to the next window. So with at
most `SIMPLE_WINDOW` capabilities (after the restrictions) `simple` ranks them all at once.

Tokens: runs of letters and digits, lower-cased, split at snake_case, kebab-case, dots and
camelCase: `findCheapestPrice_v2` -> find, cheapest, price, v2; `HTTPServer` -> http, server.

Costs, N capabilities of T distinct tokens: `add` / `remove` are O(T log N) (sorted inserts
into blocks of at most 1,024). A page costs about its own size, not N: `lookup` reads sorted
columns (`listing.py`) from where the page starts, O(log N + page); key-ordered pages walk the
key order from their start, examining at most `SCAN_BUDGET` entries beyond the page (fewer
hits and a `next` when the restrictions reject more), or sort a restriction's few members;
restrictions are read from indexes into sets only within `READ_BUDGET` ids, and tested per
capability past it. `lexical` touches, in Python, the docs with two or more of the query's
tokens and the page's worth of the others, up to the page's rank (`ranking.py`); the rest are
set operations in C. `simple` tests one lower-cased text per capability of its window.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import filterfalse
from typing import Any, Final, Literal, get_args

from lobby.core.discovery.filters import (
    READ_BUDGET,
    AttributeIndex,
    BadFilter,
    Filter,
    Plan,
    parse_filters,
)
from lobby.core.discovery.listing import (
    SCAN_BUDGET,
    Hit,
    Listing,
    Position,
    SearchPage,
    Walked,
    new_hit,
    walk,
)
from lobby.core.discovery.ranking import Postings, Ranking, Scored
from protocol.payloads import MAX_RANK

Algorithm = Literal["simple", "filtered", "lexical"]
ALGORITHMS: Final[tuple[str, ...]] = get_args(Algorithm)
NAME_WEIGHT: Final = 2
KEYWORD_WEIGHT: Final = 2
DESCRIPTION_WEIGHT: Final = 1
SIMPLE_NAME: Final = 3.0
SIMPLE_KEYWORD: Final = 2.0
SIMPLE_DESCRIPTION: Final = 1.0
RANKED_WINDOW: Final = MAX_RANK
"""`lexical` results past this rank are not served: a page costs about its rank."""
SIMPLE_WINDOW: Final = 500
"""`simple` ranks the hits among this many capabilities at a time (see the module doc)."""
MAX_QUERY_WORDS: Final = 16
"""Distinct words a `lexical` query may have: its cost grows with their pairs."""
DENSE: Final = 16
"""A restriction admitting at least 1/DENSE of the capabilities is read by walking the key
order and testing each entry; a sparser one by sorting its members."""

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")

DocKey = tuple[str, str]
_Source = tuple[Callable[[DocKey | None], Iterator[int]], int]
"""Doc ids in key order after a key, from the narrowest column (`SearchIndex._source`)."""


def tokens(text: str) -> list[str]:
    """The words of `text` as the index sees them (see the module doc)."""
    return [t.lower() for t in _WORD.findall(_CAMEL.sub(" ", text))]


class BadQuery(ValueError):
    """A query the index will not run; the text names the problem."""


@dataclass(slots=True)
class _Doc:
    description: str
    keywords: tuple[str, ...]
    attributes: Mapping[str, Any]


_FREE: Final = _Doc("", (), {})


class SearchIndex:
    """Capabilities, their inverted indexes, and ranked search over them. Pure state."""

    def __init__(self) -> None:
        self._ids: dict[DocKey, int] = {}
        self._keys: list[DocKey] = []
        """Doc id -> key. Ids of removed docs are reused."""
        self._docs: list[_Doc] = []
        """Doc id -> doc; `_FREE` while the id is unused."""
        self._lengths: list[int] = []
        """Doc id -> BM25 length."""
        self._texts: list[str] = []
        """Doc id -> name, keywords and description, lower-cased, NUL-separated (`simple`)."""
        self._free: list[int] = []
        self.listing = Listing(self._keys)
        """Every doc id in key order, overall, per name and per keyword (the lookups)."""
        self._terms: dict[str, Postings] = {}
        self._by_name: dict[str, set[int]] = {}
        self._by_keyword: dict[str, set[int]] = {}
        self._by_agent: dict[str, set[int]] = {}
        self._attributes = AttributeIndex()
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def add(
        self,
        agent_id: str,
        name: str,
        description: str,
        keywords: Sequence[str],
        attributes: Mapping[str, Any],
    ) -> None:
        """Index a capability, replacing the one with the same (agent_id, name)."""
        key = (agent_id, name)
        if key in self._ids:
            self.remove(agent_id, name)
        keywords = tuple(keywords)
        text = "\x00".join([name, *keywords, description]).lower()
        doc = _Doc(description, keywords, dict(attributes))
        terms = _count_terms(name, description, keywords)
        length = terms.total()
        if self._free:
            at = self._free.pop()
            self._keys[at], self._docs[at], self._lengths[at] = key, doc, length
            self._texts[at] = text
        else:
            at = len(self._docs)
            self._keys.append(key)
            self._docs.append(doc)
            self._lengths.append(length)
            self._texts.append(text)
        self._ids[key] = at
        self.listing.add(at, key, {k.lower() for k in keywords})
        key_of = self._keys.__getitem__
        for token, tf in terms.items():
            postings = self._terms.get(token)
            if postings is None:
                postings = self._terms[token] = Postings({}, {})
            postings.add(at, tf, length, key_of)
        self._total_length += length
        self._by_name.setdefault(name, set()).add(at)
        for keyword in {k.lower() for k in keywords}:
            self._by_keyword.setdefault(keyword, set()).add(at)
        self._by_agent.setdefault(agent_id, set()).add(at)
        self._attributes.add(at, doc.attributes)

    def remove(self, agent_id: str, name: str) -> None:
        """Forget a capability; nothing happens if it is not indexed."""
        key = (agent_id, name)
        at = self._ids.pop(key, None)
        if at is None:
            return
        doc, length = self._docs[at], self._lengths[at]
        self.listing.discard(at, key, {k.lower() for k in doc.keywords})
        key_of = self._keys.__getitem__
        for token in _count_terms(name, doc.description, doc.keywords):
            postings = self._terms[token]
            postings.discard(at, key, length, key_of)
            if not postings.tf:
                del self._terms[token]
        self._total_length -= length
        _discard(self._by_name, name, at)
        for keyword in {k.lower() for k in doc.keywords}:
            _discard(self._by_keyword, keyword, at)
        _discard(self._by_agent, agent_id, at)
        self._attributes.discard(at, doc.attributes)
        self._docs[at], self._texts[at] = _FREE, ""
        self._free.append(at)

    def remove_agent(self, agent_id: str) -> None:
        """Forget every capability of `agent_id`."""
        for at in list(self._by_agent.get(agent_id, ())):
            self.remove(*self._keys[at])

    def search(
        self,
        *,
        query: str | None,
        algorithm: Algorithm,
        capability_name: str | None = None,
        keywords: Sequence[str] | None = None,
        filters: Sequence[Filter] | None = None,
        exclude_agent: str | None = None,
        limit: int = 50,
        offset: int = 0,
        after: DocKey | None = None,
    ) -> SearchPage:
        """One page of hits, best first, the total before paging, and where the next page
        starts (see the module doc). Key-ordered results start after `after`; all skip `offset`
        of theirs first (for ranked ones, `after` is where the window of a `simple` search
        starts). `limit` 0 only counts.

        Raises ValueError for an unknown algorithm or a negative `limit` / `offset`, and
        `BadQuery` for a `lexical` query of more than `MAX_QUERY_WORDS` distinct words."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown search algorithm {algorithm!r}")
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must not be negative")
        text = (query or "").strip() if algorithm != "filtered" else ""
        words = sorted(set(tokens(text))) if algorithm == "lexical" else []
        if len(words) > MAX_QUERY_WORDS:
            raise BadQuery(f"the query has {len(words)} distinct words; at most {MAX_QUERY_WORDS}")
        terms = [self._terms[w] for w in words if w in self._terms]
        if text and algorithm == "lexical" and not terms:
            return SearchPage([], 0)  # no word of it is indexed ("?!" has none at all)
        budget = sum(len(t.tf) for t in terms) or len(self._ids)
        plan = self._plan(capability_name, keywords, filters or (), exclude_agent, budget)
        if plan is None:
            return SearchPage([], 0)
        start = Position(after, offset)
        source = self._source(capability_name, keywords)
        if not text:
            score = 1.0 if algorithm == "filtered" else 0.0
            return self._unranked(plan, source, start, limit, score)
        if algorithm == "simple":
            return self._simple(text.lower(), plan, source, start, limit)
        want = max(offset, min(offset + limit, RANKED_WINDOW))
        average = self._total_length / len(self._ids)  # `terms`: some doc has a token
        ranking = Ranking(self._keys, self.listing.order, len(self._ids))
        # One more than the page, to know whether another follows (the total may be unknown).
        top, total, exact = ranking.lexical(terms, self._lengths, average, plan, want + 1)
        hits = [new_hit(Hit, (*self._keys[at], score)) for score, at in top[offset:want]]
        served = offset + len(hits)
        resume = Position(None, served) if len(top) > want and served < RANKED_WINDOW else None
        page = SearchPage(hits, total, resume if limit else None, False, start)
        return page if exact else replace(page, exact=False)

    def lookup(
        self,
        *,
        capability_name: str | None,
        keywords: Sequence[str] | None,
        exclude_agent: str | None,
        after: DocKey | None,
        limit: int,
    ) -> SearchPage:
        """The seed's discovery: capabilities with `capability_name` and any of `keywords`
        (everything when neither), not `exclude_agent`'s, in key order after `after`; at most
        `limit`, examining at most `SCAN_BUDGET` more. O(log N + what it examines)."""
        wanted = {k.lower() for k in keywords} if keywords else set()
        excluded = self._by_agent.get(exclude_agent, set()) if exclude_agent else set()
        docs, keys = self._docs, self._keys

        def has_keyword(at: int) -> bool:
            return at not in excluded and any(k.lower() in wanted for k in docs[at].keywords)

        def has_name(at: int) -> bool:
            return at not in excluded and keys[at][1] == capability_name

        admits: Callable[[int], bool] | None = None
        source = self.listing.after(after)
        if capability_name is not None:
            source = self.listing.named(capability_name, after)
            if wanted:  # read the smaller index, test the other condition per capability
                named = len(self._by_name.get(capability_name, ()))
                if named <= sum(len(self._by_keyword.get(k, ())) for k in wanted):
                    admits = has_keyword
                else:
                    source, admits = self.listing.tagged(wanted, after), has_name
        elif wanted:
            source = self.listing.tagged(wanted, after)
        if admits is None and excluded:  # skipped in C: at most the requester's capabilities
            source = filterfalse(excluded.__contains__, source)
        walked = walk(source, admits, skip=0, want=limit + 1, budget=SCAN_BUDGET)
        return self._keyed_page(walked, limit, 0.0, None, Position(after))

    def _plan(
        self,
        capability_name: str | None,
        keywords: Sequence[str] | None,
        filters: Sequence[Filter],
        exclude_agent: str | None,
        budget: int,
    ) -> Plan | None:
        """The restrictions as one allowed set, intersected smallest first, and per-doc checks;
        None when nothing can pass. A filter admitting more than 16x what is allowed so far (or
        than `budget`, the docs the algorithm visits anyway) is checked per doc instead: reading
        a doc id from the index costs about a sixteenth of testing a doc. So is any restriction
        that would take the ids read past `READ_BUDGET`: a page must not cost the registry's
        size."""
        reads = READ_BUDGET
        sets: list[set[int]] = []
        tests: list[Callable[[int], bool]] = []
        if capability_name is not None:
            sets.append(self._by_name.get(capability_name, set()))
        if keywords:
            found = [self._by_keyword.get(k.lower(), set()) for k in keywords]
            size = sum(map(len, found))
            if len(found) == 1:
                sets.append(found[0])
            elif size <= reads:
                sets.append(set().union(*found))
                reads -= size
            else:
                wanted = {k.lower() for k in keywords}
                docs = self._docs
                tests.append(lambda at: any(k.lower() in wanted for k in docs[at].keywords))
        allowed: set[int] | None = None
        for members in sorted(sets, key=len):
            if allowed is None:
                allowed = members
            elif len(allowed) <= reads:  # the smaller side is what the intersection reads
                reads -= len(allowed)
                allowed = allowed & members
            else:
                tests.append(members.__contains__)
        checks: list[Filter] = []
        for size, _, f in sorted((self._attributes.size(f), n, f) for n, f in enumerate(filters)):
            if size == 0 or (allowed is not None and not allowed):
                return None
            wide = size > 16 * (budget if allowed is None else min(budget, len(allowed)))
            if wide or size > reads:
                checks.append(f)
            else:
                allowed = self._attributes.members(f, allowed)
                reads -= size
        if allowed is not None and not allowed:
            return None
        excluded = self._by_agent.get(exclude_agent, set()) if exclude_agent else set()
        return Plan(allowed, excluded, checks, self._attributes_of, tests)

    def _attributes_of(self, doc: int) -> Mapping[str, Any]:
        return self._docs[doc].attributes

    def _source(self, capability_name: str | None, keywords: Sequence[str] | None) -> _Source:
        """The narrowest key-ordered column holding every candidate, and its size."""
        if capability_name is not None:
            name, named = capability_name, self.listing.named
            return lambda after: named(name, after), len(self._by_name.get(name, ()))
        if keywords:
            wanted = {k.lower() for k in keywords}
            tagged = self.listing.tagged
            size = sum(len(self._by_keyword.get(k, ())) for k in wanted)
            return lambda after: tagged(wanted, after), size
        return self.listing.after, len(self._ids)

    def _unranked(
        self, plan: Plan, source: _Source, start: Position, limit: int, score: float
    ) -> SearchPage:
        """The admitted docs in key order from `start`, all scoring `score`."""
        total: int | None = None  # not counted: wide restrictions, tested per doc
        if plan.allowed is None and not plan.per_doc:
            total = len(self._ids) - len(plan.excluded)
        elif plan.allowed is not None and not plan.per_doc:
            total = len(plan.allowed) - len(plan.excluded & plan.allowed)
        elif plan.allowed is not None:
            total = plan.count(plan.allowed)
        if not limit:
            return SearchPage([], total)
        walked = self._admitted(plan, source, start, limit + 1)
        return self._keyed_page(walked, limit, score, total, start)

    def _keyed_page(
        self, walked: Walked, limit: int, score: float, total: int | None, start: Position
    ) -> SearchPage:
        """A key-ordered page of `walked` (which looked for one more than `limit`)."""
        keys = self._keys
        hits = [new_hit(Hit, (*keys[at], score)) for at in walked.found[:limit]]
        resume = None
        if not limit:  # only counted: no page to go on from
            pass
        elif len(walked.found) > limit:
            resume = Position(keys[walked.found[limit - 1]])
        elif walked.stopped_at is not None:
            resume = Position(keys[walked.stopped_at])
        return SearchPage(hits, total, resume, True, start, walked.examined)

    def _admitted(self, plan: Plan, source: _Source, start: Position, want: int) -> Walked:
        """The first `want` docs `plan` admits after `start.key` in key order, past the first
        `start.rank` of them: by walking `source` (examining at most `SCAN_BUDGET` more) when
        the plan admits much of it, else by sorting the few it admits."""
        allowed = plan.allowed
        column, size = source
        if allowed is None or len(allowed) * DENSE >= size:
            docs = column(start.key)
            admits: Callable[[int], bool] | None = plan.admits
            if allowed is None and not plan.per_doc:  # skipped in C, as in `lookup`
                docs, admits = filterfalse(plan.excluded.__contains__, docs), None
            return walk(docs, admits, skip=start.rank, want=want, budget=SCAN_BUDGET)
        keys, after = self._keys, start.key
        members = [
            at
            for at in allowed
            if (after is None or keys[at] > after) and (plan.everything or plan.admits(at))
        ]
        first = heapq.nsmallest(start.rank + want, members, key=keys.__getitem__)
        found = first[start.rank :]
        stopped_at = found[-1] if len(members) > len(first) and found else None
        return Walked(found, stopped_at, len(allowed))

    def _simple(
        self, query: str, plan: Plan, source: _Source, start: Position, limit: int
    ) -> SearchPage:
        """`simple`, one window at a time: the next `SIMPLE_WINDOW` admitted capabilities in
        key order after `start.key`, their hits ranked, served from rank `start.rank`."""
        window = self._admitted(plan, source, Position(start.key), SIMPLE_WINDOW)
        texts = self._texts
        scored: list[Scored] = []
        if "\x00" not in query:
            for at in window.found:
                text = texts[at]  # name NUL keywords NUL ... description: which fields match?
                if query not in text:
                    continue
                name_end, description_start = text.find("\x00"), text.rfind("\x00") + 1
                score = SIMPLE_NAME if text.find(query, 0, name_end) >= 0 else 0.0
                if text.find(query, name_end, description_start) >= 0:
                    score += SIMPLE_KEYWORD
                if text.find(query, description_start) >= 0:
                    score += SIMPLE_DESCRIPTION
                scored.append((score, at))
        whole = start.key is None and window.stopped_at is None
        ranking = Ranking(self._keys, self.listing.order, len(self._ids))
        top = ranking.best(scored, start.rank + limit)[start.rank :]
        hits = [new_hit(Hit, (*self._keys[at], score)) for score, at in top]
        resume = None
        if not limit:
            pass
        elif len(scored) > start.rank + len(hits):
            resume = Position(start.key, start.rank + len(hits))
        elif window.stopped_at is not None:
            resume = Position(self._keys[window.stopped_at])
        total = len(scored) if whole else None
        return SearchPage(hits, total, resume, False, start, window.examined)


def _count_terms(name: str, description: str, keywords: Sequence[str]) -> Counter[str]:
    terms = Counter(tokens(name) * NAME_WEIGHT)
    for keyword in keywords:
        terms.update(tokens(keyword) * KEYWORD_WEIGHT)
    terms.update(tokens(description) * DESCRIPTION_WEIGHT)
    return terms


def _discard(index: dict[str, set[int]], key: str, member: int) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BadFilter",
    "BadQuery",
    "Filter",
    "Hit",
    "SearchIndex",
    "SearchPage",
    "parse_filters",
    "tokens",
]
