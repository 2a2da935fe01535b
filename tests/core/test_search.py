"""The search index's rules, checked at the class: a removed capability leaves no entry in the
name, keyword and agent indexes; the seed's `lookup` by name and/or keywords (any case) and
exclusion agrees with a brute force, reads the smaller column and costs its page; `simple`
scores exactly the fields a query is in; key-ordered pages say where they start, what they
cost and where they go on; sparse restrictions are sorted, dense ones walked."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from lobby.core.discovery import ranking, search
from lobby.core.discovery.filters import parse_filters
from lobby.core.discovery.listing import Position, SearchPage
from lobby.core.discovery.search import Algorithm, SearchIndex
from tests.test_search import Row, index, keys

Key = tuple[str, str]


def mixed_rows(seed: int, count: int) -> list[Row]:
    """Capabilities sharing names and keywords (in several cases), in shuffled order so that
    doc ids do not follow the key order."""
    rng = random.Random(seed)
    found: dict[Key, Row] = {}
    while len(found) < count:
        agent, name = f"a{rng.randrange(8)}", rng.choice(["alpha", "beta", "gamma", "Beta"])
        words = rng.sample(["Red", "red", "BLUE", "green", "Green", "gold"], rng.randrange(4))
        if rng.random() < 0.15:  # a rare keyword: fewer tagged than named
            words.append(rng.choice(["Solo", "solo"]))
        found[(agent, name)] = (agent, name, f"{name} for {agent}", words, {"n": len(found)})
    rows = list(found.values())
    rng.shuffle(rows)
    return rows


def lowered(row: Row) -> set[str]:
    return {k.lower() for k in row[3]}


def brute_lookup(
    rows: list[Row],
    name: str | None,
    keywords: list[str] | None,
    exclude: str | None,
    after: Key | None,
) -> list[Key]:
    wanted = {k.lower() for k in keywords or ()}
    return sorted(
        (row[0], row[1])
        for row in rows
        if (name is None or row[1] == name)
        and (not wanted or lowered(row) & wanted)
        and (not exclude or row[0] != exclude)
        and (after is None or (row[0], row[1]) > after)
    )


# Removing


def test_a_removed_capability_leaves_no_name_keyword_or_agent_entry() -> None:
    """After removes, restricted searches and lookups agree with a fresh index of what is left,
    and once everything is removed the index keeps no entry and no text."""
    rows = mixed_rows(seed=4, count=30)
    built = index(rows)
    rng = random.Random(5)
    gone = set(rng.sample(range(len(rows)), 12))
    for n in sorted(gone):
        built.remove(rows[n][0], rows[n][1])
    built.remove_agent("a3")
    left = [row for n, row in enumerate(rows) if n not in gone and row[0] != "a3"]
    fresh = index(left)
    assert len(built) == len(fresh) == len(left)
    for name in (None, "alpha", "beta", "Beta", "gamma"):
        for words in (None, ["RED"], ["green", "Blue"], ["GOLD"]):
            for exclude in (None, "a1", "a5"):
                options: dict[str, Any] = {
                    "capability_name": name,
                    "keywords": words,
                    "exclude_agent": exclude,
                }
                page = built.search(query=None, algorithm="filtered", limit=100, **options)
                assert page == fresh.search(query=None, algorithm="filtered", limit=100, **options)
                assert keys(page) == brute_lookup(left, name, words, exclude, None)
                looked = built.lookup(after=None, limit=100, **options)
                assert keys(looked) == keys(page)
    for row in left:
        built.remove(row[0], row[1])
    assert len(built) == 0
    assert built._by_name == {}
    assert built._by_keyword == {}
    assert built._by_agent == {}
    assert built._terms == {}
    assert set(built._texts) == {""}


# lookup: the seed's discovery


def test_a_lookup_by_name_keywords_and_exclusion_agrees_with_a_brute_force() -> None:
    """Every combination of a name, keywords in any case and an excluded agent, from several
    starting keys, with both of the indexes read (the name's, when it is no larger than the
    keywords', else the keywords')."""
    rows = mixed_rows(seed=1, count=28)
    built = index(rows)
    read_named: set[bool] = set()
    starts: list[Key | None] = [None, ("a2", "beta"), ("a4", ""), ("a9", "")]
    for name in (None, "alpha", "beta", "Beta", "nope"):
        for words in (
            None,
            ["RED"],
            ["Green", "blue"],
            ["GOLD", "red"],
            ["SOLO"],
            ["Solo", "gold"],
        ):
            if name is not None and words:
                named = sum(row[1] == name for row in rows)
                tagged = sum(sum(k.lower() in lowered(row) for k in set(words)) for row in rows)
                read_named.add(named <= tagged)
            for exclude in (None, "a0", "a2", "a6"):
                for after in starts:
                    everything = brute_lookup(rows, name, words, exclude, after)
                    for limit in (1, 3, 50):
                        page = built.lookup(
                            capability_name=name,
                            keywords=words,
                            exclude_agent=exclude,
                            after=after,
                            limit=limit,
                        )
                        expected = everything[:limit]
                        assert keys(page) == expected, (name, words, exclude, after, limit)
                        assert all(hit.score == 0.0 for hit in page.hits)
                        assert page.total is None
                        more = len(everything) > limit
                        assert page.next == (Position(expected[-1]) if more else None)
                        assert page.keyed is True
                        assert page.start == Position(after)
    assert read_named == {True, False}


def test_an_empty_exclude_agent_excludes_nothing_in_lookups_and_searches() -> None:
    """`exclude_agent` "" is no exclusion, as None, even for capabilities of an agent "": the
    lookup and the search agree."""
    rows: list[Row] = [("", "x", "d", ["k"], {}), ("b", "x", "d", ["k"], {})]
    built = index(rows)
    for exclude in ("", None):
        looked = built.lookup(
            capability_name=None, keywords=None, exclude_agent=exclude, after=None, limit=10
        )
        assert keys(looked) == [("", "x"), ("b", "x")]
        page = built.search(query=None, algorithm="filtered", exclude_agent=exclude)
        assert keys(page) == keys(looked)
        assert page.total == 2


def test_a_lookup_reads_the_smaller_column_and_examines_one_more_than_its_page() -> None:
    """With a name and keywords, the name's column is read when it is no larger than the
    keywords' (a tie reads the name's), the other condition tested per capability, excluded
    ones included; a page of `limit` examines `limit` + 1 entries when there are more."""
    rows: list[Row] = [
        ("a", "x", "", ["k"], {}),
        ("a", "y", "", ["k"], {}),
        ("b", "x", "", ["k"], {}),
        ("z", "x", "", [], {}),
    ]
    built = index(rows)
    by_x_and_k: dict[str, Any] = {"capability_name": "x", "keywords": ["K"], "after": None}
    # Three named x, three tagged k: the name's column, (a,x) (b,x), is read: two entries.
    tie = built.lookup(exclude_agent=None, limit=1, **by_x_and_k)
    assert keys(tie) == [("a", "x")]
    assert tie.next == Position(("a", "x"))
    assert tie.examined == 2
    # The keywords' column would have read (a,x) (a,y) (b,x): three.
    built.add("c", "w", "", ["k"], {})
    tagged = built.lookup(exclude_agent=None, limit=1, **by_x_and_k)
    assert keys(tagged) == keys(tie)
    assert tagged.examined == 2
    built.add("d", "x", "", [], {})
    built.add("e", "x", "", [], {})
    # Five named x, four tagged k: the keywords' column, (a,x) (a,y) (b,x), is read.
    named = built.lookup(exclude_agent=None, limit=1, **by_x_and_k)
    assert keys(named) == keys(tie)
    assert named.examined == 3
    # Tested per capability, the excluded agent's entries count as examined.
    excluded = built.lookup(exclude_agent="a", limit=5, **by_x_and_k)
    assert keys(excluded) == [("b", "x")]
    assert excluded.examined == 4
    # No condition to test: a page of 2 examines 3 entries, the third to know there is more.
    plain = built.lookup(
        capability_name=None, keywords=None, exclude_agent=None, after=None, limit=2
    )
    assert keys(plain) == [("a", "x"), ("a", "y")]
    assert plain.examined == 3


# simple


def brute_simple(rows: list[Row], query: str) -> list[tuple[str, str, float]]:
    q = query.lower()
    scored = []
    for agent, name, description, words, _ in rows:
        score = 3.0 * (q in name.lower())
        score += 2.0 * any(q in k.lower() for k in words)
        score += 1.0 * (q in description.lower())
        if score:
            scored.append((-score, agent, name))
    return [(agent, name, -score) for score, agent, name in sorted(scored)]


def test_simple_scores_exactly_the_fields_a_query_is_in_up_to_their_edges() -> None:
    """Every one-letter query, so the first and last letters of the name, of each keyword and of
    the description are each found in their own field only."""
    rows: list[Row] = [
        ("p", "cab", "Fig", ["dog", "eX"], {}),
        ("q", "hi", "Jk", [], {}),
        ("r", "lm", "no", ["P"], {}),
        ("s", "Q", "tu", ["rs", "v"], {}),
    ]
    built = index(rows)
    for letter in "abcdefghijklmnopqrstuvwxyz":
        for query in (letter, letter.upper()):
            page = built.search(query=query, algorithm="simple")
            expected = brute_simple(rows, query)
            assert [(h.agent_id, h.name, h.score) for h in page.hits] == expected, query
            assert page.total == len(expected)


def test_a_simple_query_with_a_nul_finds_nothing() -> None:
    """The fields are NUL-separated inside the index: a query spanning two of them is no hit."""
    built = index([("p", "cab", "fig", ["dog", "ex"], {})])
    for query in ("cab\x00dog", "dog\x00ex", "ex\x00fig", "\x00"):
        assert built.search(query=query, algorithm="simple") == SearchPage([], 0)


def test_a_simple_page_is_ranked_and_costs_the_capabilities_it_tested() -> None:
    rows = mixed_rows(seed=2, count=20)
    built = index(rows)
    page = built.search(query="a", algorithm="simple", limit=5)
    assert page.keyed is False
    assert page.examined == len(rows)
    assert page.start == Position()
    cut = page.cut(2)
    assert cut.next == Position(None, 2)
    later = built.search(query="a", algorithm="simple", limit=5, offset=5)
    assert later.start == Position(None, 5)
    expected = [(h[0], h[1]) for h in brute_simple(rows, "a")]
    assert keys(page) + keys(later) == expected[:10]


# Key-ordered pages: where they start, what they cost, where they go on, what they count


def numbered_rows(count: int, rare: set[int], seed: int = 0) -> list[Row]:
    """`count` capabilities a000, a001, ... in shuffled order (doc ids not in key order); those
    numbered in `rare` have the attribute rare = True and the word "match" in their text."""
    rows: list[Row] = []
    for n in range(count):
        hit = n in rare
        name = f"cap{'match' if hit and n % 2 else ''}"
        description = f"{'a match' if hit else 'nothing'} here {n}"
        words = ["Match"] if hit and n % 3 else []
        rows.append((f"a{n:03d}", name, description, words, {"n": n, "rare": hit}))
    random.Random(seed).shuffle(rows)
    return rows


def filtered(built: SearchIndex, *raw: dict[str, Any], **options: Any) -> SearchPage:
    return built.search(
        query=None, algorithm="filtered", filters=parse_filters(list(raw)), **options
    )


def test_a_key_ordered_page_says_where_it_starts_what_it_cost_and_where_it_goes_on() -> None:
    rows = numbered_rows(10, set())
    built = index(rows)
    ordered = sorted((row[0], row[1]) for row in rows)
    first = built.search(query=None, algorithm="filtered", limit=3)
    assert keys(first) == ordered[:3]
    assert (first.next, first.total, first.keyed) == (Position(ordered[2]), 10, True)
    assert first.start == Position()
    assert first.examined == 4  # one more than the page, to know that more follow
    # Exactly the page's worth left: no next page.
    rest = built.search(query=None, algorithm="filtered", limit=7, after=ordered[2])
    assert keys(rest) == ordered[3:]
    assert (rest.next, rest.total, rest.examined) == (None, 10, 7)
    assert rest.start == Position(ordered[2])
    skipped = built.search(query=None, algorithm="filtered", limit=3, offset=2)
    assert keys(skipped) == ordered[2:5]
    assert skipped.start == Position(None, 2)
    assert skipped.examined == 2 + 4
    looked = built.lookup(
        capability_name="cap", keywords=None, exclude_agent=None, after=ordered[5], limit=4
    )
    assert keys(looked) == ordered[6:]
    assert looked.next is None
    assert all(hit.score == 1.0 for hit in first.hits + rest.hits + skipped.hits)


def test_a_page_cut_short_by_the_scan_budget_goes_on_where_it_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Walking the key order, a page examines at most `SCAN_BUDGET` entries beyond what it
    returns; its `next` is the last entry examined, and the pages join into the whole answer."""
    monkeypatch.setattr(search, "SCAN_BUDGET", 3)
    rows = numbered_rows(40, {37, 38, 39})
    built = index(rows)
    rare = {"attribute": "rare", "value": True}
    found: list[Key] = []
    after: Key | None = None
    pages = 0
    while True:
        page = filtered(built, rare, limit=1, after=after)
        assert page.total == 3
        assert page.examined is not None
        assert page.examined <= 3 + 2
        found += keys(page)
        pages += 1
        if page.next is None:
            break
        assert page.next.key is not None
        assert page.next.key > (after or ("", ""))
        after = page.next.key
    assert found == brute_filtered(rows, test=lambda a: a["rare"])
    assert pages > 3
    first = filtered(built, rare, limit=1)
    ordered = sorted((row[0], row[1]) for row in rows)
    assert first.hits == []
    assert first.next == Position(ordered[4])  # 1 + 1 wanted + 3 beyond: five examined
    assert first.examined == 5


