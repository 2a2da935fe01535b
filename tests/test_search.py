"""Ranked search: the index alone on a fixed corpus, and DISCOVER_SERVICES through the Router."""

from __future__ import annotations

from typing import Any

import pytest

from lobby.core.search import BadFilter, SearchIndex, parse_filters, tokens
from tests.routerkit import join, make_router

CORPUS: list[tuple[str, str, str, list[str], dict[str, Any]]] = [
    (
        "mario",
        "order_pizza",
        "Wood-fired pizza delivered hot",
        ["pizza", "italian"],
        {"city": "rome", "price": 12, "tags": ["vegan", "fast"]},
    ),
    (
        "luigi",
        "order_pasta",
        "Fresh pasta and pizza slices",
        ["pasta", "italian"],
        {"city": "rome", "price": 9, "tags": ["fast"]},
    ),
    (
        "sakura",
        "order_sushi",
        "Sushi and sashimi platters",
        ["sushi", "japanese"],
        {"city": "tokyo", "price": 30},
    ),
    (
        "bolt",
        "deliverFoodFast",
        "Courier for any restaurant order",
        ["delivery"],
        {"city": "rome", "price": 5},
    ),
]


def index() -> SearchIndex:
    built = SearchIndex()
    for agent_id, name, description, keywords, attributes in CORPUS:
        built.add(agent_id, name, description, keywords, attributes)
    return built


def ranked(page: Any) -> list[str]:
    return [hit.agent_id for hit in page.hits]


def test_tokens_split_names() -> None:
    assert tokens("findCheapestPrice_v2.x-y") == ["find", "cheapest", "price", "v2", "x", "y"]


def test_lexical_ranks_by_bm25() -> None:
    page = index().search(query="pizza", algorithm="lexical")
    assert ranked(page) == ["mario", "luigi"]  # name + keyword + description beat description
    assert page.hits[0].score > page.hits[1].score > 0
    assert ranked(index().search(query="deliver food", algorithm="lexical"))[0] == "bolt"
    assert index().search(query="tacos", algorithm="lexical").hits == []


def test_simple_scores_substring_matches() -> None:
    page = index().search(query="PIZZA", algorithm="simple")
    assert [(h.agent_id, h.score) for h in page.hits] == [("mario", 6.0), ("luigi", 1.0)]


def test_filtered_uses_filters_only_and_ties_break_by_agent_then_name() -> None:
    page = index().search(
        query=None,
        algorithm="filtered",
        filters=parse_filters([{"attribute": "city", "value": "rome"}]),
    )
    assert ranked(page) == ["bolt", "luigi", "mario"]
    assert {h.score for h in page.hits} == {1.0}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"attribute": "price", "op": "lt", "value": 10}, ["bolt", "luigi"]),
        ({"attribute": "price", "op": "ge", "value": 12}, ["mario", "sakura"]),
        ({"attribute": "price", "op": "le", "value": 9}, ["bolt", "luigi"]),
        ({"attribute": "price", "op": "gt", "value": 12}, ["sakura"]),
        ({"attribute": "city", "op": "ne", "value": "rome"}, ["sakura"]),
        ({"attribute": "city", "op": "in", "value": ["tokyo", "paris"]}, ["sakura"]),
        ({"attribute": "tags", "op": "contains", "value": "vegan"}, ["mario"]),
        ({"attribute": "stars", "op": "eq", "value": 5}, []),
    ],
)
def test_each_filter_op(spec: dict[str, Any], expected: list[str]) -> None:
    page = index().search(query=None, algorithm="filtered", filters=parse_filters([spec]))
    assert ranked(page) == expected


def test_lexical_combined_with_filters() -> None:
    filters = parse_filters([{"attribute": "price", "op": "lt", "value": 10}])
    page = index().search(query="pizza", algorithm="lexical", filters=filters)
    assert ranked(page) == ["luigi"]


@pytest.mark.parametrize(
    "raw",
    [
        "price<10",
        [{"op": "eq", "value": 1}],
        [{"attribute": "a", "op": "like", "value": 1}],
        [{"attribute": "a", "op": "in", "value": 1}],
        [{"attribute": "a", "op": "lt", "value": "x"}],
        [{"attribute": "a", "op": "eq"}],
    ],
)
def test_bad_filters_are_named(raw: object) -> None:
    with pytest.raises(BadFilter):
        parse_filters(raw)


def test_paging_and_total() -> None:
    first = index().search(query=None, algorithm="filtered", limit=3)
    second = index().search(query=None, algorithm="filtered", limit=3, offset=3)
    assert first.total == second.total == 4
    assert ranked(first) + ranked(second) == ["bolt", "luigi", "mario", "sakura"]


def test_incremental_add_remove_and_update() -> None:
    built = index()
    built.remove("mario", "order_pizza")
    assert ranked(built.search(query="pizza", algorithm="lexical")) == ["luigi"]
    built.add("mario", "order_pizza", "pizza pizza pizza", ["pizza"], {})
    assert ranked(built.search(query="pizza", algorithm="lexical"))[0] == "mario"
    built.add("luigi", "order_pasta", "pasta only", ["pasta"], {})
    assert ranked(built.search(query="pizza", algorithm="lexical")) == ["mario"]
    assert len(built) == 4


def test_ten_thousand_capabilities_stay_correct() -> None:
    built = SearchIndex()
    for n in range(10_000):
        built.add(f"agent{n:05d}", f"skill_{n % 100}", f"does thing {n}", [f"k{n % 7}"], {"n": n})
    page = built.search(query="skill 42", algorithm="lexical", limit=5)
    # "skill" is in every capability, so it only re-ranks those "42" found.
    assert page.total == 100
    assert all(h.name == "skill_42" for h in page.hits)
    exact = built.search(
        query=None, algorithm="filtered", filters=parse_filters([{"attribute": "n", "value": 777}])
    )
    assert [(h.agent_id, h.name) for h in exact.hits] == [("agent00777", "skill_77")]


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
