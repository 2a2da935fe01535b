"""The search index's rules, checked at the class: a removed capability leaves no entry in the
name, keyword and agent indexes; the seed's `lookup` by name and/or keywords (any case) and
exclusion agrees with a brute force, reads the smaller column and costs its page; `simple`
scores exactly the fields a query is in; key-ordered pages say where they start, what they
cost and where they go on; sparse restrictions are sorted, dense ones walked."""

from __future__ import annotations

import random
from typing import Any

from lobby.core.listing import Position, SearchPage
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
