"""BM25 postings and top-k ranking for `search.py`: exact, without scoring every posting.

Okapi BM25, k1 = 1.2, b = 0.75: a token's weight in a capability is
idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average length)), with
idf = ln(1 + (N - n + 0.5) / (n + 0.5)) for a token in n of N capabilities; a capability's score
is the sum over the query's distinct tokens it has. A token in more than half of all
capabilities (common) only adds to capabilities the query's rarer tokens found, when it has any
(the "drivers"; the common ones are "extras").

Every doc of one posting group (same tf, same length) gets the same weight from a token, and
groups are kept in key order, so:
- one driver: read its groups best first, stop when the page is full and the next group (plus
  the extras' best) is below the page;
- several drivers: a doc with only one of them scores like the above; the docs with two or
  more are the pairwise intersections of the postings (set operations, in C), usually few,
  and are scored one by one. When they are many, Fagin's threshold algorithm reads all
  drivers' groups best first instead and stops once no unread doc can beat the page. When it
  cannot stop within `THRESHOLD_READS` (many docs of similar, not equal, scores), exactness
  would cost scoring them all, one by one: the page is the best it read, marked approximate.
Scores are summed in one order everywhere (drivers, then extras), so a doc gets the same float
whichever way it is found, and bounds are summed the same way so rounding cannot break them.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import islice
from typing import Final

from lobby.core.discovery.filters import READ_BUDGET, Plan

K1: Final = 1.2
B: Final = 0.75
COMMON: Final = 0.5
"""A token in more than this share of all capabilities is common."""
_PAIR_WORK: Final = 40_000
"""Above this many postings to intersect, the threshold algorithm runs instead."""
_MULTI: Final = 512
"""Above this many docs with two or more drivers, the threshold algorithm runs instead."""
THRESHOLD_READS: Final = 512
"""Reads the threshold algorithm may make beyond two a result before it settles for the best it
read (an approximate page): exact ranking of many near-equal docs costs scoring them all."""
_SCORE_ALL: Final = 512
"""Up to this many restricted candidates are all scored, none skipped."""

DocKey = tuple[str, str]
Scored = tuple[float, int]  # (score, doc id)


@dataclass(slots=True, eq=False)
class Postings:
    """A token's postings: tf by doc id, and doc ids by (tf, doc length), each in key order."""

    tf: dict[int, int]
    groups: dict[tuple[int, int], list[int]]

    def __len__(self) -> int:
        return len(self.tf)

    def add(self, doc: int, tf: int, length: int, key_of: Callable[[int], DocKey]) -> None:
        self.tf[doc] = tf
        insort(self.groups.setdefault((tf, length), []), doc, key=key_of)

    def discard(self, doc: int, key: DocKey, length: int, key_of: Callable[[int], DocKey]) -> None:
        group_key = (self.tf.pop(doc), length)
        group = self.groups[group_key]
        del group[bisect_left(group, key, key=key_of)]
        if not group:
            del self.groups[group_key]


