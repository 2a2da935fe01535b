"""Ranked search over registered capabilities: `simple`, `filtered` and `lexical` (BM25).

The index is kept up to date on every register, update and unregister (`add` / `remove`), never
rebuilt. Documents are capabilities, keyed by (agent_id, name).

- `simple`: case-insensitive substring of the query in the name (3 points), a keyword (2) or
  the description (1); the score is the sum. Scans every capability.
- `filtered`: the filters alone, score 1.0. Equality and membership filters use a value index.
- `lexical`: Okapi BM25 (k1 = 1.2, b = 0.75) over the tokens of name, keywords and description
  (name and keyword tokens count twice), restricted by the filters. Only capabilities sharing a
  token with the query are scored; a token found in more than half of all capabilities only
  adds to the capabilities the query's rarer tokens found (when it has any).

Tokens: lower-cased runs of letters and digits, with snake_case, kebab-case, dots and camelCase
split (`findCheapestPrice_v2` -> find, cheapest, price, v2). Results are ordered by score, then
agent id, then capability name, so ties break the same way every time.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

Algorithm = Literal["simple", "filtered", "lexical"]
ALGORITHMS: Final = ("simple", "filtered", "lexical")
K1: Final = 1.2
B: Final = 0.75
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD = re.compile(r"[A-Za-z0-9]+")
_OPS: Final = ("eq", "ne", "lt", "le", "gt", "ge", "in", "contains")

DocKey = tuple[str, str]


class BadFilter(ValueError):
    """A filter that cannot be applied; the text names the problem."""


def tokens(text: str) -> list[str]:
    return [t.lower() for t in _WORD.findall(_CAMEL.sub(r"\1 \2", text))]


@dataclass(frozen=True, slots=True)
class Filter:
    attribute: str
    op: str
    value: Any

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        if self.attribute not in attributes:
            return False
        have, want = attributes[self.attribute], self.value
        try:
            if self.op == "eq":
                return bool(have == want)
            if self.op == "ne":
                return bool(have != want)
            if self.op == "in":
                return have in want
            if self.op == "contains":
                return isinstance(have, list) and want in have
            if isinstance(have, bool) or not isinstance(have, int | float):
                return False
            if self.op == "lt":
                return bool(have < want)
            if self.op == "le":
                return bool(have <= want)
            if self.op == "gt":
                return bool(have > want)
            return bool(have >= want)
        except TypeError:
            return False


def parse_filters(raw: object) -> list[Filter]:
    """Filters from JSON: a list of {"attribute", "op", "value"}; `BadFilter` otherwise."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadFilter("'filters' must be a list of {attribute, op, value} objects")
    filters = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("attribute"), str):
            raise BadFilter(f"filters[{index}] needs a string 'attribute'")
        op = item.get("op", "eq")
        if op not in _OPS:
            raise BadFilter(f"filters[{index}]: unknown op {op!r} (one of {', '.join(_OPS)})")
        if "value" not in item:
            raise BadFilter(f"filters[{index}] needs a 'value'")
        value = item["value"]
        if op == "in" and not isinstance(value, list):
            raise BadFilter(f"filters[{index}]: 'in' needs a list value")
        if op in ("lt", "le", "gt", "ge") and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            raise BadFilter(f"filters[{index}]: {op!r} needs a number")
        filters.append(Filter(item["attribute"], op, value))
    return filters


@dataclass(slots=True)
class _Doc:
    name: str
    description: str
    keywords: tuple[str, ...]
    attributes: Mapping[str, Any]
    terms: Counter[str]
    length: int


@dataclass(frozen=True, slots=True)
class Hit:
    agent_id: str
    name: str
    score: float


@dataclass(frozen=True, slots=True)
class SearchPage:
    hits: list[Hit]
    total: int


