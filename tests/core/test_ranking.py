"""BM25 top-k (`lobby/core/discovery/ranking.py`) driven directly: each way `Ranking.lexical` finds
a page (few candidates scored all, pairwise overlaps, the threshold algorithm) against a brute force
that scores every doc, with every kind of restriction; ties broken by key; the totals; the
postings' groups; and the page cut short by the threshold algorithm's reads."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest

from lobby.core.discovery import ranking
from lobby.core.discovery.filters import Filter, Plan
from lobby.core.discovery.ranking import K1, B, Postings, Ranking, Scored

Key = tuple[str, str]


class Corpus:
    """Docs as token counts, with keys, lengths, postings and the key order `Ranking` reads."""

    def __init__(self, docs: list[tuple[Key, dict[str, int]]], average: float = 0.0) -> None:
        self.keys = [key for key, _ in docs]
        self.tfs = [dict(tf) for _, tf in docs]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.average = average or sum(self.lengths) / len(docs)
        self.order = sorted(range(len(docs)), key=self.keys.__getitem__)
        self.postings: dict[str, Postings] = {}
        for doc, tf in enumerate(self.tfs):
            for token, count in tf.items():
                postings = self.postings.setdefault(token, Postings({}, {}))
                postings.add(doc, count, self.lengths[doc], self.keys.__getitem__)

    def ranking(self) -> Ranking:
        return Ranking(self.keys, self.order, len(self.keys))

    def lexical(self, words: list[str], plan: Plan, want: int) -> tuple[list[Scored], Any, bool]:
        terms = [self.postings[w] for w in words if w in self.postings]
        return self.ranking().lexical(terms, self.lengths, self.average, plan, want)

    def brute(self, words: list[str], plan: Plan, want: int) -> tuple[list[Scored], int]:
        """Every admitted doc with a driver scored, drivers then extras, best first by key."""
        count = len(self.keys)
        present = [w for w in words if w in self.postings]
        df = {w: len(self.postings[w]) for w in present}
        rare = [w for w in present if df[w] <= ranking.COMMON * count]
        drivers = rare or present
        order = drivers + [w for w in present if w not in drivers]
        scored = []
        for doc, tf in enumerate(self.tfs):
            if not plan.admits(doc) or not any(w in tf for w in drivers):
                continue
            norm, score = K1 * (1 - B + B * self.lengths[doc] / self.average), 0.0
            for w in order:
                if w in tf:
                    idf = math.log(1 + (count - df[w] + 0.5) / (df[w] + 0.5))
                    score += idf * tf[w] * (K1 + 1) / (tf[w] + norm)
            scored.append((score, doc))
        scored.sort(key=lambda pair: (-pair[0], self.keys[pair[1]]))
        return scored[:want], len(scored)


def everything() -> Plan:
    return Plan(None, set(), [], lambda doc: {})


def random_corpus(size: int, seed: int) -> Corpus:
    """Zipf-like words, so some are common; a run of identical docs, so scores tie in bulk."""
    rng = random.Random(seed)
    words = [f"w{n}" for n in range(40)]
    weights = [1 / (n + 1) for n in range(40)]
    docs: list[tuple[Key, dict[str, int]]] = []
    for n in range(size):
        tf = Counter(rng.choices(words, weights, k=rng.randint(2, 9)))
        docs.append(((f"agent{rng.randrange(size // 4):03d}", f"cap{n}"), dict(tf)))
    docs += [((f"twin{n % 5}", f"t{n}"), {"w1": 1, "w2": 2, "w3": 1}) for n in range(40)]
    return Corpus(docs)


def plans(corpus: Corpus) -> dict[str, Plan]:
    count = len(corpus.keys)
    price = Filter.parse({"attribute": "price", "op": "lt", "value": 5})
    return {
        "everything": everything(),
        "allowed few": Plan(set(range(0, count, 9)), set(), [], lambda doc: {}),
        "allowed most": Plan(set(range(count)) - {3, 4}, set(), [], lambda doc: {}),
        "excluded": Plan(None, set(range(0, count, 4)), [], lambda doc: {}),
        "checked": Plan(None, set(), [price], lambda doc: {"price": doc % 11}),
        "tested": Plan(None, set(), [], lambda doc: {}, [lambda doc: doc % 3 != 0]),
    }


PATHS: dict[str, dict[str, int]] = {
    "default": {},
    "overlap": {"_MULTI": 10**9, "_PAIR_WORK": 10**9, "_SCORE_ALL": 0},
    "threshold": {"_MULTI": 0, "_SCORE_ALL": 0, "THRESHOLD_READS": 10**9},
    "score all": {"_SCORE_ALL": 10**9},
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_way_to_a_page_agrees_with_scoring_every_doc(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in PATHS[path].items():
        monkeypatch.setattr(ranking, name, value)
    corpus = random_corpus(400, seed=4)
    rng = random.Random(11)
    queries = [["w1", "w2", "w3"], ["w0"], ["w0", "w1"], ["w7", "w30", "w2"], ["w39", "absent"]]
    queries += [[f"w{rng.randrange(40)}" for _ in range(rng.randint(1, 4))] for _ in range(8)]
    for plan_name, plan in plans(corpus).items():
        for words in queries:
            for want in (1, 4, 45):
                expected, total = corpus.brute(words, plan, want)
                top, counted, exact = corpus.lexical(words, plan, want)
                assert exact
                assert top == expected, (plan_name, words, want)
                assert counted == total, (plan_name, words, want)


@pytest.mark.parametrize("multi", [-1, 10**9], ids=["threshold", "overlap"])
def test_groups_of_equal_weight_are_read_as_one_in_key_order(
    multi: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an average length of 3, "x" once in a doc of length 1 weighs exactly what it
    weighs twice in a doc of length 3 (norms 0.6 and 1.2): two posting groups, one weight.
    The threshold algorithm reads them as one run in key order, or it would stop at ("b", ...)
    with ("a", ...), of the same score, still unread in the other group; the walk by overlap
    reads a group that only ties the page, for a tie may win by key."""
    monkeypatch.setattr(ranking, "_MULTI", multi)
    fillers: list[tuple[Key, dict[str, int]]] = [(("f", str(n)), {"f": 3}) for n in range(8)]
    corpus = Corpus(
        [
            (("b", "once"), {"x": 1}),
            (("d", "once"), {"x": 1}),
            (("a", "twice"), {"x": 2, "f": 1}),
            (("z", "y"), {"y": 1, "f": 9}),
            *fillers,
        ],
        average=3.0,
    )
    scorer = ranking._Scorer([corpus.postings["x"]], [], len(corpus.keys), 3.0, corpus.lengths)
    assert scorer.weight(0, 1, 1) == scorer.weight(0, 2, 3)
    assert len(corpus.postings["x"].groups) == 2
    for want in (1, 2, 3, 4):
        top, total, exact = corpus.lexical(["x", "y"], everything(), want)
        assert top == corpus.brute(["x", "y"], everything(), want)[0]
        assert [corpus.keys[at] for _, at in top][:3] == [
            ("a", "twice"),
            ("b", "once"),
            ("d", "once"),
        ][:want]
        assert (total, exact) == (4, True)