def brute_filtered(
    rows: list[Row],
    name: str | None = None,
    words: list[str] | None = None,
    exclude: str | None = None,
    test: Callable[[dict[str, Any]], bool] = lambda attributes: True,
) -> list[Key]:
    return [
        key
        for key in brute_lookup(rows, name, words, exclude, None)
        if test(next(row[4] for row in rows if (row[0], row[1]) == key))
    ]


def test_a_total_counts_what_the_restrictions_and_the_checks_per_doc_admit() -> None:
    rows = numbered_rows(40, {1, 3, 13, 27})
    rows += [(agent, "shared", "", [], {"n": 100}) for agent in ("a001", "a002", "a003")]
    rows.append(("b", "solo", "", [], {"n": 5}))
    built = index(rows)
    # Three agents have a capability "shared": one excluded, two are counted.
    page = built.search(query=None, algorithm="filtered", capability_name="shared")
    assert (keys(page), page.total) == (brute_filtered(rows, "shared"), 3)
    page = built.search(
        query=None, algorithm="filtered", capability_name="shared", exclude_agent="a002"
    )
    assert (keys(page), page.total) == (brute_filtered(rows, "shared", exclude="a002"), 2)
    # A filter admitting more than 16x the one capability named "solo" is checked per doc: the
    # total counts it only when it passes.
    for op, bound, passes in (("lt", 30, True), ("ge", 10, False)):
        raw = {"attribute": "n", "op": op, "value": bound}
        checks = parse_filters([raw])
        plan = built._plan("solo", None, checks, None, len(built))
        assert plan is not None
        assert (plan.allowed, plan.checks) == ({built._ids[("b", "solo")]}, checks)
        page = filtered(built, raw, capability_name="solo")
        assert keys(page) == ([("b", "solo")] if passes else [])
        assert page.total == int(passes)


