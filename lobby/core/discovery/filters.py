"""Filters over capability `attributes`, and the value index that answers them without a scan.

A capability's `attributes` map names to a string, a number, a boolean or a list of strings
(seed 002's OEF `Description`, one row of a data model). A filter is one constraint on one
attribute, in the spirit of OEF's `Constraint` / `Relation` / `Set`:

    {"attribute": "price", "op": "lt", "value": 10}      "op" defaults to "eq"

- `eq`, `ne`: equal / not equal. Values compare within their kind only: a string never equals a
  number, `true` never equals `1`; ints and floats compare as numbers (`2` equals `2.0`).
- `lt`, `le`, `gt`, `ge`: the value is a number (numeric order) or a string (code-point order,
  so ISO-8601 dates compare correctly); an attribute of another kind does not match.
- `in`: the value is a list; the attribute (a string, number or boolean) equals one of it.
- `contains`: the attribute is a list that has the value as an element.
- A missing attribute matches no filter, `ne` included. NaN matches nothing but `ne`.

Exceptions: ValueError └── BadFilter, raised by `parse_filters` / `Filter.parse` with a
sentence naming the problem (the router answers it with ERROR `malformed`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Final, Literal, TypeAlias, cast, get_args

FilterOp = Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "contains"]
OPS: Final[tuple[str, ...]] = get_args(FilterOp)
Scalar: TypeAlias = str | int | float | bool
_ORDERED: Final = ("lt", "le", "gt", "ge")
COUNT_BUDGET: Final = 4_096
"""Docs `Plan.count` tests one by one at most (about a millisecond); past it, it does not count."""
READ_BUDGET: Final = 32_768
"""Doc ids one search reads from the indexes into sets, or intersects, at most (set operations
in C, a few milliseconds): a restriction wider than what is left is tested per doc instead,
and a count that would pass it is not made. A page must not cost the registry's size."""
_FIELDS: Final = frozenset(("attribute", "op", "value"))


class BadFilter(ValueError):
    """A filter that cannot be used; the text names the problem."""


def kind(value: object) -> str | None:
    """ "b" boolean, "n" number, "s" string, "l" list, None for anything else."""
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int | float):
        return "n"
    if isinstance(value, str):
        return "s"
    return "l" if isinstance(value, list | tuple) else None


def _same(have: object, want: Scalar) -> bool:
    return kind(have) == kind(want) and have == want


