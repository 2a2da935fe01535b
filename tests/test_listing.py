"""The key-order columns discovery pages through: every iteration checked against a sorted
brute force from every kind of starting key, and `walk`'s bounds."""

from __future__ import annotations

import random

from lobby.core.discovery import listing
from lobby.core.discovery.listing import Listing, walk

DocKey = tuple[str, str]


def build(rows: list[tuple[DocKey, list[str]]]) -> tuple[Listing, list[DocKey]]:
    keys: list[DocKey] = []
    built = Listing(keys)
    for doc, (key, keywords) in enumerate(rows):
        keys.append(key)
        built.add(doc, key, {k.lower() for k in keywords})
    return built, keys


def rows_of(seed: int, count: int) -> list[tuple[DocKey, list[str]]]:
    """Keys whose agents and names are prefixes of one another, keywords shared and repeated."""
    rng = random.Random(seed)
    agents = ["a", "ab", "a.b", "b", "b-", "zz", "A"]
    names = ["n", "n1", "n_", "nn", "x", "X", "name with space"]
    found: dict[DocKey, list[str]] = {}
    while len(found) < count:
        key = (rng.choice(agents) + str(rng.randrange(5)), rng.choice(names))
        found[key] = rng.sample(["red", "Red", "blue", "green", "gold"], rng.randrange(4))
    return list(found.items())


def after(keys: list[DocKey], docs: list[int], key: DocKey | None) -> list[DocKey]:
    return sorted(keys[d] for d in docs if key is None or keys[d] > key)


def test_public_names() -> None:
    assert set(listing.__all__) == {
        "SCAN_BUDGET",
        "DocKey",
        "Hit",
        "Listing",
        "Position",
        "SearchPage",
        "Walked",
        "new_hit",
        "walk",
    }


def test_every_iteration_matches_a_sorted_brute_force_from_every_start() -> None:
    rows = rows_of(1, 120)
    built, keys = build(rows)
    everything = list(range(len(rows)))
    starts: list[DocKey | None] = [None, ("", ""), ("a", "n"), ("zzz", "")]
    starts += [key for key, _ in rows[::7]]
    starts += [(key[0], key[1] + "\x00") for key, _ in rows[::11]]  # between two keys
    for start in starts:
        assert [keys[d] for d in built.after(start)] == after(keys, everything, start)
        for name in ("n", "n1", "X", "absent", ""):
            named = [d for d in everything if keys[d][1] == name]
            assert [keys[d] for d in built.named(name, start)] == after(keys, named, start)
        for wanted in (["red"], ["red", "blue"], ["gold", "green", "blue"], ["none"]):
            tagged = [d for d in everything if {k.lower() for k in rows[d][1]} & set(wanted)]
            got = [keys[d] for d in built.tagged(wanted, start)]
            assert got == after(keys, tagged, start), (start, wanted)


def test_discard_forgets_exactly_what_add_indexed() -> None:
    rows = rows_of(2, 60)
    built, keys = build(rows)
    gone = set(range(0, len(rows), 3))
    for doc in gone:
        key, keywords = rows[doc]
        built.discard(doc, key, {k.lower() for k in keywords})
    left = [d for d in range(len(rows)) if d not in gone]
    assert len(built) == len(left)
    assert [keys[d] for d in built.after(None)] == after(keys, left, None)
    red = [d for d in left if "red" in {k.lower() for k in rows[d][1]}]
    assert [keys[d] for d in built.tagged(["red"], None)] == after(keys, red, None)


def test_walk_finds_skips_and_stops_within_its_budget() -> None:
    even = lambda doc: doc % 2 == 0  # noqa: E731
    walked = walk(iter(range(100)), even, skip=3, want=5, budget=1_000)
    assert walked.found == [6, 8, 10, 12, 14]
    assert walked.stopped_at == 14
    assert walked.examined == 15
    # Nothing it admits: it stops after `budget` more than it was after, where it got to.
    walked = walk(iter(range(10_000)), lambda doc: False, skip=0, want=5, budget=50)
    assert (walked.found, walked.stopped_at, walked.examined) == ([], 54, 55)
    # The end of the source: stopped_at None says there is no more.
    walked = walk(iter(range(10)), even, skip=0, want=50, budget=1_000)
    assert (walked.found, walked.stopped_at) == ([0, 2, 4, 6, 8], None)
    # Without a test, every entry read is found (and counted).
    walked = walk(iter(range(10)), None, skip=2, want=3, budget=0)
    assert (walked.found, walked.stopped_at, walked.examined) == ([2, 3, 4], 4, 5)