def test_past_the_read_budget_a_filter_is_checked_per_doc_and_not_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(search, "READ_BUDGET", 2)
    rows = numbered_rows(20, {1, 5, 6, 9, 14})
    built = index(rows)
    page = filtered(built, {"attribute": "rare", "value": True}, exclude_agent="a005")
    expected = brute_filtered(rows, exclude="a005", test=lambda a: a["rare"])
    assert keys(page) == expected
    assert len(expected) == 4
    assert page.total is None
    assert page.next is None


# Sparse restrictions are sorted, dense ones walked


def test_a_restriction_admitting_a_sixteenth_is_walked_and_a_sparser_one_sorted() -> None:
    rare = {"attribute": "rare", "value": True}
    rows = numbered_rows(32, {7, 20})
    dense = filtered(index(rows), rare, limit=10)
    assert keys(dense) == [("a007", "capmatch"), ("a020", "cap")]
    assert dense.examined == 32  # walked to the end of the key order
    rows.append(("a032", "cap", "", [], {"n": 32, "rare": False}))
    sparse = filtered(index(rows), rare, limit=10)
    assert keys(sparse) == keys(dense)
    assert sparse.examined == 2  # its two members, sorted


def test_a_sparse_restriction_pages_in_key_order_from_any_start() -> None:
    rare_ones = {3, 8, 11, 25, 30, 44, 52}
    rows = numbered_rows(120, rare_ones, seed=3)
    built = index(rows)
    rare = {"attribute": "rare", "value": True}
    expected = brute_filtered(rows, test=lambda a: a["rare"])
    assert len(expected) * 16 < len(rows)
    for exclude in (None, "a011"):
        admitted = [key for key in expected if key[0] != exclude]
        for limit in (1, 2, 3, 10):
            for offset in (0, 1, 4):
                page = filtered(built, rare, limit=limit, offset=offset, exclude_agent=exclude)
                assert keys(page) == admitted[offset : offset + limit]
                assert page.examined == len(expected)
                more = len(admitted) > offset + limit
                assert page.next == (Position(admitted[offset + limit - 1]) if more else None)
            joined: list[Key] = []
            after: Key | None = None
            for _ in rows:  # a page per admitted capability at most
                page = filtered(built, rare, limit=limit, after=after, exclude_agent=exclude)
                joined += keys(page)
                if page.next is None:
                    break
                after = page.next.key
            else:
                pytest.fail("the pages do not end")
            assert joined == admitted
    # A per-doc test (a wide filter) applies to the sorted members, too.
    low = {"attribute": "n", "op": "lt", "value": 40}
    page = filtered(built, rare, low, limit=10)
    assert keys(page) == brute_filtered(rows, test=lambda a: a["rare"] and a["n"] < 40)