class CountedOrder(list[int]):
    """The key order, counting the ids read from it: the work of walking it."""

    read = 0

    def __iter__(self) -> Any:
        for at in super().__iter__():
            CountedOrder.read += 1
            yield at


def alphabet(count: int) -> tuple[list[Key], CountedOrder]:
    """`count` docs whose ids are in key order: doc n is ("a", f"{n:05d}")."""
    return [("a", f"{n:05d}") for n in range(count)], CountedOrder(range(count))


def test_best_takes_the_highest_scores_and_breaks_ties_by_key() -> None:
    keys = [("b", "x"), ("a", "y"), ("c", "z"), ("a", "x"), ("d", "w")]
    best = Ranking(keys, sorted(range(5), key=keys.__getitem__), 5).best
    scored = [(1.0, 0), (2.0, 1), (1.0, 2), (1.0, 3), (0.5, 4)]
    assert best(scored, 0) == []
    assert best(scored, 1) == [(2.0, 1)]
    assert best(scored, 2) == [(2.0, 1), (1.0, 3)]  # ("a", "x") first of the three at 1.0
    assert best(scored, 3) == [(2.0, 1), (1.0, 3), (1.0, 0)]
    assert best(scored, 4) == [(2.0, 1), (1.0, 3), (1.0, 0), (1.0, 2)]
    everything_sorted = [(2.0, 1), (1.0, 3), (1.0, 0), (1.0, 2), (0.5, 4)]
    assert best(scored, 5) == everything_sorted
    assert best(scored, 6) == everything_sorted
    assert best([], 3) == []


