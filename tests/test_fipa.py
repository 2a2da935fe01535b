"""The FIPA dialogue machine (protocol.fipa), pure and synchronous."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from protocol.fipa import (
    TRANSITIONS,
    Dialogue,
    DialogueState,
    IllegalMove,
    Terms,
    mermaid_diagram,
)

CFP = {"query": {"goods": {"r": 1}}}


def proposal(price: float) -> dict[str, Any]:
    return {"proposal": {"goods": {"r": 1}, "price": price}}


def play(d: Dialogue, move: tuple[Any, ...]) -> None:
    sender, receiver, move_id, kind, target, payload = move
    d.apply(sender, receiver, move_id, kind, target, payload, 0.0)


def started(**cfp: Any) -> Dialogue:
    return Dialogue.start("d1", "b", "s", "1", "CFP", None, {**CFP, **cfp}, now=100.0)


def test_the_seed_haggle_step_by_step() -> None:
    d = started()
    assert d.state is DialogueState.CFP_SENT
    steps = [
        ("s", "b", "2", "PROPOSE", "1", proposal(20), DialogueState.PROPOSED),
        ("b", "s", "3", "PROPOSE", "2", proposal(10), DialogueState.PROPOSED),
        ("s", "b", "4", "PROPOSE", "3", proposal(15), DialogueState.PROPOSED),
        ("b", "s", "5", "ACCEPT", "4", {}, DialogueState.ACCEPTED),
        ("s", "b", "6", "MATCH_ACCEPT", "5", {}, DialogueState.MATCHED),
    ]
    for sender, receiver, move, kind, target, payload, state in steps:
        assert d.apply(sender, receiver, move, kind, target, payload, now=101.0) is state
    assert d.is_over
    assert d.terms() == Terms(buyer="b", seller="s", price=Decimal("15"), goods={"r": 1})


def test_a_seller_cfp_makes_its_sender_the_seller() -> None:
    d = Dialogue.start("d", "s", "b", "1", "CFP", None, {"query": {"role": "seller"}}, 0.0)
    d.apply("b", "s", "2", "PROPOSE", "1", proposal(3), 0.0)
    d.apply("s", "b", "3", "ACCEPT", "2", {}, 0.0)
    d.apply("b", "s", "4", "MATCH_ACCEPT", "3", {}, 0.0)
    assert d.terms() == Terms(buyer="b", seller="s", price=Decimal("3"), goods={"r": 1})


def test_no_transaction_without_a_price() -> None:
    d = started()
    d.apply("s", "b", "2", "PROPOSE", "1", {"proposal": {"goods": "x"}}, 0.0)
    d.apply("b", "s", "3", "ACCEPT", "2", {}, 0.0)
    d.apply("s", "b", "4", "MATCH_ACCEPT", "3", {}, 0.0)
    assert d.terms() is None


def test_decline_ends_the_dialogue_after_cfp_or_propose() -> None:
    d = started()
    d.apply("s", "b", "2", "DECLINE", "1", {"reason": "none left"}, 0.0)
    assert d.state is DialogueState.DECLINED
    d = started()
    d.apply("s", "b", "2", "PROPOSE", "1", proposal(9), 0.0)
    d.apply("b", "s", "3", "DECLINE", "2", {}, 0.0)
    assert d.is_over


@pytest.mark.parametrize(
    ("moves", "bad", "rule"),
    [
        ([], ("s", "b", "2", "ACCEPT", "1", {}), "invalid_reply"),
        ([], ("s", "b", "2", "MATCH_ACCEPT", "1", {}), "invalid_reply"),
        ([], ("b", "s", "2", "PROPOSE", "1", proposal(1)), "turn_taking"),
        ([], ("s", "b", "2", "PROPOSE", "0", proposal(1)), "reply_to_latest_move"),
        ([], ("s", "b", "2", "PROPOSE", None, proposal(1)), "reply_to_latest_move"),
        ([], ("x", "b", "2", "PROPOSE", "1", proposal(1)), "not_a_party"),
        ([], ("s", "x", "2", "PROPOSE", "1", proposal(1)), "not_a_party"),
        ([], ("s", "b", "2", "CFP", None, CFP), "conversation_id_in_use"),
        ([], ("s", "b", "2", "PROPOSE", "1", {"proposal": 5}), "bad_payload"),
        ([], ("s", "b", "2", "PROPOSE", "1", proposal(-1)), "bad_payload"),
        (
            [("s", "b", "2", "PROPOSE", "1", proposal(1))],
            ("b", "s", "3", "MATCH_ACCEPT", "2", {}),
            "invalid_reply",
        ),
        (
            [("s", "b", "2", "DECLINE", "1", {})],
            ("b", "s", "3", "PROPOSE", "2", proposal(1)),
            "dialogue_over",
        ),
        (
            [
                ("s", "b", "2", "PROPOSE", "1", proposal(1)),
                ("b", "s", "3", "PROPOSE", "2", proposal(2)),
            ],
            ("s", "b", "4", "ACCEPT", "2", {}),
            "reply_to_latest_move",
        ),
    ],
)
def test_every_illegal_move_names_its_rule(
    moves: list[tuple[Any, ...]], bad: tuple[Any, ...], rule: str
) -> None:
    d = started()
    for move in moves:
        play(d, move)
    before = d.to_dict()
    with pytest.raises(IllegalMove) as refused:
        play(d, bad)
    assert refused.value.rule == rule
    assert bad[3] in str(refused.value)
    assert d.to_dict() == before  # an illegal move changes nothing


@pytest.mark.parametrize(
    ("kind", "target", "payload", "rule"),
    [
        ("PROPOSE", None, proposal(1), "first_move_must_be_cfp"),
        ("CFP", "7", CFP, "first_move_must_be_cfp"),
        ("CFP", None, {"query": "text"}, "bad_payload"),
        ("CFP", None, {**CFP, "reply_by": -1}, "bad_payload"),
        ("CFP", None, {"query": {"role": "broker"}}, "bad_payload"),
    ],
)
def test_a_dialogue_starts_only_with_a_proper_cfp(
    kind: str, target: str | None, payload: dict[str, Any], rule: str
) -> None:
    with pytest.raises(IllegalMove) as refused:
        Dialogue.start("d", "b", "s", "1", kind, target, payload, 0.0)
    assert refused.value.rule == rule


def test_a_cfp_to_oneself_is_no_dialogue() -> None:
    with pytest.raises(IllegalMove) as refused:
        Dialogue.start("d", "b", "b", "1", "CFP", None, CFP, 0.0)
    assert refused.value.rule == "not_a_party"


def test_reply_by_sets_a_deadline_cleared_by_the_first_reply() -> None:
    d = started(reply_by=5)
    assert d.reply_by == 105.0
    d.apply("s", "b", "2", "PROPOSE", "1", proposal(2), now=101.0)
    assert d.reply_by is None


def test_expired_dialogues_refuse_moves() -> None:
    d = started()
    d.expire(200.0)
    with pytest.raises(IllegalMove) as refused:
        d.check("s", "b", "PROPOSE", "1", proposal(1))
    assert refused.value.rule == "dialogue_over"


def test_round_trip_for_the_store() -> None:
    d = started(reply_by=3)
    d.apply("s", "b", "2", "PROPOSE", "1", proposal(2.5), 0.0)
    assert Dialogue.from_dict(d.to_dict()) == d


def test_diagram_is_generated_from_the_table() -> None:
    diagram = mermaid_diagram()
    for state, moves in TRANSITIONS.items():
        for move, target in moves.items():
            assert f"{state} --> {target}: {move}" in diagram


def test_protocol_md_shows_the_generated_diagram() -> None:
    protocol_md = (Path(__file__).parent.parent / "PROTOCOL.md").read_text()
    assert f"```mermaid\n{mermaid_diagram()}\n```" in protocol_md