class Counted(str):
    """An agent id that counts the comparisons made with it: the work of finding a key."""

    compared = 0

    def __lt__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__lt__(self, other)  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__gt__(self, other)  # type: ignore[operator]

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_at_100000_capabilities_a_page_costs_its_size_not_the_registry() -> None:
    """Counted, not timed: the comparisons that find where a page starts (a bisection, not a
    scan) and the entries read from there (one a capability)."""
    keys: list[DocKey] = []
    built = Listing(keys)
    for doc in range(100_000):
        key = (Counted(f"agent{doc // 1000:03d}"), f"cap{doc % 1000:03d}")
        keys.append(key)
        built.add(doc, key, {"everywhere", f"kw{doc % 7}"})
    starts: list[DocKey | None] = [None, (Counted("agent050"), "cap500"), keys[-2]]
    for start in starts:
        for name, source in (
            ("after", built.after(start)),
            ("named", built.named("cap007", start)),  # one an agent: 100 in all
            ("tagged", built.tagged(["kw3", "kw5"], start)),
            ("everywhere", built.tagged(["everywhere"], start)),
        ):
            Counted.compared = 0
            page = walk(source, None, skip=0, want=101, budget=4096)
            assert page.examined <= 101
            assert Counted.compared < 500, (name, Counted.compared)  # a scan: ~100,000
            if start is None and name != "named":
                assert len(page.found) == 101
    # The same through a filter that rejects what it reads: bounded by the budget.
    Counted.compared = 0
    page = walk(built.after(None), lambda doc: False, skip=0, want=101, budget=4096)
    assert page.found == []
    assert page.examined == 4096 + 101
    assert page.stopped_at is not None


def test_a_name_or_keyword_finds_only_itself_not_the_longer_ones_it_begins() -> None:
    """A column's run for "gold" ends before "gold1", "gold-leaf" and "goldX" (kept
    lower-cased: "goldx"), whatever sorts between them."""
    rows: list[tuple[DocKey, list[str]]] = [
        (("a", "gold"), ["gold"]),
        (("a", "gold1"), ["gold1"]),
        (("b", "gold-leaf"), ["gold-leaf", "Gold"]),
        (("c", "goldX"), ["goldx"]),
        (("c", "gol"), ["gol"]),
    ]
    built, keys = build(rows)
    for start in (None, ("a", "gold"), ("a", "zz")):
        assert [keys[d] for d in built.tagged(["gold"], start)] == after(keys, [0, 2], start)
        assert [keys[d] for d in built.named("gold", start)] == after(keys, [0], start)
        assert [keys[d] for d in built.tagged(["gol"], start)] == after(keys, [4], start)


def test_a_page_cut_short_keeps_what_it_was_and_says_where_to_go_on() -> None:
    """`SearchPage.cut`: a ranked page goes on `taken` ranks past its own start (after the
    same key); a key-ordered one after its last kept key; every other field is kept."""
    hits = [listing.Hit(f"a{n}", "skill", 1.0 - n / 10) for n in range(4)]
    start = listing.Position(("a", "skill"), 7)
    for keyed in (False, True):
        page = listing.SearchPage(hits, 40, None, keyed, start, 12, False)
        cut = page.cut(2)
        fields = (cut.hits, cut.total, cut.keyed, cut.start, cut.examined, cut.exact)
        assert fields == (hits[:2], 40, keyed, start, 12, False), keyed
        if keyed:
            assert cut.next == listing.Position(("a1", "skill"))
        else:
            assert cut.next == listing.Position(("a", "skill"), 9)
        assert page.cut(4) is page  # nothing to cut