def test_the_first_ids_by_key_come_from_a_short_walk_or_else_a_sort() -> None:
    """Walking the key order pays when the wanted ids are expected within two steps an id
    (`want * count < ids * 2 * ids`); it stops after those steps and sorts instead."""
    keys, order = alphabet(1000)
    ranked = Ranking(keys, order, 1000)
    front = set(range(40))  # dense at the front: found by walking want steps
    CountedOrder.read = 0
    assert ranked.first_by_key(front, 3) == [0, 1, 2]
    assert CountedOrder.read == 3
    spread = set(range(0, 1000, 25))  # 40 ids, one each 25: a walk of 80 steps finds 4
    CountedOrder.read = 0
    assert ranked.first_by_key(spread, 3) == [0, 25, 50]
    assert CountedOrder.read == 51
    late = {0, *range(500, 539)}  # 40 ids, only one within 80 steps
    CountedOrder.read = 0
    assert ranked.first_by_key(late, 3) == [0, 500, 501]  # the walk gives up, then a sort
    assert CountedOrder.read == 80
    # want * count against 2 * ids * ids: 3 * 1000 < 3200 walks, 4 * 1000 > 3200 sorts.
    CountedOrder.read = 0
    assert ranked.first_by_key(front, 4) == [0, 1, 2, 3]
    assert CountedOrder.read == 0
    CountedOrder.read = 0
    assert ranked.first_by_key(list(front), 40) == list(range(40))  # all of them: sorted
    assert CountedOrder.read == 0


def test_the_threshold_algorithm_reads_its_budget_to_the_last_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two drivers, one result: a budget of 2 * 1 reads past `THRESHOLD_READS`, one round of
    one doc per driver each. "both", second in each driver's order, scores best: read in the
    second round, it is the page only with two reads to spare."""
    monkeypatch.setattr(ranking, "_MULTI", -1)
    fillers: list[tuple[Key, dict[str, int]]] = [(("f", str(n)), {"f": 2}) for n in range(12)]
    corpus = Corpus(
        [
            (("x", "only"), {"x": 3}),
            (("y", "only"), {"y": 3}),
            (("both", "x y"), {"x": 2, "y": 2}),
            (("weak", "x y"), {"x": 1, "y": 1, "f": 6}),
            *fillers,
        ]
    )
    keys = [corpus.keys[at] for _, at in corpus.brute(["x", "y"], everything(), 4)[0]]
    assert keys == [("both", "x y"), ("x", "only"), ("y", "only"), ("weak", "x y")]
    for reads, page, exact in (
        (0, [("x", "only")], False),  # one round: x's best and y's best, "x" first by key
        (1, [("x", "only")], False),
        (2, [("both", "x y")], True),  # two rounds: then nothing unread can beat it
    ):
        monkeypatch.setattr(ranking, "THRESHOLD_READS", reads)
        top, total, done = corpus.lexical(["x", "y"], everything(), 1)
        assert ([corpus.keys[at] for _, at in top], done) == (page, exact), reads
        assert total == 4


def test_with_a_common_token_the_threshold_stops_once_nothing_unread_can_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "x" drives, "c" (in every doc) only adds: after its first read the page's last ("x"
    five times) beats the next group's weight plus the best "c" gives anywhere, so the
    threshold algorithm stops there, exact, within a budget of two reads."""
    monkeypatch.setattr(ranking, "_MULTI", -1)
    monkeypatch.setattr(ranking, "THRESHOLD_READS", 0)
    fillers: list[tuple[Key, dict[str, int]]] = [
        (("f", str(n)), {"c": 1, "f": 2}) for n in range(10)
    ]
    weak: list[tuple[Key, dict[str, int]]] = [
        (("w", str(n)), {"x": 1, "c": 1, "f": 20}) for n in range(3)
    ]
    corpus = Corpus([(("strong", "x"), {"x": 5, "c": 1}), *weak, *fillers])
    top, total, exact = corpus.lexical(["x", "c"], everything(), 1)
    assert (top, total, exact) == (corpus.brute(["x", "c"], everything(), 1)[0], 4, True)
    assert corpus.keys[top[0][1]] == ("strong", "x")


def postings(docs: range | set[int]) -> Postings:
    return Postings(dict.fromkeys(docs, 1), {})