class Ranking:
    """Ranked results in (-score, key) order; `order` is every doc id in key order."""

    def __init__(self, keys: Sequence[DocKey], order: Iterable[int], count: int) -> None:
        self.keys, self.order, self.count = keys, order, count

    def best(self, scored: list[Scored], want: int) -> list[Scored]:
        """The `want` best of `scored`."""
        if len(scored) > want:
            if not want:
                return []
            cut = heapq.nlargest(want, [s for s, _ in scored])[-1]
            above = [pair for pair in scored if pair[0] > cut]
            tied = self.first_by_key([at for s, at in scored if s == cut], want - len(above))
            scored = above + [(cut, at) for at in tied]
        keys = self.keys
        return sorted(scored, key=lambda pair: (-pair[0], keys[pair[1]]))

    def first_by_key(self, ids: Collection[int], want: int) -> list[int]:
        """The `want` first of `ids` by key: by walking the key order when that should find
        them within two steps an id (and stopping after that many if it does not), else by
        sorting."""
        steps = 2 * len(ids)
        if want < len(ids) and want * self.count < len(ids) * steps:
            members = ids if isinstance(ids, AbstractSet) else set(ids)
            walk = (at for at in islice(self.order, steps) if at in members)
            found = list(islice(walk, want))
            if len(found) == want:
                return found
        return heapq.nsmallest(want, ids, key=self.keys.__getitem__)

    def lexical(
        self,
        terms: list[Postings],
        lengths: Sequence[int],
        average: float,
        plan: Plan,
        want: int,
    ) -> tuple[list[Scored], int | None, bool]:
        """The best `want` docs for these tokens (with postings), the total (None when
        counting it would mean testing too many docs one by one: `Plan.count`), and whether
        the ranking is exact (not when the threshold algorithm ran out of reads)."""
        is_rare = [len(t.tf) <= COMMON * self.count for t in terms]
        drivers = [t for t, rare in zip(terms, is_rare, strict=True) if rare] or terms
        extras = [t for t, rare in zip(terms, is_rare, strict=True) if not rare and any(is_rare)]
        scorer = _Scorer(drivers, extras, self.count, average, lengths)
        allowed = plan.allowed
        # A small restriction (or few postings) may leave few enough candidates to score all.
        if allowed is not None and min(len(allowed), sum(map(len, drivers))) <= 4 * _SCORE_ALL:
            candidates = set().union(*(t.tf.keys() & allowed for t in drivers))
            if len(candidates) <= _SCORE_ALL:
                found = [(scorer.score(at)[0], at) for at in candidates if plan.admits(at)]
                return self.best(found, want), len(found), True
        pairs = [(a, b) for n, a in enumerate(drivers) for b in drivers[n + 1 :]]
        if sum(min(len(a), len(b)) for a, b in pairs) <= _PAIR_WORK:
            multi = _several(pairs, allowed)
            if len(multi) <= _MULTI:
                return (*self._by_overlap(scorer, multi, plan, want), True)
        # Many docs have several drivers: they may tie in bulk (many alike capabilities),
        # which the threshold algorithm settles in about `want` reads. If they do not, exact
        # ranking would mean scoring them all: past its reads, the page is the best it found.
        top, exact = self._threshold(scorer, plan, want, budget=THRESHOLD_READS + 2 * want)
        return top, _union_count(drivers, plan, self.count), exact

    def _by_overlap(
        self, scorer: _Scorer, multi: set[int], plan: Plan, want: int
    ) -> tuple[list[Scored], int | None]:
        """Score the docs with several drivers, then walk each driver's groups best first for
        the docs with that driver alone, while a group can still reach the page."""
        found: list[Scored] = []
        overlap = 0  # docs counted once per driver they have, minus once
        for at in multi:
            if plan.admits(at):
                score, present = scorer.score(at)
                overlap += present - 1
                found.append((score, at))
        page = heapq.nlargest(want, [s for s, _ in found])
        heapq.heapify(page)
        for n, term in enumerate(scorer.drivers):
            if _beaten(page, want, scorer.add_extras(scorer.saturation(n))):
                continue
            groups = [
                (scorer.weight(n, tf, length), members)
                for (tf, length), members in term.groups.items()
            ]
            groups.sort(key=lambda group: -group[0])
            for weight, members in groups:
                if _beaten(page, want, scorer.add_extras(weight)):
                    break
                alone = (at for at in members if at not in multi and plan.admits(at))
                if scorer.extras:
                    scored = [(scorer.score(at)[0], at) for at in alone]
                else:  # all tie at `weight`, in key order: only the first `want` can matter
                    scored = [(weight, at) for at in islice(alone, want)]
                for pair in scored:
                    if len(page) < want:
                        heapq.heappush(page, pair[0])
                    elif pair[0] > page[0]:
                        heapq.heapreplace(page, pair[0])
                    elif pair[0] < page[0]:
                        continue
                    found.append(pair)  # a tie with the page's last may still win by key
        total: int | None = None
        if plan.everything:
            total = sum(len(t.tf) for t in scorer.drivers) - overlap
        else:
            counts = [plan.count(t.tf.keys()) for t in scorer.drivers]
            if None not in counts:
                total = sum(c for c in counts if c is not None) - overlap
        return self.best(found, want), total

    def _threshold(
        self, scorer: _Scorer, plan: Plan, want: int, budget: int
    ) -> tuple[list[Scored], bool]:
        """Fagin's threshold algorithm: read the drivers' groups best first, round robin, score
        each new doc fully, and stop when no unread doc can beat the page's last: its score is
        at most the sum of the weights under the cursors (plus the extras' best), and when
        equal to that sum (no extras), its key is at least every cursor's key. After `budget`
        reads, the best read so far, not known to be exact (False)."""
        lists = []
        for n, term in enumerate(scorer.drivers):
            groups = [(scorer.weight(n, tf, length), g) for (tf, length), g in term.groups.items()]
            groups.sort(key=lambda group: -group[0])
            merged: list[tuple[float, list[int]]] = []
            for weight, members in groups:  # equal weights: one group, still in key order
                if merged and merged[-1][0] == weight:
                    both = heapq.merge(merged[-1][1], members, key=self.keys.__getitem__)
                    merged[-1] = (weight, list(both))
                else:
                    merged.append((weight, members))
            lists.append(merged)
        keys, everything = self.keys, plan.everything
        cursors = [[0, 0] for _ in lists]  # [group, position in group]
        best: list[tuple[float, DocKey, int]] = []  # (-score, key, id), ascending
        seen: set[int] = set()
        while want:
            budget -= len(lists)
            if budget < 0:
                return [(-neg, at) for neg, _, at in best], False
            for groups, cursor in zip(lists, cursors, strict=True):
                if cursor[0] == len(groups):
                    continue
                members = groups[cursor[0]][1]
                at = members[cursor[1]]
                cursor[1] += 1
                if cursor[1] == len(members):
                    cursor[0], cursor[1] = cursor[0] + 1, 0
                if at in seen:
                    continue
                seen.add(at)
                if not everything and not plan.admits(at):
                    continue
                entry = (-scorer.score(at)[0], keys[at], at)
                if len(best) < want or entry < best[-1]:
                    insort(best, entry)
                    if len(best) > want:
                        best.pop()
            bound, cursor_keys = 0.0, []
            for groups, cursor in zip(lists, cursors, strict=True):
                if cursor[0] < len(groups):
                    weight, members = groups[cursor[0]]
                    bound += weight
                    cursor_keys.append(keys[members[cursor[1]]])
            if not cursor_keys:
                break
            if len(best) == want:
                worst = best[-1]
                if scorer.extras and -worst[0] > scorer.add_extras(bound):
                    break
                if not scorer.extras and (worst[0], worst[1]) < (-bound, max(cursor_keys)):
                    break
        return [(-neg, at) for neg, _, at in best], True


