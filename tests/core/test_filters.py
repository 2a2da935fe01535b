"""Filters and their value index (lobby/core/discovery/filters.py), driven directly: the sentences a
bad filter is refused with; `AttributeIndex.size` and `members` counting and listing exactly the
docs `Filter.matches` admits, op by op, over every kind of attribute (equal values at range ends, 1
and 1.0, booleans that are not numbers, lists, NaN, missing attributes), with and without `within`,
before and after removals; `SortedColumn` in small blocks: a discard removes that one pair or
nothing, blocks fill to 2 * LOAD and know their last pair, a range holding nothing yields no run,
and finding where a range starts costs O(log n) comparisons, not a walk over the blocks before
it; and a `Plan`'s admission and counts, exact up to their budgets inclusive."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import total_ordering
from typing import Any

import pytest

from lobby.core.discovery.filters import (
    COUNT_BUDGET,
    READ_BUDGET,
    AttributeIndex,
    BadFilter,
    Filter,
    Plan,
    SortedColumn,
    parse_filters,
)

# -- refusals, word for word ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "sentence"),
    [
        ("price<10", "filter must be an object {attribute, op, value}"),
        (
            {"attribute": "a", "value": None},
            "filter: 'eq' must be a string, number or boolean, not NoneType",
        ),
        (
            {"attribute": "a", "op": "ne", "value": {"x": 1}},
            "filter: 'ne' must be a string, number or boolean, not dict",
        ),
        (
            {"attribute": "a", "op": "in", "value": [1, ["x"]]},
            "filter: every 'in' value must be a string, number or boolean, not list",
        ),
    ],
)
def test_a_bad_filter_is_refused_with_a_sentence_naming_it_and_its_type(
    raw: object, sentence: str
) -> None:
    with pytest.raises(BadFilter) as caught:
        Filter.parse(raw)
    assert str(caught.value) == sentence


def test_filters_that_are_not_a_list_are_refused_with_the_shape_they_need() -> None:
    with pytest.raises(BadFilter) as caught:
        parse_filters({"attribute": "a", "value": 1})
    assert str(caught.value) == "'filters' must be a list of {attribute, op, value} objects"


# -- the index answers as the rules do ----------------------------------------------------------

NUMBERS: list[Any] = [-1, 0, 1, 1.0, 2, 2, 2.0, 2.5, 3, 10, math.nan]
STRINGS: list[Any] = ["", "2", "a", "b", "b", "rome", "rome", "zzz"]
BOOLS: list[Any] = [True, False, True]
LISTS: list[Any] = [[], ["a"], ["a", "b"], ["b", "b"], ["a", 1, True], [2, 2.0, 3], ["a", None]]
LISTS += [[math.nan, 1], ["rome", "zzz", False]]
POOLS: dict[str, list[Any]] = {
    "price": NUMBERS * 3 + ["2", True, [1, 2]],  # numbers, with a string, a bool and a list
    "city": STRINGS * 3 + [2, None],
    "open": BOOLS * 3 + [1, 0],  # no string at all
    "tags": LISTS * 2 + ["a", 1],
    "mixed": NUMBERS + STRINGS + BOOLS + LISTS,
}
VALUES: list[Any] = [-1, 0, 1, 1.0, 2, 2.0, 2.5, 3, 10, "", "2", "a", "b", "rome", "zzz"]
VALUES += [True, False]
IN_VALUES: list[list[Any]] = [[], [2], [2, 2.0], [1, True], ["x", True], ["rome", 3, False]]
IN_VALUES += [[True, "a", 2.5], [-1, "zzz", 1]]


def corpus(seed: int, size: int = 240) -> list[dict[str, Any]]:
    """Docs with each attribute drawn from its pool, or missing (about one in five)."""
    rng = random.Random(seed)
    return [
        {name: rng.choice(pool) for name, pool in POOLS.items() if rng.random() < 0.8}
        for _ in range(size)
    ]


def every_filter() -> list[Filter]:
    specs: list[dict[str, Any]] = []
    for name in [*POOLS, "absent"]:
        for op in ("eq", "ne", "lt", "le", "gt", "ge", "contains"):
            for value in VALUES:
                if op in ("lt", "le", "gt", "ge") and isinstance(value, bool):
                    continue
                specs.append({"attribute": name, "op": op, "value": value})
        for values in IN_VALUES:
            specs.append({"attribute": name, "op": "in", "value": values})
    return [Filter.parse(spec) for spec in specs]


def indexed(docs: dict[int, dict[str, Any]]) -> AttributeIndex:
    built = AttributeIndex()
    for doc, attributes in docs.items():
        built.add(doc, attributes)
    return built


def admitted(f: Filter, docs: dict[int, dict[str, Any]]) -> set[int]:
    return {doc for doc, attributes in docs.items() if f.matches(attributes)}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 2 to 4 pairs: equal values and range ends fall across block boundaries."""
    monkeypatch.setattr(SortedColumn, "LOAD", 2)