def test_simple_ranks_one_window_of_a_sparse_restriction_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(search, "SIMPLE_WINDOW", 3)
    rare_ones = {3, 8, 11, 25, 30, 44, 52}
    rows = numbered_rows(120, rare_ones, seed=4)
    built = index(rows)
    rare = parse_filters([{"attribute": "rare", "value": True}])
    admitted = brute_filtered(rows, test=lambda a: a["rare"])
    windows = [admitted[n : n + 3] for n in range(0, len(admitted), 3)]
    scored = {(h[0], h[1]): h[2] for h in brute_simple(rows, "match")}
    expected = [key for window in windows for key in sorted(window, key=lambda k: (-scored[k], k))]
    joined: list[Key] = []
    start = Position()
    totals: list[int | None] = []
    for _ in rows:  # a window per admitted capability at most
        page = built.search(
            query="match",
            algorithm="simple",
            filters=rare,
            limit=100,
            offset=start.rank,
            after=start.key,
        )
        joined += keys(page)
        totals.append(page.total)
        assert page.examined == len(admitted)
        if page.next is None:
            break
        start = page.next
    assert joined == expected
    assert totals == [None] * len(windows)
    # Exactly one window's worth: ranked at once, counted, no next page.
    few = numbered_rows(60, {4, 17, 40}, seed=5)
    page = index(few).search(query="match", algorithm="simple", filters=rare, limit=100)
    assert [(h.agent_id, h.name, h.score) for h in page.hits] == brute_simple(few, "match")
    assert (page.total, page.next) == (3, None)


