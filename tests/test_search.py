"""Ranked search: the index on fixed corpora, filters, paging, incremental updates, a 10k build
checked against a brute-force BM25, and DISCOVER_SERVICES through the Router."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest

from lobby.core.discovery import filters as filters_module
from lobby.core.discovery import ranking, search
from lobby.core.discovery.filters import BadFilter, Filter, SortedColumn, parse_filters
from lobby.core.discovery.ranking import COMMON, K1, B
from lobby.core.discovery.search import Algorithm, SearchIndex, SearchPage, tokens
from tests.routerkit import join, make_router

Row = tuple[str, str, str, list[str], dict[str, Any]]

CORPUS: list[Row] = [
    (
        "mario",
        "order_pizza",
        "Wood-fired pizza delivered hot",
        ["pizza", "italian"],
        {"city": "rome", "price": 12, "tags": ["vegan", "fast"], "open": True},
    ),
    (
        "luigi",
        "order_pasta",
        "Fresh pasta and pizza slices",
        ["pasta", "italian"],
        {"city": "rome", "price": 9, "tags": ["fast"], "open": False},
    ),
    (
        "sakura",
        "order_sushi",
        "Sushi and sashimi platters",
        ["sushi", "japanese"],
        {"city": "tokyo", "price": 30.5, "since": "2019-04-01"},
    ),
    (
        "bolt",
        "deliverFoodFast",
        "Courier for any restaurant order",
        ["delivery"],
        {"city": "rome", "price": 5, "since": "2021-11-30"},
    ),
]


def index(rows: list[Row] = CORPUS) -> SearchIndex:
    built = SearchIndex()
    for agent_id, name, description, keywords, attributes in rows:
        built.add(agent_id, name, description, keywords, attributes)
    return built


def agents(page: SearchPage) -> list[str]:
    return [hit.agent_id for hit in page.hits]


def keys(page: SearchPage) -> list[tuple[str, str]]:
    return [(hit.agent_id, hit.name) for hit in page.hits]


def lexical(built: SearchIndex, query: str, **options: Any) -> SearchPage:
    return built.search(query=query, algorithm="lexical", **options)


def filtered(built: SearchIndex, *raw: dict[str, Any], **options: Any) -> SearchPage:
    return built.search(
        query=None, algorithm="filtered", filters=parse_filters(list(raw)), **options
    )


def test_public_names() -> None:
    assert set(search.__all__) == {
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
    }
    assert issubclass(BadFilter, ValueError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("find_cheapest_item_price_v2", ["find", "cheapest", "item", "price", "v2"]),
        ("findCheapestPrice", ["find", "cheapest", "price"]),
        ("HTTPServer.getURL", ["http", "server", "get", "url"]),
        ("price-hunter.A2", ["price", "hunter", "a2"]),
        ("Hello, world! (pizza/pasta) & co.", ["hello", "world", "pizza", "pasta", "co"]),
        ("Café  Straße 42", ["café", "straße", "42"]),
        ("?!", []),
    ],
)
def test_tokens(text: str, expected: list[str]) -> None:
    assert tokens(text) == expected


def test_lexical_ranks_by_bm25_with_field_weights() -> None:
    page = lexical(index(), "pizza")
    # mario: name (x2) + keyword (x2) + description; luigi: description only.
    assert agents(page) == ["mario", "luigi"]
    assert page.hits[0].score > page.hits[1].score > 0
    assert page.total == 2
    assert agents(lexical(index(), "deliver food"))[0] == "bolt"  # camelCase name
    assert lexical(index(), "tacos") == SearchPage([], 0)
    assert lexical(index(), "?!") == SearchPage([], 0)  # text without a word finds nothing


def test_lexical_score_is_okapi_bm25() -> None:
    built = index()
    # "sushi": only in sakura, tf 2 (name) + 2 (keyword) + 1 (description) = 5.
    lengths = {row[1]: sum(_terms(row).values()) for row in CORPUS}
    average = sum(lengths.values()) / 4
    idf = math.log(1 + (4 - 1 + 0.5) / (1 + 0.5))
    norm = K1 * (1 - B + B * lengths["order_sushi"] / average)
    expected = idf * 5 * (K1 + 1) / (5 + norm)
    assert lexical(built, "sushi").hits[0].score == pytest.approx(expected, rel=1e-12)


def test_lexical_multiword_sums_tokens() -> None:
    page = lexical(index(), "pizza pasta sushi")
    assert agents(page) == ["luigi", "sakura", "mario"]
    assert page.total == 3
    scores = [hit.score for hit in page.hits]
    assert scores == sorted(scores, reverse=True)


def test_common_tokens_only_rerank_rarer_ones() -> None:
    rows: list[Row] = [(f"a{n}", f"cap{n}", "order food", [], {}) for n in range(6)]
    rows.append(("z", "noodles", "noodles order", [], {}))
    rows.append(("y", "ramen", "ramen noodles", [], {}))
    built = index(rows)
    assert len(built) == 8
    # "order" is in 7 of 8: with "noodles" it only adds to the capabilities noodles found.
    page = lexical(built, "noodles order")
    assert agents(page) == ["z", "y"]
    assert page.total == 2
    # Alone, a common token is all there is: it matches.
    assert lexical(built, "order").total == 7


def test_simple_scores_substring_matches() -> None:
    page = index().search(query="PIZZA", algorithm="simple")
    assert [(h.agent_id, h.score) for h in page.hits] == [("mario", 6.0), ("luigi", 1.0)]
    page = index().search(query="order", algorithm="simple")
    # bolt: "order" in its description only; the others in their names.
    assert [(h.agent_id, h.score) for h in page.hits] == [
        ("luigi", 3.0),
        ("mario", 3.0),
        ("sakura", 3.0),
        ("bolt", 1.0),
    ]
    assert index().search(query="ital", algorithm="simple").hits[0].score == 2.0


def test_no_query_text_matches_everything_unranked() -> None:
    for algorithm in ("simple", "lexical"):
        page = index().search(query="  ", algorithm=algorithm)
        assert agents(page) == ["bolt", "luigi", "mario", "sakura"]
        assert {hit.score for hit in page.hits} == {0.0}


def test_filtered_scores_one_and_orders_by_agent_then_name() -> None:
    page = filtered(index(), {"attribute": "city", "value": "rome"})
    assert agents(page) == ["bolt", "luigi", "mario"]
    assert {hit.score for hit in page.hits} == {1.0}
    # `filtered` ignores the query text.
    assert agents(index().search(query="sushi", algorithm="filtered")) == agents(
        index().search(query=None, algorithm="filtered")
    )


def test_ties_break_by_agent_then_name_whatever_the_insertion_order() -> None:
    rows: list[Row] = [
        (agent, name, "same words here", ["same"], {})
        for agent in ("b", "a", "c")
        for name in ("y", "x")
    ]
    expected = [(a, n) for a in ("a", "b", "c") for n in ("x", "y")]
    for seed in range(3):
        random.Random(seed).shuffle(rows)
        built = index(rows)
        for algorithm in ("simple", "filtered", "lexical"):
            page = built.search(query="same", algorithm=algorithm)
            assert keys(page) == expected
            assert len({hit.score for hit in page.hits}) == 1


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"attribute": "price", "op": "lt", "value": 10}, ["bolt", "luigi"]),
        ({"attribute": "price", "op": "le", "value": 9}, ["bolt", "luigi"]),
        ({"attribute": "price", "op": "gt", "value": 12}, ["sakura"]),
        ({"attribute": "price", "op": "ge", "value": 12.0}, ["mario", "sakura"]),
        ({"attribute": "price", "op": "eq", "value": 12.0}, ["mario"]),  # 12 == 12.0
        ({"attribute": "price", "value": 30.5}, ["sakura"]),  # op defaults to eq
        ({"attribute": "city", "op": "ne", "value": "rome"}, ["sakura"]),
        ({"attribute": "city", "op": "in", "value": ["tokyo", "paris"]}, ["sakura"]),
        ({"attribute": "city", "op": "in", "value": []}, []),
        ({"attribute": "tags", "op": "contains", "value": "vegan"}, ["mario"]),
        ({"attribute": "tags", "op": "contains", "value": "fast"}, ["luigi", "mario"]),
        ({"attribute": "open", "value": True}, ["mario"]),
        ({"attribute": "open", "value": 1}, []),  # a boolean is not a number
        ({"attribute": "price", "value": "12"}, []),  # nor is a string
        ({"attribute": "since", "op": "lt", "value": "2020-01-01"}, ["sakura"]),  # ISO dates
        ({"attribute": "city", "op": "gt", "value": 3}, []),  # strings have no numeric order
        ({"attribute": "tags", "value": "fast"}, []),  # a list equals no string: use contains
    ],
)
def test_each_filter_op(spec: dict[str, Any], expected: list[str]) -> None:
    page = filtered(index(), spec)
    assert agents(page) == expected
    assert page.total == len(expected)
    # The index answers as the filter's own rule does.
    f = parse_filters([spec])[0]
    assert sorted(agents(page)) == sorted(row[0] for row in CORPUS if f.matches(row[4]))


@pytest.mark.parametrize("op", filters_module.OPS)
def test_a_missing_attribute_matches_no_filter(op: str) -> None:
    value: object = ["x"] if op == "in" else "x"
    page = filtered(index(), {"attribute": "stars", "op": op, "value": value})
    assert page == SearchPage([], 0)


def test_several_filters_all_hold() -> None:
    page = filtered(
        index(),
        {"attribute": "city", "value": "rome"},
        {"attribute": "price", "op": "ge", "value": 9},
        {"attribute": "tags", "op": "contains", "value": "fast"},
    )
    assert agents(page) == ["luigi", "mario"]


def test_lexical_combined_with_filters() -> None:
    cheap = {"attribute": "price", "op": "lt", "value": 10}
    page = index().search(query="pizza", algorithm="lexical", filters=parse_filters([cheap]))
    assert agents(page) == ["luigi"]
    assert page.total == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("price<10", "'filters' must be a list"),
        ([["price", "lt", 10]], "filters[0] must be an object"),
        ([{"op": "eq", "value": 1}], "filters[0] needs a non-empty string 'attribute'"),
        ([{"attribute": "", "value": 1}], "needs a non-empty string 'attribute'"),
        ([{"attribute": "a", "op": "like", "value": 1}], "unknown op 'like'"),
        ([{"attribute": "a", "op": "eq"}], "needs a 'value'"),
        ([{"attribute": "a", "value": 1, "operator": "lt"}], "unknown field 'operator'"),
        ([{"attribute": "a", "op": "in", "value": 1}], "'in' needs a list value"),
        ([{"attribute": "a", "op": "in", "value": [[1]]}], "every 'in' value must be"),
        ([{"attribute": "a", "op": "lt", "value": True}], "'lt' needs a number or a string"),
        ([{"attribute": "a", "value": None}], "must be a string, number or boolean"),
        ([{"attribute": "a", "value": {"x": 1}}], "must be a string, number or boolean"),
        ([{"attribute": "a", "op": "ge", "value": math.nan}], "must be a finite number"),
        ([{"attribute": "a", "value": 1}, {"attribute": 7, "value": 1}], "filters[1]"),
    ],
)
def test_bad_filters_are_named(raw: object, message: str) -> None:
    with pytest.raises(BadFilter) as caught:
        parse_filters(raw)
    assert message in str(caught.value)


def test_filters_parse_and_serialize() -> None:
    assert parse_filters(None) == []
    parsed = parse_filters([{"attribute": "city", "op": "in", "value": ["rome", "oslo"]}])
    assert parsed == [Filter("city", "in", ("rome", "oslo"))]
    assert parsed[0].serialize() == {"attribute": "city", "op": "in", "value": ["rome", "oslo"]}
    assert parse_filters([parsed[0].serialize()]) == parsed


def test_paging_limit_offset_total() -> None:
    built = index()
    first = built.search(query=None, algorithm="filtered", limit=3)
    second = built.search(query=None, algorithm="filtered", limit=3, offset=3)
    assert first.total == second.total == 4
    assert agents(first) + agents(second) == ["bolt", "luigi", "mario", "sakura"]
    assert built.search(query=None, algorithm="filtered", offset=9) == SearchPage([], 4)
    assert built.search(query=None, algorithm="filtered", limit=0) == SearchPage([], 4)
    page = lexical(built, "pizza sushi", limit=1, offset=1)
    assert keys(page) == keys(lexical(built, "pizza sushi"))[1:2]
    assert page.total == 3
    with pytest.raises(ValueError, match="negative"):
        built.search(query=None, algorithm="filtered", offset=-1)
    with pytest.raises(ValueError, match="unknown search algorithm"):
        built.search(query=None, algorithm="fuzzy")  # type: ignore[arg-type]


def test_exclude_agent() -> None:
    built = index()
    assert agents(lexical(built, "pizza", exclude_agent="mario")) == ["luigi"]
    assert lexical(built, "pizza", exclude_agent="mario").total == 1
    page = built.search(query=None, algorithm="filtered", exclude_agent="bolt")
    assert agents(page) == ["luigi", "mario", "sakura"]
    assert page.total == 3
    assert built.search(query="order", algorithm="simple", exclude_agent="luigi").total == 3


@pytest.mark.parametrize("algorithm", ["simple", "filtered", "lexical"])
def test_capability_name_and_keywords_restrict_any_algorithm(algorithm: Algorithm) -> None:
    built = index()
    by_name = built.search(query="order", algorithm=algorithm, capability_name="order_pasta")
    assert keys(by_name) == [("luigi", "order_pasta")]
    by_keyword = built.search(query="order", algorithm=algorithm, keywords=["ITALIAN", "nope"])
    assert sorted(agents(by_keyword)) == ["luigi", "mario"]
    both = built.search(
        query="order", algorithm=algorithm, capability_name="order_pizza", keywords=["sushi"]
    )
    assert both == SearchPage([], 0)


def test_incremental_add_remove_update() -> None:
    built = index()
    built.remove("mario", "order_pizza")
    built.remove("mario", "order_pizza")  # removing twice is harmless
    assert "mario" not in agents(lexical(built, "pizza"))
    for algorithm in ("simple", "filtered", "lexical"):
        page = built.search(query="pizza", algorithm=algorithm)
        assert ("mario", "order_pizza") not in keys(page)
    assert filtered(built, {"attribute": "tags", "op": "contains", "value": "vegan"}).total == 0
    # Re-added with another description and attributes: searched as it is now.
    built.add("mario", "order_pizza", "pizza pizza pizza", ["pizza"], {"price": 99})
    assert agents(lexical(built, "pizza")) == ["mario", "luigi"]
    assert filtered(built, {"attribute": "price", "op": "gt", "value": 50}).total == 1
    assert filtered(built, {"attribute": "city", "value": "rome"}).total == 2
    # An update re-ranks: luigi no longer mentions pizza.
    built.add("luigi", "order_pasta", "pasta only", ["pasta"], {})
    assert agents(lexical(built, "pizza")) == ["mario"]
    assert len(built) == 4
    built.remove_agent("mario")
    assert lexical(built, "pizza") == SearchPage([], 0)
    assert ("mario", "order_pizza") not in built
    assert len(built) == 3


def test_churn_matches_a_fresh_index() -> None:
    rng = random.Random(11)
    live: dict[tuple[str, str], Row] = {}
    built = SearchIndex()
    words = ["pizza", "pasta", "sushi", "fast", "cheap", "vegan", "rome", "tokyo"]
    for _ in range(3000):
        agent, name = f"a{rng.randrange(40)}", rng.choice(["buy", "sell", "deliverFast"])
        if rng.random() < 0.3 and (agent, name) in live:
            built.remove(agent, name)
            del live[(agent, name)]
            continue
        row = (agent, name, " ".join(rng.choices(words, k=4)), rng.sample(words, 2),
               {"price": rng.randrange(20), "tags": rng.sample(words, 2)})  # fmt: skip
        built.add(*row)
        live[(agent, name)] = row
    fresh = index(list(live.values()))
    for query in ("pizza", "fast sushi", "cheap vegan rome", "deliver"):
        for algorithm in ("simple", "lexical"):
            options: dict[str, Any] = {"query": query, "algorithm": algorithm, "limit": 20}
            assert built.search(**options) == fresh.search(**options)
    cheap = {"attribute": "price", "op": "lt", "value": 5}
    assert filtered(built, cheap, limit=500) == filtered(fresh, cheap, limit=500)


def test_sorted_column_in_small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SortedColumn, "LOAD", 2)
    rng = random.Random(3)
    column, pairs = SortedColumn(), set()
    for _ in range(2000):
        pair = (rng.randrange(30), rng.randrange(50))
        if pair in pairs and rng.random() < 0.5:
            column.discard(*pair)
            pairs.discard(pair)
        elif pair not in pairs:
            column.add(*pair)
            pairs.add(pair)
    assert len(column) == len(pairs)
    assert list(column) == [doc for _, doc in sorted(pairs)]
    inside = [doc for value, doc in sorted(pairs) if 10 < value <= 20]
    runs = column.spans(10, 20, low_open=True)
    assert [doc for ids, start, stop in runs for doc in ids[start:stop]] == inside


# A brute-force BM25 over the same tokens, to check the index's exact results.


def _terms(row: Row) -> Counter[str]:
    _, name, description, keywords, _ = row
    found = Counter(tokens(name) * 2)
    for keyword in keywords:
        found.update(tokens(keyword) * 2)
    found.update(tokens(description))
    return found


def brute_lexical(rows: list[Row], query: str, limit: int) -> tuple[list[tuple[str, str]], int]:
    terms = {(row[0], row[1]): _terms(row) for row in rows}
    count = len(rows)
    average = sum(t.total() for t in terms.values()) / count
    words = sorted({w for w in tokens(query) if any(w in t for t in terms.values())})
    df = {w: sum(w in t for t in terms.values()) for w in words}
    rare = [w for w in words if df[w] <= COMMON * count]
    drivers = rare or words
    order = drivers + [w for w in words if w not in drivers]
    scored = []
    for key, found in terms.items():
        if not any(w in found for w in drivers):
            continue
        score, norm = 0.0, K1 * (1 - B + B * found.total() / average)
        for word in order:
            if found[word]:
                idf = math.log(1 + (count - df[word] + 0.5) / (df[word] + 0.5))
                score += idf * found[word] * (K1 + 1) / (found[word] + norm)
        scored.append((-score, key))
    scored.sort()
    return [key for _, key in scored[:limit]], len(scored)


def corpus(size: int, seed: int) -> list[Row]:
    rng = random.Random(seed)
    vocabulary = [f"w{n}" for n in range(300)]
    weights = [1 / (rank + 1) for rank in range(300)]  # Zipf-like: some words are common
    cities = ["rome", "oslo", "lima", "tokyo"]
    rows: list[Row] = []
    for n in range(size):
        words = rng.choices(vocabulary, weights, k=rng.randint(3, 12))
        rows.append(
            (
                f"agent{rng.randrange(size // 3):05d}",
                f"{rng.choice(vocabulary)}_skill_{n}",
                " ".join(words),
                rng.choices(vocabulary, weights, k=2),
                {"city": rng.choice(cities), "price": rng.randrange(100)},
            )
        )
    return rows


@pytest.mark.parametrize("path", ["default", "threshold", "overlap"])
def test_lexical_strategies_agree_with_brute_force(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "threshold":  # the threshold algorithm, never giving up
        monkeypatch.setattr(ranking, "_MULTI", 0)
        monkeypatch.setattr(ranking, "_PAIR_WORK", 0)
        threshold = ranking.Ranking._threshold

        def patient(self: ranking.Ranking, scorer: Any, plan: Any, want: int, budget: int) -> Any:
            return threshold(self, scorer, plan, want, budget=10**9)

        monkeypatch.setattr(ranking.Ranking, "_threshold", patient)
    elif path == "overlap":
        monkeypatch.setattr(ranking, "_MULTI", 10**9)
        monkeypatch.setattr(ranking, "_PAIR_WORK", 10**9)
    rows = corpus(800, seed=2)
    rows += [(f"twin{n % 7}", f"twin{n}", "w0 w1 w2", ["w3"], {}) for n in range(60)]  # ties
    built = index(rows)
    rng = random.Random(9)
    for _ in range(40):
        query = " ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(1, 3)))
        limit = rng.choice([1, 5, 20])
        expected, total = brute_lexical(rows, query, limit)
        page = lexical(built, query, limit=limit)
        assert keys(page) == expected, query
        assert page.total == total, query


def test_ten_thousand_capabilities_stay_correct() -> None:
    rows = corpus(10_000, seed=1)
    built = index(rows)
    assert len(built) == 10_000
    for query in ("w0", "w3 w17", "w1 w5 w42", "w120 w0", "skill w2"):
        expected, total = brute_lexical(rows, query, 10)
        page = lexical(built, query, limit=10)
        assert keys(page) == expected
        assert page.total == total
        scores = [hit.score for hit in page.hits]
        assert scores == sorted(scores, reverse=True)
    name = rows[777][1]
    assert keys(built.search(query=None, algorithm="filtered", capability_name=name)) == [
        (rows[777][0], name)
    ]
    w7 = sorted((r[0], r[1]) for r in rows if "w7" in r[3])
    page = built.search(query=None, algorithm="filtered", keywords=["W7"], limit=5)
    assert keys(page) == w7[:5]
    assert page.total == len(w7)
    spec: list[dict[str, Any]] = [
        {"attribute": "city", "value": "oslo"},
        {"attribute": "price", "op": "lt", "value": 7},
    ]
    wanted = sorted((r[0], r[1]) for r in rows if r[4]["city"] == "oslo" and r[4]["price"] < 7)
    page = filtered(built, *spec, limit=1000)
    assert keys(page) == wanted
    page = lexical(built, "w1", filters=parse_filters(spec), limit=1000)
    assert sorted(keys(page)) == sorted(k for k in wanted if "w1" in _terms(_row(rows, k)))


def _row(rows: list[Row], key: tuple[str, str]) -> Row:
    return next(row for row in rows if (row[0], row[1]) == key)


def test_discover_services_ranked_through_the_router() -> None:
    router = make_router()
    for agent_id, name, description, keywords, attributes in CORPUS:
        cap = {
            "name": name,
            "description": description,
            "keywords": keywords,
            "attributes": attributes,
        }
        join(router, agent_id, capabilities=[cap])
    customer = join(router, "customer")
    customer.send("DISCOVER_SERVICES", {"query": "pizza", "algorithm": "lexical"})
    reply = customer.last()["payload"]
    assert [s["agent_id"] for s in reply["services_found"]] == ["mario", "luigi"]
    assert reply["total"] == 2
    assert reply["services_found"][0]["relevant_capabilities"][0]["score"] > 0
    customer.send(
        "DISCOVER_SERVICES",
        {"algorithm": "filtered", "filters": [{"attribute": "city", "value": "tokyo"}]},
    )
    assert [s["agent_id"] for s in customer.last()["payload"]["services_found"]] == ["sakura"]
    customer.send("DISCOVER_SERVICES", {"algorithm": "filtered", "filters": "bad"})
    error = customer.last()
    assert error["payload"]["code"] == "malformed"
    # Without ranked-search fields, discovery is exactly the seed's.
    customer.send("DISCOVER_SERVICES", {"capability_name": "order_sushi"})
    plain = customer.last()["payload"]
    assert "total" not in plain
    assert [s["agent_id"] for s in plain["services_found"]] == ["sakura"]


# -- paging and bounded work ------------------------------------------------------------------


def test_compiled_filter_tests_agree_with_matches() -> None:
    """`Filter.test` (what searches call) is `Filter.matches` (the rules) with kinds decided
    once: the same answer for every op and value against every kind of attribute."""
    values: list[Any] = [0, 1, 2, 2.0, 2.5, -1, math.nan, True, False, "", "a", "b", "2"]
    values += [["a", "b"], ["2"], [], [1, 2], None]
    specs: list[dict[str, Any]] = [
        {"attribute": "x", "op": op, "value": value}
        for op in ("eq", "ne", "lt", "le", "gt", "ge", "contains")
        for value in (1, 2, 2.0, "a", "b", True, False)
        if not (op in ("lt", "le", "gt", "ge") and isinstance(value, bool))
    ]
    specs += [{"attribute": "x", "op": "in", "value": [1, "a", True, 2.5]}]
    for spec in specs:
        f = Filter.parse(spec)
        for have in values:
            attributes = {"x": have}
            assert f.test(attributes) == f.matches(attributes), (spec, have)
        assert f.test({}) is False
        assert f.test({"y": 1}) == f.matches({"y": 1})


def test_counting_past_its_budget_gives_up() -> None:
    """A `total` that would read more ids than READ_BUDGET, or test more docs one by one than
    COUNT_BUDGET, is not counted (None); under them it is exact."""
    wide = set(range(filters_module.READ_BUDGET + 10))
    plan = filters_module.Plan(wide, set(), [], lambda doc: {})
    assert plan.count(set(wide)) is None
    assert plan.count(set(range(100))) == 100
    assert plan.count(wide) == len(wide)  # its own members: no intersection to make
    checked = filters_module.Plan(None, set(), [Filter.parse({"attribute": "a", "value": 1})],
                                  lambda doc: {"a": doc % 2})  # fmt: skip
    assert checked.count(set(range(filters_module.COUNT_BUDGET + 1))) is None
    assert checked.count(set(range(10))) == 5


def test_pages_from_positions_join_into_the_one_shot_ranking() -> None:
    rows = corpus(900, seed=5)
    built = index(rows)
    for algorithm, query in (("lexical", "w1 w2"), ("filtered", None), ("lexical", "")):
        whole = built.search(query=query, algorithm=algorithm, limit=1000)  # type: ignore[arg-type]
        joined: list[tuple[str, str]] = []
        page = built.search(query=query, algorithm=algorithm, limit=70)  # type: ignore[arg-type]
        while True:
            joined += keys(page)
            if page.next is None:
                break
            page = built.search(
                query=query,
                algorithm=algorithm,  # type: ignore[arg-type]
                limit=70,
                offset=page.next.rank,
                after=page.next.key,
            )
        assert joined == keys(whole)[:1000], (algorithm, query)
        assert page.total == whole.total


def test_a_shorter_page_goes_on_where_it_stopped() -> None:
    built = index()
    keyed = built.search(query=None, algorithm="filtered", limit=3)
    cut = keyed.cut(1)
    assert keys(cut) == keys(keyed)[:1]
    assert cut.next is not None
    assert cut.next.key == keys(keyed)[0]
    ranked = lexical(built, "pizza pasta sushi", limit=3)
    cut = ranked.cut(2)
    assert cut.next is not None
    assert (cut.next.key, cut.next.rank) == (None, 2)
    assert keyed.cut(10) is keyed


def test_a_lexical_query_of_too_many_words_is_refused() -> None:
    words = " ".join(f"w{n}" for n in range(search.MAX_QUERY_WORDS + 1))
    with pytest.raises(search.BadQuery, match="distinct words"):
        lexical(index(), words)
    assert lexical(index(), " ".join(["pizza"] * 100)).total == 2  # repeats count once


def test_a_ranking_cut_short_says_so_and_still_ranks_what_it_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many docs of near-equal scores: the threshold algorithm cannot settle within its reads,
    so the page is the best it read, marked not exact; with reads to spare it is exact."""
    rng = random.Random(3)
    rows: list[Row] = []
    for n in range(3000):
        words = ["alpha"] * rng.randint(1, 4) + ["beta"] * rng.randint(1, 4)
        words += [f"f{rng.randrange(900)}" for _ in range(rng.randint(1, 12))]
        rows.append((f"a{n // 100:02d}", f"c{n}", " ".join(words), [], {}))
    rows += [(f"z{n}", "other", "gamma", [], {}) for n in range(3000)]  # alpha, beta: rare
    built = index(rows)
    expected, total = brute_lexical(rows, "alpha beta", 20)
    exact = lexical(built, "alpha beta", limit=20)
    assert exact.exact
    assert keys(exact) == expected
    monkeypatch.setattr(ranking, "THRESHOLD_READS", 0)
    monkeypatch.setattr(ranking, "_MULTI", 0)
    cut = lexical(built, "alpha beta", limit=20)
    assert not cut.exact
    assert len(cut.hits) == 20
    scores = [hit.score for hit in cut.hits]
    assert scores == sorted(scores, reverse=True)
    assert set(keys(cut)) <= {(r[0], r[1]) for r in rows[:3000]}
    assert cut.total == total


def test_a_filter_serializes_back_to_the_object_it_was_parsed_from() -> None:
    for raw in (
        {"attribute": "region", "op": "eq", "value": "eu"},
        {"attribute": "price", "op": "lt", "value": 5},
        {"attribute": "region", "op": "in", "value": ["eu", "us"]},
    ):
        assert Filter.parse(raw).serialize() == raw