def test_size_counts_exactly_the_docs_each_filter_admits() -> None:
    docs = dict(enumerate(corpus(seed=1)))
    built = indexed(docs)
    for f in every_filter():
        assert built.size(f) == len(admitted(f, docs)), f


def test_members_are_exactly_the_docs_each_filter_admits_within_any_set() -> None:
    docs = dict(enumerate(corpus(seed=2)))
    built = indexed(docs)
    rng = random.Random(2)
    withins: list[set[int] | None] = [None, set(), set(docs), {n for n in docs if n % 2}]
    withins += [set(rng.sample(range(len(docs) + 50), 60)) for _ in range(3)]
    withins += [{doc for doc, attributes in docs.items() if "price" not in attributes}]
    for f in every_filter():
        expected = admitted(f, docs)
        for within in withins:
            found = built.members(f, within)
            assert found == (expected if within is None else expected & within), (f, within)


def test_after_removals_the_index_answers_for_the_docs_left_and_keeps_nothing_of_the_rest() -> None:
    docs = dict(enumerate(corpus(seed=3)))
    built = indexed(docs)
    rng = random.Random(3)
    for doc in rng.sample(sorted(docs), len(docs) // 2):
        built.discard(doc, docs.pop(doc))
    for f in every_filter():
        assert built.size(f) == len(admitted(f, docs)), f
        assert built.members(f) == admitted(f, docs), f
    for doc in list(docs):
        built.discard(doc, docs.pop(doc))
    assert built._present == {}
    assert built._columns == {}


def test_ne_counts_the_docs_having_the_attribute_less_those_equal() -> None:
    """The rule in one small case: `ne` admits a doc of another kind, a list and NaN, never
    a doc without the attribute."""
    docs: dict[int, dict[str, Any]] = {
        0: {"a": 2},
        1: {"a": 2.0},
        2: {"a": 3},
        3: {"a": "2"},
        4: {"a": True},
        5: {"a": [2]},
        6: {"a": math.nan},
        7: {"b": 2},
    }
    built = indexed(docs)
    f = Filter.parse({"attribute": "a", "op": "ne", "value": 2})
    assert built.size(f) == 5
    assert built.members(f) == {2, 3, 4, 5, 6}
    assert built.members(f, {0, 2, 7, 9}) == {2}
    absent = Filter.parse({"attribute": "z", "op": "ne", "value": 2})
    assert built.size(absent) == 0
    assert built.members(absent) == set()
    assert built.members(absent, {0, 1}) == set()


def test_ordered_ops_are_open_or_closed_at_an_equal_value() -> None:
    docs = {doc: {"a": value} for doc, value in enumerate([1, 2, 2.0, 2, 3, "2", True])}
    built = indexed(docs)
    for op, expected in (("lt", {0}), ("le", {0, 1, 2, 3}), ("gt", {4}), ("ge", {1, 2, 3, 4})):
        f = Filter.parse({"attribute": "a", "op": op, "value": 2})
        assert built.members(f) == expected, op
        assert built.size(f) == len(expected), op


def test_contains_admits_the_docs_whose_list_has_the_value_as_an_element() -> None:
    docs: dict[int, dict[str, Any]] = {
        0: {"tags": ["a", "b"]},
        1: {"tags": ["b"]},
        2: {"tags": "a"},
        3: {"tags": []},
        4: {"tags": ["b", "a", "a"]},
        5: {"other": ["a"]},
    }
    built = indexed(docs)
    f = Filter.parse({"attribute": "tags", "op": "contains", "value": "a"})
    assert built.members(f) == {0, 4}
    assert built.size(f) == 2
    assert built.members(f, {1, 4, 5}) == {4}
    assert admitted(f, docs) == {0, 4}


# -- SortedColumn -------------------------------------------------------------------------------


def contents(column: SortedColumn, values: list[Any]) -> list[tuple[Any, int]]:
    """The column's (value, doc) pairs in order, read back through `spans`, value by value."""
    return [
        (v, doc)
        for v in values
        for ids, start, stop in column.spans(v, v)
        for doc in ids[start:stop]
    ]


def check_blocks(column: SortedColumn) -> None:
    """Each block non-empty, at most 2 * LOAD long, its last pair recorded as its last."""
    assert all(0 < len(ids) <= 2 * SortedColumn.LOAD for ids in column._ids)
    assert [len(values) for values in column._values] == [len(ids) for ids in column._ids]
    assert column._lasts == [
        (v[-1], i[-1]) for v, i in zip(column._values, column._ids, strict=True)
    ]


def test_a_new_column_is_empty() -> None:
    column = SortedColumn()
    assert len(column) == 0
    assert list(column) == []
    assert list(column.spans(None, None)) == []


def test_a_block_holds_up_to_twice_load_pairs_and_then_splits_in_halves() -> None:
    """A block fills to 2 * LOAD before it splits: fewer, fuller blocks, fewer splits."""
    column = SortedColumn()
    for doc in range(2 * SortedColumn.LOAD):
        column.add(doc, doc)
    assert column._ids == [list(range(2 * SortedColumn.LOAD))]
    column.add(2 * SortedColumn.LOAD, 2 * SortedColumn.LOAD)
    half = SortedColumn.LOAD
    assert column._ids == [list(range(half)), list(range(half, 2 * half + 1))]
    check_blocks(column)


def test_a_discard_removes_that_one_pair_or_nothing() -> None:
    column = SortedColumn()
    pairs = sorted({(value, doc) for value in range(0, 20, 2) for doc in (1, 3, 5)})
    for value, doc in reversed(pairs):
        column.add(value, doc)
    check_blocks(column)
    values = list(range(-1, 22))
    assert contents(column, values) == pairs
    # Absent: a present value under another doc, a present doc under another value, a value
    # between two blocks' values, before the first and after the last.
    for value, doc in [(4, 2), (4, 0), (4, 6), (5, 3), (3, 1), (-1, 1), (21, 5), (18, 6)]:
        column.discard(value, doc)
        assert contents(column, values) == pairs, (value, doc)
        assert len(column) == len(pairs)
    # Present: each block's last and first pairs, and the middle ones, until none is left.
    rng = random.Random(4)
    while pairs:
        ends = [(v[-1], i[-1]) for v, i in zip(column._values, column._ids, strict=True)]
        ends += [(v[0], i[0]) for v, i in zip(column._values, column._ids, strict=True)]
        pair = rng.choice(ends if rng.random() < 0.7 else pairs)
        column.discard(*pair)
        pairs.remove(pair)
        check_blocks(column)
        assert contents(column, values) == pairs
        assert list(column) == [doc for _, doc in pairs]
        assert len(column) == len(pairs)
        column.discard(*pair)  # twice: nothing more goes
        assert len(column) == len(pairs)


def test_blocks_know_their_last_pair_through_adds_and_discards() -> None:
    column, pairs = SortedColumn(), set()
    rng = random.Random(5)
    for _ in range(3000):
        pair = (rng.randrange(40), rng.randrange(8))
        if pair in pairs:
            column.discard(*pair)
            pairs.discard(pair)
        else:
            column.add(*pair)
            pairs.add(pair)
        check_blocks(column)
    assert list(column) == [doc for _, doc in sorted(pairs)]


def test_a_range_holding_no_value_yields_no_run() -> None:
    column, values = SortedColumn(), list(range(0, 40, 2))
    for value in values:
        column.add(value, value)
    gaps: list[tuple[float, float]] = [(3, 3), (-5, -1), (41, 50), (5, 5.5), (9, 9)]
    for low, high in gaps:
        for low_open in (False, True):
            for high_open in (False, True):
                empty = column.spans(low, high, low_open=low_open, high_open=high_open)
                assert list(empty) == [], (low, high)
    ends: list[int | None] = [5, 11, 39, None]
    for first in (0, 3, 10, 38):
        for end in ends:
            runs = list(column.spans(first, end))
            assert all(stop > start for _, start, stop in runs)
            got = [doc for ids, start, stop in runs for doc in ids[start:stop]]
            assert got == [v for v in values if first <= v and (end is None or v <= end)]


@total_ordering
class Counted:
    """A value that counts the comparisons made with it."""

    made = 0

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        Counted.made += 1
        return isinstance(other, Counted) and self.value == other.value

    def __lt__(self, other: Counted) -> bool:
        Counted.made += 1
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)