def test_the_total_is_counted_by_set_sizes_within_the_read_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """How many docs have a driver: from the sets' sizes where that is exact, by a union when
    it reads at most `READ_BUDGET` ids (here 10), else not counted (None)."""
    monkeypatch.setattr(ranking, "READ_BUDGET", 10)
    count = ranking._union_count
    every, small, wide = postings(range(100)), postings(range(5)), postings(range(3, 50))
    assert count([small, every], everything(), 100) == 100  # one driver everywhere
    assert count([wide], everything(), 100) == 47
    # Two: the smaller one's ids are read to intersect (3 and 4 in both).
    for pair in ([small, wide], [wide, small]):
        assert count(pair, everything(), 100) == 5 + 47 - 2
    assert count([postings(range(11)), wide], everything(), 100) is None
    assert count([postings(range(10)), wide], everything(), 100) == 50
    # Three or more: a union of them all, within the budget.
    three = [postings({1, 2}), postings({2, 3, 4}), postings(range(4, 9))]
    assert count(three, everything(), 100) == 8  # 10 ids read: the budget
    assert count([*three, postings({1})], everything(), 100) is None  # 11
    # Restricted: intersected with `allowed` first, then counted by the plan.
    allowed = Plan({0, 2, 3, 5, 60}, {2}, [], lambda doc: {})
    assert count([small, wide], allowed, 100) == 3  # 0, 3, 5: min(len, 5) each, 10 read
    assert count([wide], allowed, 100) == 2  # 3 and 5
    assert count([small, wide, every], allowed, 100) is None  # 15 to read
    checked = Plan(None, set(), [], lambda doc: {}, [lambda doc: doc % 2 == 0])
    assert count([small], checked, 100) == 3  # 0, 2, 4
    assert count([small, postings({7, 8})], checked, 100) == 4


def test_a_token_in_exactly_half_the_docs_still_drives() -> None:
    """Common means in more than half: "a", in two docs of four, finds docs as "b" does;
    "c", in three, only adds to what they found."""
    corpus = Corpus(
        [
            (("d", "0"), {"a": 1, "c": 1}),
            (("d", "1"), {"a": 1, "c": 1}),
            (("d", "2"), {"b": 1, "c": 1}),
            (("d", "3"), {"e": 1}),
        ]
    )
    top, total, _ = corpus.lexical(["a", "b", "c"], everything(), 10)
    assert (top, total) == (corpus.brute(["a", "b", "c"], everything(), 10)[0], 3)
    top, total, _ = corpus.lexical(["b", "c"], everything(), 10)
    assert ([corpus.keys[at] for _, at in top], total) == ([("d", "2")], 1)


def test_every_round_of_the_threshold_algorithm_reads_one_entry_of_each_list() -> None:
    """Three drivers of two docs each, and a page wanting every doc: two rounds read them all,
    whatever a list's entry turns out to be (a doc another list read first, or one the plan
    does not admit), so a budget of 3 lists x 2 rounds is enough to end exact."""
    corpus = Corpus(
        [
            (("a", "xyz"), {"x": 3, "y": 3, "z": 3}),
            (("b", "x"), {"x": 2}),
            (("c", "y"), {"y": 2}),
            (("d", "z"), {"z": 2}),
            *[(("f", str(n)), {"f": 1}) for n in range(8)],
        ]
    )
    drivers = [corpus.postings[w] for w in "xyz"]
    scorer = ranking._Scorer(drivers, [], len(corpus.keys), corpus.average, corpus.lengths)
    b = corpus.keys.index(("b", "x"))
    for plan, expected in ((everything(), 4), (Plan(None, {b}, [], lambda doc: {}), 3)):
        for budget, exact in ((6, True), (5, False)):
            top, done = corpus.ranking()._threshold(scorer, plan, 4, budget=budget)
            assert done is exact, (plan.excluded, budget)
            if exact:
                assert top == corpus.brute(["x", "y", "z"], plan, 4)[0]
                assert len(top) == expected