@dataclass(frozen=True, slots=True)
class Filter:
    """One constraint on one attribute. Build with `Filter.parse` (or `parse_filters`)."""

    attribute: str
    op: FilterOp
    value: Scalar | tuple[Scalar, ...]
    """A tuple for `in`, a scalar otherwise."""
    test: Callable[[Mapping[str, Any]], bool] = field(init=False, repr=False, compare=False)
    """`matches`, compiled for this op and value: what searches call once per capability."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "test", _compile(self.attribute, self.op, self.value))

    @classmethod
    def parse(cls, raw: object, where: str = "filter") -> Filter:
        """A `Filter` from its JSON object; `BadFilter` naming the problem otherwise."""
        if not isinstance(raw, dict):
            raise BadFilter(f"{where} must be an object {{attribute, op, value}}")
        unknown = sorted(str(k) for k in raw.keys() - _FIELDS)
        if unknown:
            raise BadFilter(
                f"{where} has unknown field {unknown[0]!r} (fields: attribute, op, value)"
            )
        attribute = raw.get("attribute")
        if not isinstance(attribute, str) or not attribute:
            raise BadFilter(f"{where} needs a non-empty string 'attribute'")
        op = raw.get("op", "eq")
        if op not in OPS:
            raise BadFilter(f"{where} has unknown op {op!r} (one of {', '.join(OPS)})")
        if "value" not in raw:
            raise BadFilter(f"{where} needs a 'value'")
        value = raw["value"]
        if op == "in":
            if not isinstance(value, list):
                raise BadFilter(f"{where}: 'in' needs a list value")
            for item in value:
                _check_scalar(item, f"{where}: every 'in' value")
            return cls(attribute, "in", tuple(value))
        _check_scalar(value, f"{where}: {op!r}")
        if op in _ORDERED and kind(value) not in ("n", "s"):
            raise BadFilter(f"{where}: {op!r} needs a number or a string")
        return cls(attribute, cast(FilterOp, op), value)

    def serialize(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"attribute": self.attribute, "op": self.op, "value": value}

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        """Whether a capability with these attributes passes (the rules in the module doc)."""
        if self.attribute not in attributes:
            return False
        have, want, op = attributes[self.attribute], self.value, self.op
        if isinstance(want, tuple):
            return any(_same(have, w) for w in want)
        if op == "eq":
            return _same(have, want)
        if op == "ne":
            return not _same(have, want)
        if op == "contains":
            return kind(have) == "l" and any(_same(item, want) for item in have)
        if kind(have) != kind(want) or have != have:  # NaN is unordered
            return False
        if op == "lt":
            return bool(have < want)
        if op == "le":
            return bool(have <= want)
        if op == "gt":
            return bool(have > want)
        return bool(have >= want)


_NUMBERS: Final = frozenset((int, float))
_LISTS: Final = frozenset((list, tuple))


def _compile(
    name: str, op: FilterOp, want: Scalar | tuple[Scalar, ...]
) -> Callable[[Mapping[str, Any]], bool]:
    """`Filter.matches` for one filter, with the kind checks decided once (from `want`) and
    one call per capability: a search may test thousands. Attribute values are JSON values,
    of exactly these types (a missing one reads as None, of none of them)."""
    if isinstance(want, tuple) or op == "contains":
        sames = [_sameness(w) for w in (want if isinstance(want, tuple) else (want,))]
        if op == "contains":

            def contains(attributes: Mapping[str, Any]) -> bool:
                have: Any = attributes.get(name)
                return type(have) in _LISTS and any(same(i) for i in have for same in sames)

            return contains
        return lambda attributes: any(same(attributes.get(name)) for same in sames)
    same = _sameness(want)
    if op == "eq":
        return lambda attributes: same(attributes.get(name))
    if op == "ne":
        return lambda attributes: name in attributes and not same(attributes[name])
    kinds = frozenset((str,)) if isinstance(want, str) else _NUMBERS
    bound: Any = want
    # Ordered: a value of another kind never matches; NaN compares false whatever the op.
    if op == "lt":
        return lambda attributes: type(have := attributes.get(name)) in kinds and have < bound
    if op == "le":
        return lambda attributes: type(have := attributes.get(name)) in kinds and have <= bound
    if op == "gt":
        return lambda attributes: type(have := attributes.get(name)) in kinds and have > bound
    return lambda attributes: type(have := attributes.get(name)) in kinds and have >= bound


def _sameness(want: Scalar) -> Callable[[Any], bool]:
    """`_same(have, want)` as a test of `have`."""
    if isinstance(want, bool):
        return lambda have: have is want
    if isinstance(want, str):
        return lambda have: type(have) is str and have == want
    return lambda have: type(have) in _NUMBERS and have == want


def _check_scalar(value: object, what: str) -> None:
    if kind(value) not in ("b", "n", "s"):
        raise BadFilter(f"{what} must be a string, number or boolean, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadFilter(f"{what} must be a finite number")


def parse_filters(raw: object) -> list[Filter]:
    """Filters from JSON: null or a list of {"attribute", "op", "value"} objects.

    Raises `BadFilter` naming the first problem (`filters[1] has unknown op 'like' ...`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadFilter("'filters' must be a list of {attribute, op, value} objects")
    return [Filter.parse(item, f"filters[{n}]") for n, item in enumerate(raw)]


class SortedColumn:
    """(value, doc id) pairs in ascending order, kept in blocks of at most 2 * `LOAD` (parallel
    lists of values and ids), so an insert or delete moves at most one block, not the column."""

    LOAD: Final = 512

    def __init__(self) -> None:
        self._values: list[list[Any]] = []
        self._ids: list[list[int]] = []
        self._lasts: list[tuple[Any, int]] = []
        """Each block's last (value, id): which block a pair belongs to, by bisection."""
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        """The doc ids, in order."""
        return chain.from_iterable(self._ids)

    def add(self, value: Any, doc: int) -> None:
        if not self._ids:
            self._values.append([value])
            self._ids.append([doc])
            self._lasts.append((value, doc))
            self._len = 1
            return
        block = min(bisect_left(self._lasts, (value, doc)), len(self._ids) - 1)
        values, ids = self._values[block], self._ids[block]
        at = _position(values, ids, value, doc)
        values.insert(at, value)
        ids.insert(at, doc)
        self._len += 1
        if at == len(ids) - 1:
            self._lasts[block] = (value, doc)
        if len(ids) > 2 * self.LOAD:
            half = self.LOAD
            self._values[block : block + 1] = [values[:half], values[half:]]
            self._ids[block : block + 1] = [ids[:half], ids[half:]]
            self._lasts[block : block + 1] = [(values[half - 1], ids[half - 1]), self._lasts[block]]

    def discard(self, value: Any, doc: int) -> None:
        block = bisect_left(self._lasts, (value, doc))
        if block == len(self._ids):
            return
        values, ids = self._values[block], self._ids[block]
        at = _position(values, ids, value, doc)
        if at == len(ids) or ids[at] != doc or values[at] != value:
            return
        del values[at], ids[at]
        self._len -= 1
        if not ids:
            del self._values[block], self._ids[block], self._lasts[block]
        elif at == len(ids):
            self._lasts[block] = (values[-1], ids[-1])

    def spans(
        self, low: Any, high: Any, *, low_open: bool = False, high_open: bool = False
    ) -> Iterator[tuple[list[int], int, int]]:
        """(ids, start, stop) per block: the ids[start:stop] whose values lie between `low` and
        `high` (None: unbounded), in order."""
        if low is None:
            block = 0
        elif low_open:
            block = bisect_right(self._lasts, (low, math.inf))
        else:
            block = bisect_left(self._lasts, (low,))
        for values, ids in zip(self._values[block:], self._ids[block:], strict=True):
            start = 0
            if low is not None:
                start = (bisect_right if low_open else bisect_left)(values, low)
            stop = len(values)
            if high is not None:
                stop = (bisect_left if high_open else bisect_right)(values, high, start)
            if stop > start:
                yield ids, start, stop
            if stop < len(values):
                return


def _position(values: list[Any], ids: list[int], value: Any, doc: int) -> int:
    """Where (value, doc) is or would go in a block."""
    low = bisect_left(values, value)
    return bisect_left(ids, doc, low, bisect_right(values, value, low))


@dataclass(slots=True)
class Plan:
    """One search's restrictions: doc ids in `allowed` (None: all), not in `excluded`, whose
    attributes pass the `checks` (filters cheaper to test per doc than to read from the index)
    and that pass the `tests` (restrictions too wide to read within `READ_BUDGET`)."""

    allowed: AbstractSet[int] | None
    excluded: AbstractSet[int]
    checks: list[Filter]
    attributes: Callable[[int], Mapping[str, Any]]
    tests: list[Callable[[int], bool]] = field(default_factory=list)

    @property
    def everything(self) -> bool:
        return self.allowed is None and not self.excluded and not self.per_doc

    @property
    def per_doc(self) -> bool:
        """Whether some restriction is only known by testing each doc."""
        return bool(self.checks or self.tests)

    def admits(self, doc: int) -> bool:
        if (self.allowed is not None and doc not in self.allowed) or doc in self.excluded:
            return False
        if self.tests and not all(test(doc) for test in self.tests):
            return False
        if self.checks:
            attributes = self.attributes(doc)
            return all(f.test(attributes) for f in self.checks)
        return True

    def count(self, docs: AbstractSet[int]) -> int | None:
        """How many of `docs` pass, with set operations where the index answers; None when
        that would read more than `READ_BUDGET` ids or test more than `COUNT_BUDGET` docs."""
        if self.allowed is not None and docs is not self.allowed:
            if min(len(docs), len(self.allowed)) > READ_BUDGET:
                return None
            docs = docs & self.allowed
        if self.per_doc:
            if len(docs) > COUNT_BUDGET:
                return None
            return sum(1 for doc in docs if self.admits(doc))
        return len(docs) - sum(1 for doc in self.excluded if doc in docs)


class AttributeIndex:
    """Sorted value columns per (attribute, kind) and the set of docs having each attribute.

    `add` / `discard` cost O(log n) comparisons plus a list insert (a memmove of the column);
    `size` is O(log n); `members` is O(log n + matches). List attributes are indexed by element,
    under kind "e" + the element's kind. NaN is not indexed (it is unordered)."""

    def __init__(self) -> None:
        self._present: dict[str, set[int]] = {}
        self._columns: dict[tuple[str, str], SortedColumn] = {}

    def add(self, doc: int, attributes: Mapping[str, Any]) -> None:
        for name, value in attributes.items():
            self._present.setdefault(name, set()).add(doc)
            for column_kind, item in _entries(value):
                self._columns.setdefault((name, column_kind), SortedColumn()).add(item, doc)

    def discard(self, doc: int, attributes: Mapping[str, Any]) -> None:
        for name, value in attributes.items():
            present = self._present.get(name)
            if present is not None:
                present.discard(doc)
                if not present:
                    del self._present[name]
            for column_kind, item in _entries(value):
                column = self._columns.get((name, column_kind))
                if column is not None:
                    column.discard(item, doc)
                    if not column:
                        del self._columns[(name, column_kind)]

    def size(self, f: Filter) -> int:
        """How many docs `f` admits, exactly."""
        if f.op == "ne":
            return len(self._present.get(f.attribute, ())) - self.size(_eq(f))
        return sum(stop - start for _, start, stop in self._spans(f))

    def members(self, f: Filter, within: set[int] | None = None) -> set[int]:
        """The docs `f` admits (of those `within`, when given: cheaper than intersecting)."""
        if f.op == "ne":
            present = self._present.get(f.attribute, set())
            if within is not None:
                present = present & within
            return present - self.members(_eq(f), within)
        found: set[int] = set()
        for ids, start, stop in self._spans(f):
            if within is None:
                found.update(ids[start:stop])
            else:
                found.update(within.intersection(ids[start:stop]))
        return found

    def _spans(self, f: Filter) -> Iterator[tuple[list[int], int, int]]:
        """The (ids, start, stop) runs of docs `f` admits (any op but `ne`)."""
        wanted = f.value if isinstance(f.value, tuple) else (f.value,)
        for value_kind, value in dict.fromkeys((kind(v) or "", v) for v in wanted):
            column_kind = ("e" if f.op == "contains" else "") + value_kind
            column = self._columns.get((f.attribute, column_kind))
            if column is None:
                continue
            if f.op in ("eq", "in", "contains"):
                yield from column.spans(value, value)
            elif f.op in ("lt", "le"):
                yield from column.spans(None, value, high_open=f.op == "lt")
            else:
                yield from column.spans(value, None, low_open=f.op == "gt")


def _eq(f: Filter) -> Filter:
    return Filter(f.attribute, "eq", f.value)


def _entries(value: object) -> list[tuple[str, Any]]:
    """The (column kind, value) pairs an attribute value is indexed under."""
    value_kind = kind(value)
    if value_kind == "l":
        items = dict.fromkeys((kind(item), item) for item in cast(list[Any], value))
        return [("e" + k, item) for k, item in items if k and _indexable(k, item)]
    if value_kind and _indexable(value_kind, value):
        return [(value_kind, value)]
    return []


def _indexable(value_kind: str, value: object) -> bool:
    return value_kind in ("b", "s") or (value_kind == "n" and value == value)  # not NaN


__all__ = [
    "COUNT_BUDGET",
    "OPS",
    "READ_BUDGET",
    "AttributeIndex",
    "BadFilter",
    "Filter",
    "FilterOp",
    "Plan",
    "SortedColumn",
    "kind",
    "parse_filters",
]