# The plan: which restrictions are read into the allowed set, which are tested per doc

RED = {0, 1, 2, 11, 20}
BLUE = {1, 3, 12}


def planned_rows() -> list[Row]:
    """40 capabilities a00..a39: "big" a00-a09, "mid" a10-a14, "one" a15, the rest "other";
    keywords Red on RED, blue on BLUE; attribute n the number."""
    rows: list[Row] = []
    for n in range(40):
        name = "big" if n < 10 else "mid" if n < 15 else "one" if n == 15 else "other"
        words = (["Red"] if n in RED else []) + (["blue"] if n in BLUE else [])
        rows.append((f"a{n:02d}", name, "", words, {"n": n}))
    random.Random(8).shuffle(rows)
    return rows


def ids(built: SearchIndex, numbers: set[int] | range) -> set[int]:
    return {at for key, at in built._ids.items() if int(key[0][1:]) in numbers}


def numbered_in(values: list[int]) -> dict[str, Any]:
    return {"attribute": "n", "op": "in", "value": values}


def test_several_keywords_are_read_as_one_set_within_the_read_budget_else_tested_per_doc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = planned_rows()
    built = index(rows)
    words = ["RED", "Blue"]  # 5 + 3 ids to read
    expected = brute_filtered(rows, words=words)
    for budget, read in ((8, True), (7, False)):
        monkeypatch.setattr(search, "READ_BUDGET", budget)
        plan = built._plan(None, words, (), None, len(built))
        assert plan is not None
        if read:
            assert (plan.allowed, plan.tests) == (ids(built, RED | BLUE), [])
        else:
            assert plan.allowed is None
            assert len(plan.tests) == 1
            assert {at for at in range(len(rows)) if plan.admits(at)} == ids(built, RED | BLUE)
        page = built.search(query=None, algorithm="filtered", keywords=words)
        assert keys(page) == expected
        assert page.total == (len(expected) if read else None)