class Ways:
    """Which way `Ranking.lexical` took: "score all" unless it called `_by_overlap` (and with
    which docs of several drivers) or `_threshold`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken: list[str] = []
        self.multi: list[set[int]] = []
        by_overlap, threshold = Ranking._by_overlap, Ranking._threshold

        def overlap(
            ranked: Ranking, scorer: Any, multi: set[int], plan: Plan, want: int
        ) -> tuple[list[Scored], int | None]:
            self.taken.append("overlap")
            self.multi.append(set(multi))
            return by_overlap(ranked, scorer, multi, plan, want)

        def fagin(
            ranked: Ranking, scorer: Any, plan: Plan, want: int, budget: int
        ) -> tuple[list[Scored], bool]:
            self.taken.append("threshold")
            return threshold(ranked, scorer, plan, want, budget)

        monkeypatch.setattr(Ranking, "_by_overlap", overlap)
        monkeypatch.setattr(Ranking, "_threshold", fagin)

    def way(self) -> str:
        taken, self.taken = self.taken, []
        return taken[0] if taken else "score all"


def lettered(count: int, words: dict[str, range]) -> Corpus:
    """`count` docs, doc n with each word whose range holds n, and a filler word so lengths
    vary."""
    docs: list[tuple[Key, dict[str, int]]] = []
    for n in range(count):
        tf = {word: 1 + n % 3 for word, within in words.items() if n in within}
        docs.append((("d", f"{n:03d}"), {**tf, "filler": 1 + n % 4}))
    return Corpus(docs)


def test_a_restriction_leaving_few_candidates_scores_them_all_at_exactly_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every candidate is scored when the restriction or the drivers' postings are at most
    4 * `_SCORE_ALL` (here 3) and leave at most `_SCORE_ALL` candidates; one more of either
    and the pairwise overlaps find the page instead."""
    monkeypatch.setattr(ranking, "_SCORE_ALL", 3)
    ways = Ways(monkeypatch)
    corpus = lettered(50, {"x": range(20)})  # 20 postings: the restriction is the smaller
    inside, outside = list(range(20)), list(range(20, 50))
    cases = [
        (inside[:2] + outside[:10], "score all"),  # 12 allowed, 2 candidates
        (inside[:3] + outside[:9], "score all"),  # 12 allowed, 3 candidates
        (inside[:4] + outside[:8], "overlap"),  # 12 allowed, 4 candidates
        (inside[:3] + outside[:10], "overlap"),  # 13 allowed, 3 candidates
        (inside[:1] + outside[:14], "overlap"),  # 15 allowed, 1 candidate
    ]
    for allowed, way in cases:
        plan = Plan(set(allowed), set(), [], lambda doc: {})
        for want in (1, 3):
            expected, total = corpus.brute(["x"], plan, want)
            assert corpus.lexical(["x"], plan, want) == (expected, total, True), allowed
            assert ways.way() == way, (len(allowed), want)


def test_the_overlaps_score_the_docs_with_two_drivers_up_to_exactly_their_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pairwise overlaps find the page while intersecting them reads at most `_PAIR_WORK`
    postings (the smaller of each pair) and at most `_MULTI` docs have two or more drivers,
    the docs they score one by one: exactly those, among the allowed; past either bound the
    threshold algorithm runs instead."""
    monkeypatch.setattr(ranking, "_SCORE_ALL", 3)
    ways = Ways(monkeypatch)
    corpus = lettered(60, {"x": range(20), "y": range(14, 30), "z": range(28, 40)})
    words = ["x", "y", "z"]
    work = 16 + 12 + 12  # x and y: y's 16; x and z: z's 12; y and z: z's 12
    several = {*range(14, 20), 28, 29}
    halves = Plan(set(range(0, 60, 2)), set(), [], lambda doc: {})
    for plan, docs in ((everything(), several), (halves, {14, 16, 18, 28})):
        for pair_work, multi, way in (
            (work, len(docs), "overlap"),
            (work - 1, len(docs), "threshold"),
            (work, len(docs) - 1, "threshold"),
        ):
            monkeypatch.setattr(ranking, "_PAIR_WORK", pair_work)
            monkeypatch.setattr(ranking, "_MULTI", multi)
            for want in (1, 10):
                expected, total = corpus.brute(words, plan, want)
                assert corpus.lexical(words, plan, want) == (expected, total, True)
                assert ways.way() == way, (pair_work, multi, want)
                if way == "overlap":
                    assert ways.multi[-1] == docs
    expected, total = corpus.brute(["x"], everything(), 5)
    assert corpus.lexical(["x"], everything(), 5) == (expected, total, True)
    assert (ways.way(), ways.multi[-1]) == ("overlap", set())  # one driver: no overlaps


class RecordingPlan(Plan):
    """No restriction, recording every doc tested against the plan: the docs a way reads."""

    tested: list[int]

    def admits(self, doc: int) -> bool:
        self.tested.append(doc)
        return Plan.admits(self, doc)


def recording() -> RecordingPlan:
    plan = RecordingPlan(None, set(), [], lambda doc: {})
    plan.tested = []
    return plan


def test_the_walk_by_overlap_stops_at_the_first_group_below_the_full_page() -> None:
    """One result: "m" (both drivers) scores 1.38, "x" alone weighs 1.96 in "a", 1.69 in "b",
    0.73 in "c". "a" replaces "m" on the page, so the walk stops before "b", whose weight is
    below the page's last though above "m"; it reads "m" and "a" only."""
    fillers: list[tuple[Key, dict[str, int]]] = [(("f", str(n)), {"f": 1}) for n in range(12)]
    corpus = Corpus(
        [
            (("a", "x3"), {"x": 3}),
            (("b", "x2"), {"x": 2, "g": 1}),
            (("c", "x1"), {"x": 1, "g": 6}),
            (("m", "xy"), {"x": 1, "y": 1, "f": 10}),
            *fillers,
        ]
    )
    expected, total = corpus.brute(["x", "y"], everything(), 4)
    ranked = [("a", "x3"), ("b", "x2"), ("m", "xy"), ("c", "x1")]
    assert [corpus.keys[at] for _, at in expected] == ranked
    plan = recording()
    assert corpus.lexical(["x", "y"], plan, 1) == (expected[:1], total, True)
    assert [corpus.keys[at] for at in plan.tested] == [("m", "xy"), ("a", "x3")]


