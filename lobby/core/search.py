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
`exclude_agent`. `total` counts every hit before paging.

Tokens: runs of letters and digits, lower-cased, split at snake_case, kebab-case, dots and
camelCase: `findCheapestPrice_v2` -> find, cheapest, price, v2; `HTTPServer` -> http, server.

Costs, N capabilities of T distinct tokens: `add` / `remove` are O(T log N) (sorted inserts
into blocks of at most 1,024). Name, keyword and filter restrictions are read from indexes
and intersected as sets. `lexical` touches, in Python, the docs with two or more of the
query's tokens and the page's worth of the others (`ranking.py`); the rest, and `total`, are
set operations in C. `simple` scans one lower-cased text per capability (in C, O(N)).
`filtered` without an indexed restriction walks the capabilities in key order.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, Literal, get_args

from lobby.core.filters import AttributeIndex, BadFilter, Filter, Plan, SortedColumn, parse_filters
from lobby.core.ranking import Postings, Ranking, Scored

Algorithm = Literal["simple", "filtered", "lexical"]
ALGORITHMS: Final[tuple[str, ...]] = get_args(Algorithm)
NAME_WEIGHT: Final = 2
KEYWORD_WEIGHT: Final = 2
DESCRIPTION_WEIGHT: Final = 1
SIMPLE_NAME: Final = 3.0
SIMPLE_KEYWORD: Final = 2.0
SIMPLE_DESCRIPTION: Final = 1.0

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")

DocKey = tuple[str, str]


def tokens(text: str) -> list[str]:
    """The words of `text` as the index sees them (see the module doc)."""
    return [t.lower() for t in _WORD.findall(_CAMEL.sub(" ", text))]


@dataclass(frozen=True, slots=True)
class Hit:
    agent_id: str
    name: str
    score: float


@dataclass(frozen=True, slots=True)
class SearchPage:
    hits: list[Hit]
    total: int
    """Hits before paging."""


@dataclass(slots=True)
class _Doc:
    key: DocKey
    description: str
    keywords: tuple[str, ...]
    attributes: Mapping[str, Any]


_FREE: Final = _Doc(("", ""), "", (), {})


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
        self._order = SortedColumn()
        """Every doc id, in key order."""
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
        doc = _Doc(key, description, keywords, dict(attributes))
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
        self._order.add(key, at)
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
        self._order.discard(key, at)
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
        only: Iterable[DocKey] | None = None,
    ) -> SearchPage:
        """One page of hits, best first, and the total before paging (see the module doc).

        `only` restricts to those (agent_id, name) keys, like `capability_name` / `keywords`.
        Raises ValueError for an unknown algorithm or a negative `limit` / `offset`."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown search algorithm {algorithm!r}")
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must not be negative")
        text = (query or "").strip() if algorithm != "filtered" else ""
        words = sorted(set(tokens(text))) if algorithm == "lexical" else []
        terms = [self._terms[w] for w in words if w in self._terms]
        if words and not terms:
            return SearchPage([], 0)
        budget = sum(len(t.tf) for t in terms) or len(self._ids)
        plan = self._plan(capability_name, keywords, filters or (), exclude_agent, only, budget)
        if plan is None:
            return SearchPage([], 0)
        want = offset + limit
        ranking = Ranking(self._keys, self._order, len(self._ids))
        if not text:
            ids, total = self._unranked(plan, want, ranking)
            score = 1.0 if algorithm == "filtered" else 0.0
            top = [(score, at) for at in ids]
        elif algorithm == "simple":
            scored = self._simple(text.lower(), plan)
            top, total = ranking.best(scored, want), len(scored)
        else:
            average = self._total_length / len(self._ids) or 1.0
            top, total = ranking.lexical(terms, self._lengths, average, plan, want)
        keys = self._keys
        return SearchPage([Hit(*keys[at], score) for score, at in top[offset:want]], total)

    def _plan(
        self,
        capability_name: str | None,
        keywords: Sequence[str] | None,
        filters: Sequence[Filter],
        exclude_agent: str | None,
        only: Iterable[DocKey] | None,
        budget: int,
    ) -> Plan | None:
        """The restrictions as one allowed set, intersected smallest first, and per-doc checks;
        None when nothing can pass. A filter admitting more than 16x what is allowed so far (or
        than `budget`, the docs the algorithm visits anyway) is checked per doc instead: reading
        a doc id from the index costs about a sixteenth of testing a doc."""
        sets: list[set[int]] = []
        if capability_name is not None:
            sets.append(self._by_name.get(capability_name, set()))
        if keywords:
            found = [self._by_keyword.get(k.lower(), set()) for k in keywords]
            sets.append(found[0] if len(found) == 1 else set().union(*found))
        if only is not None:
            sets.append({self._ids[k] for k in only if k in self._ids})
        allowed: set[int] | None = None
        for members in sorted(sets, key=len):
            allowed = members if allowed is None else allowed & members
        checks: list[Filter] = []
        for size, _, f in sorted((self._attributes.size(f), n, f) for n, f in enumerate(filters)):
            if size == 0 or (allowed is not None and not allowed):
                return None
            if size > 16 * (budget if allowed is None else min(budget, len(allowed))):
                checks.append(f)
            else:
                allowed = self._attributes.members(f, allowed)
        if allowed is not None and not allowed:
            return None
        excluded = self._by_agent.get(exclude_agent, set()) if exclude_agent else set()
        return Plan(allowed, excluded, checks, self._attributes_of)

    def _attributes_of(self, doc: int) -> Mapping[str, Any]:
        return self._docs[doc].attributes

    def _unranked(self, plan: Plan, want: int, ranking: Ranking) -> tuple[list[int], int]:
        """The first `want` admitted docs by key, and how many are admitted."""
        if plan.allowed is None and not plan.checks:
            walk = (at for at in self._order if at not in plan.excluded)
            return list(islice(walk, want)), len(self._ids) - len(plan.excluded)
        if plan.allowed is None:
            members = [at for at in self._order if plan.admits(at)]
            return members[:want], len(members)
        admitted: Collection[int] = plan.allowed
        if plan.excluded or plan.checks:
            admitted = [at for at in admitted if plan.admits(at)]
        return ranking.first_by_key(admitted, want), len(admitted)

    def _simple(self, query: str, plan: Plan) -> list[Scored]:
        texts = self._texts
        if "\x00" in query:
            return []
        if plan.allowed is None:
            found = [at for at, text in enumerate(texts) if query in text]
        else:
            found = [at for at in plan.allowed if query in texts[at]]
        scored = []
        for at in found:
            if not plan.admits(at):
                continue
            text = texts[at]  # name NUL keywords NUL ... description: which fields match?
            name_end, description_start = text.find("\x00"), text.rfind("\x00") + 1
            score = SIMPLE_NAME if text.find(query, 0, name_end) >= 0 else 0.0
            if text.find(query, name_end, description_start) >= 0:
                score += SIMPLE_KEYWORD
            if text.find(query, description_start) >= 0:
                score += SIMPLE_DESCRIPTION
            scored.append((score, at))
        return scored


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
    "Filter",
    "Hit",
    "SearchIndex",
    "SearchPage",
    "parse_filters",
    "tokens",
]