def test_restriction_sets_are_intersected_smallest_first_within_the_read_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The smallest set is allowed; each next one is intersected when the allowed set (the
    side the intersection reads) fits in the reads left, else tested per doc."""
    rows = planned_rows()
    built = index(rows)
    mid = ids(built, range(10, 15))

    def plan_of(name: str, words: list[str], *raw: dict[str, Any]) -> Any:
        plan = built._plan(name, words, parse_filters(list(raw)), None, len(built))
        page = built.search(
            query=None,
            algorithm="filtered",
            capability_name=name,
            keywords=words,
            filters=parse_filters(list(raw)),
        )
        brute = brute_filtered(
            rows, name, words, test=lambda a: all(a["n"] in r["value"] for r in raw)
        )
        assert keys(page) == brute
        return plan

    # blue (3) is smaller than big (10): allowed; big is too many to intersect within 1 read.
    monkeypatch.setattr(search, "READ_BUDGET", 1)
    plan = plan_of("big", ["BLUE"])
    assert plan.allowed == ids(built, BLUE)
    assert len(plan.tests) == 1
    # mid and red, 5 each: 5 reads intersect them, 4 do not.
    for budget, intersected in ((5, True), (4, False)):
        monkeypatch.setattr(search, "READ_BUDGET", budget)
        plan = plan_of("mid", ["red"])
        if intersected:
            assert (plan.allowed, plan.tests) == (ids(built, {11}), [])
        else:
            assert plan.allowed == mid
            assert len(plan.tests) == 1
    # 12 reads: red and blue read (8), 4 left, too few to intersect mid (5) with them.
    monkeypatch.setattr(search, "READ_BUDGET", 12)
    plan = plan_of("mid", ["red", "blue"])
    assert plan.allowed == mid
    assert len(plan.tests) == 1
    # 12 reads: mid and red intersected (5), 7 left: a filter of 6 is read, one of 8 is not.
    six, eight = [11, 30, 31, 32, 33, 34], [11, 30, 31, 32, 33, 34, 35, 36]
    plan = plan_of("mid", ["red"], numbered_in(six))
    assert (plan.allowed, plan.checks) == (ids(built, {11}), [])
    plan = plan_of("mid", ["red"], numbered_in(eight))
    assert (plan.allowed, plan.checks) == (ids(built, {11}), parse_filters([numbered_in(eight)]))


def test_a_filter_is_read_unless_wider_than_16x_the_allowed_or_the_reads_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = planned_rows()
    built = index(rows)
    one = ids(built, {15})
    # "one" allows one capability: a filter of 16 is read into the allowed set, 17 are checked.
    sixteen, seventeen = numbered_in(list(range(15, 31))), numbered_in(list(range(15, 32)))
    plan = built._plan("one", None, parse_filters([sixteen]), None, len(built))
    assert plan is not None
    assert (plan.allowed, plan.checks) == (one, [])
    plan = built._plan("one", None, parse_filters([seventeen]), None, len(built))
    assert plan is not None
    assert (plan.allowed, plan.checks) == (one, parse_filters([seventeen]))
    # The budget: the docs the algorithm visits anyway. 17 ids for a lexical query of one doc.
    plan = built._plan(None, None, parse_filters([seventeen]), None, 1)
    assert plan is not None
    assert (plan.allowed, plan.checks) == (None, parse_filters([seventeen]))
    # Reads: a filter of 6 within 6 reads is read; then 2 are left.
    monkeypatch.setattr(search, "READ_BUDGET", 6)
    plan = built._plan(None, None, parse_filters([numbered_in([0, 1, 2, 3, 4, 5])]), None, 40)
    assert plan is not None
    assert (plan.allowed, plan.checks) == (ids(built, range(6)), [])
    monkeypatch.setattr(search, "READ_BUDGET", 12)
    four = numbered_in([0, 1, 2, 3])
    for more, read in ((list(range(8)), True), (list(range(9)), False)):
        raw = [four, numbered_in(more)]
        plan = built._plan(None, None, parse_filters(raw), None, 40)
        assert plan is not None
        assert plan.allowed == ids(built, range(4))
        assert plan.checks == ([] if read else parse_filters([numbered_in(more)]))
        page = filtered(built, *raw)
        assert keys(page) == brute_filtered(rows, test=lambda a: a["n"] < 4)


def test_an_unknown_name_or_an_empty_intersection_finds_nothing() -> None:
    rows = planned_rows()
    built = index(rows)
    algorithms: list[Algorithm] = ["simple", "filtered", "lexical"]
    for algorithm in algorithms:
        page = built.search(query="a", algorithm=algorithm, capability_name="nope")
        assert page == SearchPage([], 0)
    assert built._plan("nope", None, (), None, 40) is None
    assert built._plan("one", ["blue"], (), None, 40) is None
    assert built._plan("big", None, parse_filters([numbered_in([20])]), None, 40) is None
    assert built._plan(None, None, parse_filters([numbered_in([99])]), None, 40) is None


# search: its arguments


def test_search_defaults_and_refusals() -> None:
    rows = numbered_rows(60, set())
    built = index(rows)
    assert len(built.search(query=None, algorithm="filtered").hits) == 50
    ranked: list[Algorithm] = ["simple", "lexical"]
    for algorithm in ranked:
        page = built.search(query=None, algorithm=algorithm, limit=100)
        assert keys(page) == sorted((row[0], row[1]) for row in rows)
        assert {hit.score for hit in page.hits} == {0.0}
    negative: list[dict[str, Any]] = [{"limit": -1}, {"offset": -1}]
    for bad in negative:
        with pytest.raises(ValueError, match=r"^limit and offset must not be negative$"):
            built.search(query=None, algorithm="filtered", **bad)
    sixteen = " ".join(f"w{n}" for n in range(search.MAX_QUERY_WORDS))
    assert built.search(query=sixteen, algorithm="lexical") == SearchPage([], 0)
    with pytest.raises(search.BadQuery):
        built.search(query=f"{sixteen} w99", algorithm="lexical")


def test_a_name_or_keyword_restricted_page_walks_only_that_column_from_its_start() -> None:
    rows = planned_rows()
    built = index(rows)
    named = brute_filtered(rows, "big")
    page = built.search(query=None, algorithm="filtered", capability_name="big", limit=3)
    assert keys(page) == named[:3]
    assert page.examined == 4
    page = built.search(
        query=None, algorithm="filtered", capability_name="big", after=named[4], limit=20
    )
    assert keys(page) == named[5:]
    assert page.examined == len(named) - 5
    tagged = brute_filtered(rows, words=["red", "BLUE"])
    page = built.search(query=None, algorithm="filtered", keywords=["red", "BLUE"], limit=2)
    assert keys(page) == tagged[:2]
    assert page.examined == 3
    page = built.search(
        query=None, algorithm="filtered", keywords=["red", "BLUE"], after=tagged[1], limit=20
    )
    assert keys(page) == tagged[2:]
    assert page.examined == len(tagged) - 2


# lexical pages


def test_a_lexical_page_goes_on_only_when_more_hits_follow() -> None:
    built = index()  # the fixed corpus: "pizza" is in two capabilities
    whole = built.search(query="pizza", algorithm="lexical", limit=2)
    assert len(whole.hits) == 2
    assert whole.next is None
    assert whole.keyed is False
    assert whole.exact is True
    first = built.search(query="pizza", algorithm="lexical", limit=1)
    assert keys(first) == keys(whole)[:1]
    assert first.next == Position(None, 1)
    counted = built.search(query="pizza", algorithm="lexical", limit=0)
    assert (counted.hits, counted.total, counted.next) == ([], 2, None)


def test_a_lexical_page_ranks_one_more_than_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranking is asked for the page and one more (to know whether another follows), not
    more: its cost and its reads (`THRESHOLD_READS` + 2 x that) follow the page."""
    asked: list[int] = []
    lexical = ranking.Ranking.lexical

    def spy(self: ranking.Ranking, *args: Any) -> Any:
        asked.append(args[-1])
        return lexical(self, *args)

    monkeypatch.setattr(ranking.Ranking, "lexical", spy)
    built = index()
    for limit, offset in ((1, 0), (2, 1), (5, 3)):
        built.search(query="pizza order", algorithm="lexical", limit=limit, offset=offset)
        assert asked[-1] == offset + limit + 1