class SearchIndex:
    def __init__(self) -> None:
        self._docs: dict[DocKey, _Doc] = {}
        self._postings: dict[str, dict[DocKey, int]] = {}
        self._values: dict[tuple[str, Any], set[DocKey]] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._docs)

    def add(
        self,
        agent_id: str,
        name: str,
        description: str,
        keywords: Sequence[str],
        attributes: Mapping[str, Any],
    ) -> None:
        key = (agent_id, name)
        self.remove(agent_id, name)
        terms = Counter(tokens(name) * 2 + [t for k in keywords for t in tokens(k)] * 2)
        terms.update(tokens(description))
        doc = _Doc(name, description, tuple(keywords), dict(attributes), terms, terms.total())
        self._docs[key] = doc
        self._total_length += doc.length
        for term, count in terms.items():
            self._postings.setdefault(term, {})[key] = count
        for attribute, value in _hashable_values(attributes):
            self._values.setdefault((attribute, value), set()).add(key)

    def remove(self, agent_id: str, name: str) -> None:
        key = (agent_id, name)
        doc = self._docs.pop(key, None)
        if doc is None:
            return
        self._total_length -= doc.length
        for term in doc.terms:
            postings = self._postings[term]
            del postings[key]
            if not postings:
                del self._postings[term]
        for pair in _hashable_values(doc.attributes):
            members = self._values[pair]
            members.discard(key)
            if not members:
                del self._values[pair]

    def search(
        self,
        *,
        query: str | None,
        algorithm: Algorithm,
        filters: Sequence[Filter] = (),
        exclude_agent: str | None = None,
        only: Iterable[DocKey] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> SearchPage:
        """Ranked hits; `only` restricts to those documents (e.g. an exact name lookup)."""
        candidates: Iterable[DocKey] | None = only
        if candidates is None:
            candidates = self._narrow(filters)
        if candidates is None:
            candidates = self._docs
        if algorithm == "lexical":
            scored = self._bm25(tokens(query or ""), candidates if only is not None else None)
        elif algorithm == "simple":
            scored = self._simple((query or "").lower(), candidates)
        else:
            scored = [(key, 1.0) for key in candidates]
        hits = [
            Hit(key[0], key[1], round(score, 6))
            for key, score in scored
            if key[0] != exclude_agent
            and key in self._docs
            and all(f.matches(self._docs[key].attributes) for f in filters)
        ]
        order = _rank_order
        top = heapq.nsmallest(offset + limit, hits, key=order) if hits else []
        return SearchPage(top[offset:], len(hits))

    def _narrow(self, filters: Sequence[Filter]) -> set[DocKey] | None:
        """The documents an equality or membership filter allows, from the value index."""
        best: set[DocKey] | None = None
        for f in filters:
            if f.op == "eq" and _hashable(f.value):
                allowed = self._values.get((f.attribute, f.value), set())
            elif f.op == "in" and all(_hashable(v) for v in f.value):
                allowed = set().union(*(self._values.get((f.attribute, v), set()) for v in f.value))
            else:
                continue
            best = allowed if best is None or len(allowed) < len(best) else best
        return best if best is not None else None

    def _simple(self, query: str, candidates: Iterable[DocKey]) -> list[tuple[DocKey, float]]:
        scored = []
        for key in candidates:
            doc = self._docs.get(key)
            if doc is None:
                continue
            score = 3.0 * (query in doc.name.lower())
            score += 2.0 * any(query in k.lower() for k in doc.keywords)
            score += 1.0 * (query in doc.description.lower())
            if score:
                scored.append((key, score))
        return scored

    def _bm25(
        self, query: list[str], restrict: Iterable[DocKey] | None
    ) -> list[tuple[DocKey, float]]:
        count = len(self._docs)
        if not count:
            return []
        average = self._total_length / count
        allowed = set(restrict) if restrict is not None else None
        found = [(term, p) for term in set(query) if (p := self._postings.get(term))]
        found.sort(key=lambda pair: len(pair[1]))  # rarest first
        has_rare = bool(found) and len(found[0][1]) <= count / 2
        scores: dict[DocKey, float] = {}
        docs = self._docs
        for _term, postings in found:
            idf = math.log(1 + (count - len(postings) + 0.5) / (len(postings) + 0.5))
            common = has_rare and len(postings) > count / 2
            # A term in most capabilities only re-ranks what the rarer terms found: scoring
            # it everywhere would cost a pass over the whole index for little information.
            pairs = (
                ((key, postings[key]) for key in list(scores) if key in postings)
                if common
                else postings.items()
            )
            for key, tf in pairs:
                if allowed is not None and key not in allowed:
                    continue
                norm = tf + K1 * (1 - B + B * docs[key].length / average)
                scores[key] = scores.get(key, 0.0) + idf * tf * (K1 + 1) / norm
        return list(scores.items())


def _rank_order(hit: Hit) -> tuple[float, str, str]:
    return (-hit.score, hit.agent_id, hit.name)


def _hashable(value: object) -> bool:
    return isinstance(value, str | int | float | bool)


def _hashable_values(attributes: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in attributes.items() if _hashable(v)]