def test_of_a_group_of_tied_docs_alone_only_the_first_wanted_by_key_are_read() -> None:
    """Ten docs have "x" once in a doc of length one: one group, one weight. Two wanted: the
    first two by key are the page, and neither the rest of the group nor the weaker group
    after it is read."""
    tied: list[tuple[Key, dict[str, int]]] = [(("t", str(n)), {"x": 1}) for n in range(10)]
    fillers: list[tuple[Key, dict[str, int]]] = [(("f", str(n)), {"f": 1}) for n in range(20)]
    corpus = Corpus([(("a", "weak"), {"x": 1, "f": 4}), *tied[::-1], *fillers])
    expected, total = corpus.brute(["x"], everything(), 2)
    plan = recording()
    assert corpus.lexical(["x"], plan, 2) == (expected, total, True)
    assert [corpus.keys[at] for at in plan.tested] == [("t", "0"), ("t", "1")]


def test_a_driver_that_cannot_reach_the_full_page_is_skipped_unweighed_and_the_next_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "m" has both drivers and scores 2.83; "x" (in 8 of 22 docs) can weigh at most
    idf * (k1 + 1) = 2.19 anywhere, so none of its groups is weighed; "y" is still walked and
    finds "e", "y" alone at 2.91, the best doc."""
    weighed: list[int] = []
    weight = ranking._Scorer.weight

    def recorded(scorer: ranking._Scorer, term: int, tf: int, length: int) -> float:
        weighed.append(term)
        return weight(scorer, term, tf, length)

    monkeypatch.setattr(ranking._Scorer, "weight", recorded)
    fillers: list[tuple[Key, dict[str, int]]] = [
        (("f", str(n)), {"f": 1, **({"x": 1} if n < 7 else {})}) for n in range(20)
    ]
    corpus = Corpus([(("m", "xy"), {"x": 1, "y": 1}), (("e", "y"), {"y": 4}), *fillers])
    expected, total = corpus.brute(["x", "y"], everything(), 2)
    assert [corpus.keys[at] for _, at in expected] == [("e", "y"), ("m", "xy")]
    scorer = ranking._Scorer(
        [corpus.postings["x"], corpus.postings["y"]], [], 22, corpus.average, corpus.lengths
    )
    assert scorer.saturation(0) < expected[1][0]
    assert corpus.lexical(["x", "y"], everything(), 1) == (expected[:1], total, True)
    assert set(weighed) == {1}


def test_a_doc_alone_tying_the_page_in_a_later_group_still_wins_by_key() -> None:
    """With an average length of 3, "x" once in a doc of length 1 weighs what it weighs twice
    in a doc of length 3: two groups, one weight. ("a", "twice"), read second, ties the page's
    last ("b", "once") and comes first by key."""
    fillers: list[tuple[Key, dict[str, int]]] = [(("f", str(n)), {"f": 1}) for n in range(40)]
    corpus = Corpus(
        [(("b", "once"), {"x": 1}), (("a", "twice"), {"x": 2, "f": 1}), *fillers], average=3.0
    )
    assert list(corpus.postings["x"].groups) == [(1, 1), (2, 3)]
    top, total, exact = corpus.lexical(["x"], everything(), 1)
    assert (top, total, exact) == (corpus.brute(["x"], everything(), 1)[0], 2, True)
    assert corpus.keys[top[0][1]] == ("a", "twice")


@pytest.mark.parametrize("multi", [-1, 10**9], ids=["threshold", "overlap"])
def test_a_total_the_plan_cannot_count_within_its_budget_is_none(
    multi: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ranking, "_MULTI", multi)
    monkeypatch.setattr("lobby.core.discovery.filters.COUNT_BUDGET", 2)
    corpus = lettered(30, {"x": range(6), "y": range(4, 9)})
    tested = Plan(None, set(), [], lambda doc: {}, [lambda doc: doc % 2 == 0])
    expected, _ = corpus.brute(["x", "y"], tested, 3)
    assert corpus.lexical(["x", "y"], tested, 3) == (expected, None, True)
    monkeypatch.setattr("lobby.core.discovery.filters.COUNT_BUDGET", 9)
    expected, total = corpus.brute(["x", "y"], tested, 3)
    assert corpus.lexical(["x", "y"], tested, 3) == (expected, total, True)


def test_the_total_of_a_query_whose_driver_is_in_every_doc_is_every_doc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both tokens common, both drive, "a" in every doc: every doc has a driver, counted
    without reading ids (the union would read more than `READ_BUDGET`, here 4)."""
    monkeypatch.setattr(ranking, "_MULTI", -1)
    monkeypatch.setattr(ranking, "READ_BUDGET", 4)
    corpus = lettered(12, {"a": range(12), "b": range(4, 12), "c": range(2, 10)})
    for words in (["a", "b"], ["b", "a"], ["a", "b", "c"]):
        expected, total = corpus.brute(words, everything(), 3)
        assert total == 12
        assert corpus.lexical(words, everything(), 3) == (expected, 12, True)