def test_a_lexical_page_cut_short_by_its_reads_says_it_is_not_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ranking, "THRESHOLD_READS", 0)
    monkeypatch.setattr(ranking, "_MULTI", 0)
    rng = random.Random(3)
    rows: list[Row] = []
    for n in range(60):
        words = ["alpha"] * rng.randint(1, 4) + ["beta"] * rng.randint(1, 4)
        words += [f"f{rng.randrange(90)}" for _ in range(rng.randint(1, 12))]
        rows.append((f"a{n:02d}", f"c{n}", " ".join(words), [], {}))
    rows += [(f"z{n}", "other", "gamma", [], {}) for n in range(60)]
    page = index(rows).search(query="alpha beta", algorithm="lexical", limit=5)
    assert page.exact is False
    assert len(page.hits) == 5
    assert page.total == 60


def test_a_query_with_no_indexed_word_finds_nothing_even_in_an_empty_index() -> None:
    for built in (SearchIndex(), index(numbered_rows(3, set()))):
        for text in ("?!", "zzqx-wvut"):
            assert built.search(query=text, algorithm="lexical") == SearchPage([], 0)


def test_a_lookup_that_only_counts_has_no_page_to_go_on_from() -> None:
    built = index(numbered_rows(5, set()))
    page = built.lookup(
        capability_name=None, keywords=None, exclude_agent=None, after=None, limit=0
    )
    assert (page.hits, page.next) == ([], None)


def test_only_a_lexical_query_is_held_to_its_number_of_words() -> None:
    built = index(numbered_rows(3, set()))
    many = " ".join(f"w{n}" for n in range(search.MAX_QUERY_WORDS + 1))
    with pytest.raises(search.BadQuery):
        built.search(query=many, algorithm="lexical")
    assert built.search(query=many, algorithm="simple") == SearchPage([], 0)
    assert len(built.search(query=many, algorithm="filtered").hits) == 3  # text not read