class _Scorer:
    """BM25 for one query: weights, whole scores, and bounds, all summed in one order."""

    def __init__(
        self,
        drivers: list[Postings],
        extras: list[Postings],
        count: int,
        average: float,
        lengths: Sequence[int],
    ) -> None:
        self.drivers, self.extras, self.lengths, self.average = drivers, extras, lengths, average
        self.terms = drivers + extras
        self.idfs = [
            math.log(1 + (count - len(t.tf) + 0.5) / (len(t.tf) + 0.5)) for t in self.terms
        ]
        self._norms: dict[int, float] = {}
        self._extra_best: list[float] | None = None

    def norm(self, length: int) -> float:
        norm = self._norms.get(length)
        if norm is None:
            norm = self._norms[length] = K1 * (1 - B + B * length / self.average)
        return norm

    def weight(self, term: int, tf: int, length: int) -> float:
        return self.idfs[term] * tf * (K1 + 1) / (tf + self.norm(length))

    def saturation(self, term: int) -> float:
        """More than any weight of the token: BM25 saturates below idf * (k1 + 1)."""
        return self.idfs[term] * (K1 + 1)

    def score(self, doc: int) -> tuple[float, int]:
        """The doc's score, and how many drivers it has."""
        norm, score, present = self.norm(self.lengths[doc]), 0.0, 0
        for n, (term, idf) in enumerate(zip(self.terms, self.idfs, strict=True)):
            tf = term.tf.get(doc)
            if tf:
                score += idf * tf * (K1 + 1) / (tf + norm)
                present += n < len(self.drivers)
        return score, present

    def add_extras(self, bound: float) -> float:
        """`bound` plus each extra's best weight anywhere, in scoring order."""
        if self._extra_best is None:
            self._extra_best = [
                max(self.weight(n, tf, length) for tf, length in term.groups)
                for n, term in enumerate(self.terms)
                if n >= len(self.drivers)
            ]
        for weight in self._extra_best:
            bound += weight
        return bound


def _several(pairs: list[tuple[Postings, Postings]], allowed: AbstractSet[int] | None) -> set[int]:
    """The docs (among `allowed`) with two or more of the drivers."""
    found: set[int] = set().union(*(a.tf.keys() & b.tf.keys() for a, b in pairs))
    return found if allowed is None else found & allowed


def _beaten(page: list[float], want: int, bound: float) -> bool:
    """Whether a doc scoring at most `bound` cannot make a full page (a min-heap of scores)."""
    return len(page) >= want and (not page or bound < page[0])


def _union_count(drivers: list[Postings], plan: Plan, count: int) -> int | None:
    """How many admitted docs have a driver token, by set operations; None when they would
    read more than `READ_BUDGET` ids (`Plan.count`)."""
    sets: list[AbstractSet[int]] = sorted((t.tf.keys() for t in drivers), key=len)
    if not plan.everything:
        if plan.allowed is not None:
            allowed = plan.allowed
            if sum(min(len(s), len(allowed)) for s in sets) > READ_BUDGET:
                return None
            sets = [s & allowed for s in sets]
        if len(sets) > 1 or plan.per_doc:
            return plan.count(set().union(*sets))
        return plan.count(sets[0])
    if len(sets[-1]) == count:
        return count
    if len(sets) == 1:
        return len(sets[0])
    if len(sets) == 2:
        if len(sets[0]) > READ_BUDGET:
            return None
        return len(sets[0]) + len(sets[1]) - len(sets[0] & sets[1])
    return None if sum(map(len, sets)) > READ_BUDGET else len(set().union(*sets))


__all__ = ["COMMON", "K1", "THRESHOLD_READS", "B", "Postings", "Ranking", "Scored"]