def test_the_first_ids_by_key_are_sorted_not_walked_when_the_walk_is_not_shorter() -> None:
    """A walk is taken only when `want * count` is strictly below `2 * ids * ids`, and never
    for all of the ids: then sorting them is the direct way."""
    keys, order = alphabet(1000)
    ranked = Ranking(keys, order, 1000)
    front = set(range(50))  # 2 * 50 * 50 = 5000
    CountedOrder.read = 0
    assert ranked.first_by_key(front, 4) == [0, 1, 2, 3]  # 4000: walked
    assert CountedOrder.read == 4
    CountedOrder.read = 0
    assert ranked.first_by_key(front, 5) == [0, 1, 2, 3, 4]  # 5000: sorted
    assert CountedOrder.read == 0
    most = set(range(600))  # 2 * 600 * 600 is well above 600 * 1000, but all are wanted
    assert ranked.first_by_key(most, 600) == list(range(600))
    assert CountedOrder.read == 0


def test_walking_for_the_first_ids_tests_membership_in_a_set_built_at_most_once() -> None:
    """A walk of a few steps costs a few set lookups: a set of ids is used as it is, not
    copied, and a list is made a set, not scanned at each step."""
    from collections.abc import Iterator, Set

    class CountedIds(Set[int]):
        """A read-only set of ids counting the ids read by iterating it."""

        def __init__(self, ids: range) -> None:
            self.ids, self.iterated = set(ids), 0

        def __contains__(self, item: object) -> bool:
            return item in self.ids

        def __iter__(self) -> Iterator[int]:
            for at in self.ids:
                self.iterated += 1
                yield at

        def __len__(self) -> int:
            return len(self.ids)

    class ScannedIds(list[int]):
        """A list of ids counting the membership tests that scan it."""

        scans = 0

        def __contains__(self, item: object) -> bool:
            self.scans += 1
            return super().__contains__(item)

    keys, order = alphabet(1000)
    ranked = Ranking(keys, order, 1000)
    ids = CountedIds(range(40))
    assert ranked.first_by_key(ids, 3) == [0, 1, 2]
    assert ids.iterated == 0
    listed = ScannedIds(range(39, -1, -1))
    assert ranked.first_by_key(listed, 3) == [0, 1, 2]
    assert listed.scans == 0