def test_a_range_is_found_in_log_n_comparisons_not_by_walking_the_blocks_before_it() -> None:
    """`size` is O(log n): where a range starts is bisected among the blocks' last pairs."""
    column, size = SortedColumn(), 4000
    for n in range(size):
        column.add(Counted(n), n)
    bound = 6 * math.log2(size)
    for low in (10, size // 2, size - 10):
        for low_open in (False, True):
            Counted.made = 0
            runs = list(column.spans(Counted(low), Counted(low + 3), low_open=low_open))
            assert [doc for ids, a, b in runs for doc in ids[a:b]] == list(
                range(low + low_open, low + 4)
            )
            assert Counted.made <= bound, (low, low_open, Counted.made)


# -- Plan ---------------------------------------------------------------------------------------


def test_a_count_at_exactly_its_budget_is_made_and_one_past_it_is_not() -> None:
    """READ_BUDGET ids read, or COUNT_BUDGET docs tested one by one, is still within budget."""
    allowed = set(range(READ_BUDGET))
    plan = Plan(allowed, {1, 2, READ_BUDGET + 5}, [], lambda doc: {})
    assert plan.count(set(range(READ_BUDGET))) == READ_BUDGET - 2
    assert plan.count(set(range(1, READ_BUDGET + 9))) == READ_BUDGET - 3
    assert (
        Plan(set(range(READ_BUDGET + 1)), set(), [], lambda doc: {}).count(
            set(range(READ_BUDGET + 1))
        )
        is None
    )
    odd = Filter.parse({"attribute": "a", "value": 1})
    checked = Plan(None, set(), [odd], lambda doc: {"a": doc % 2})
    assert checked.count(set(range(COUNT_BUDGET))) == COUNT_BUDGET // 2
    assert checked.count(set(range(COUNT_BUDGET + 1))) is None
    tested = Plan(None, set(), [], lambda doc: {}, [lambda doc: doc % 3 == 0])
    assert tested.count(set(range(COUNT_BUDGET))) == len(range(0, COUNT_BUDGET, 3))
    assert tested.count(set(range(COUNT_BUDGET + 1))) is None


def test_a_plan_admits_the_allowed_docs_not_excluded_that_pass_every_test_and_check() -> None:
    attributes = {doc: {"a": doc % 4} for doc in range(40)}
    low = Filter.parse({"attribute": "a", "op": "lt", "value": 2})
    for allowed in (None, set(range(0, 40, 3)), set()):
        for excluded in (set(), {3, 4, 5, 6}):
            for checks in ([], [low]):
                tests: list[list[Callable[[int], bool]]] = [[], [lambda doc: doc < 30]]
                for per_doc in tests:
                    plan = Plan(allowed, excluded, checks, attributes.__getitem__, per_doc)
                    expected = {
                        doc
                        for doc in attributes
                        if (allowed is None or doc in allowed)
                        and doc not in excluded
                        and all(test(doc) for test in per_doc)
                        and all(f.matches(attributes[doc]) for f in checks)
                    }
                    assert {doc for doc in attributes if plan.admits(doc)} == expected
                    assert plan.count(set(attributes)) == len(expected)
