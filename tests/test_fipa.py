"""The FIPA dialogue machine (protocol.fipa), pure and synchronous."""

from __future__ import annotations

import hashlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from protocol.fipa import (
    LOBBY_TRANSITIONS,
    MAX_ROUND_RECEIVERS,
    MAX_ROUND_REPLY_BY,
    TRANSITIONS,
    Dialogue,
    DialogueState,
    IllegalMove,
    SealedRound,
    Terms,
    mermaid_diagram,
    reveal_order,
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
        ("PROPOSE", None, proposal(1), "not_a_party"),
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
    assert str(refused.value) == "a dialogue needs two different parties (rule: not_a_party)"


def test_an_outsider_is_told_the_same_whatever_the_dialogues_state_or_whether_it_exists() -> None:
    """`not_a_party` is checked before any state, and a move into no dialogue reads alike."""
    moves = [
        ("s", "b", "2", "PROPOSE", "1", proposal(20)),
        ("b", "s", "3", "ACCEPT", "2", {}),
        ("s", "b", "4", "MATCH_ACCEPT", "3", {}),
    ]
    states = []
    for played in range(len(moves) + 1):
        d = started()
        for move in moves[:played]:
            play(d, move)
        states.append(d)
    declined, expired = started(), started()
    play(declined, ("s", "b", "2", "DECLINE", "1", {}))
    expired.expire(200.0)
    states += [declined, expired]
    assert len({d.state for d in states}) == 6
    for kind, target, payload in [
        ("CFP", None, CFP),
        ("PROPOSE", "1", proposal(1)),
        ("ACCEPT", "2", {}),
        ("DECLINE", "1", {}),
        ("MATCH_ACCEPT", "3", {}),
    ]:
        for sender, receiver in [("x", "b"), ("x", "s"), ("b", "x"), ("s", "s")]:
            reasons = set()
            for d in states:
                with pytest.raises(IllegalMove) as refused:
                    d.check(sender, receiver, kind, target, payload, 300.0)
                reasons.add((refused.value.rule, refused.value.reason))
            if kind != "CFP":  # (a CFP into no dialogue starts one)
                with pytest.raises(IllegalMove) as refused:
                    Dialogue.start("d1", sender, receiver, "9", kind, target, payload, 300.0)
                reasons.add((refused.value.rule, refused.value.reason))
            assert reasons == {
                (
                    "not_a_party",
                    f"{kind} refused: {sender!r} has no dialogue 'd1' with {receiver!r}; "
                    "only a dialogue's two parties may move in it, to each other",
                )
            }


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


START_REFUSALS = [
    (
        ("PROPOSE", None, proposal(1)),
        "PROPOSE refused: 'b' has no dialogue 'd1' with 's'; only a dialogue's two parties "
        "may move in it, to each other",
        "not_a_party",
    ),
    (("CFP", "7", CFP), "a CFP starts a dialogue and replies to no move", "first_move_must_be_cfp"),
    (("CFP", None, {"query": "text"}), "a CFP payload needs an object 'query'", "bad_payload"),
    *(
        (
            ("CFP", None, {**CFP, "reply_by": bad}),
            "'reply_by' must be a positive number of seconds",
            "bad_payload",
        )
        for bad in (0, -1, True, "5")
    ),
    (
        ("CFP", None, {"query": {"role": "broker"}}),
        "the CFP query's 'role' must be 'buyer' or 'seller'",
        "bad_payload",
    ),
]


@pytest.mark.parametrize(("start", "reason", "rule"), START_REFUSALS)
def test_each_refused_start_says_what_is_wrong(
    start: tuple[str, str | None, dict[str, Any]], reason: str, rule: str
) -> None:
    kind, target, payload = start
    with pytest.raises(IllegalMove) as refused:
        Dialogue.start("d1", "b", "s", "1", kind, target, payload, 0.0)
    assert refused.value.reason == reason
    assert str(refused.value) == f"{reason} (rule: {rule})"


PROPOSED = [("s", "b", "2", "PROPOSE", "1", proposal(1))]

MOVE_REFUSALS = [
    (
        [],
        ("s", "b", "ACCEPT", "1", {}),
        "ACCEPT from the responder refused: dialogue 'd1' is cfp_sent, where only PROPOSE, "
        "DECLINE may follow",
        "invalid_reply",
    ),
    (
        [],
        ("b", "s", "PROPOSE", "1", proposal(1)),
        "PROPOSE from the initiator refused: dialogue 'd1' is cfp_sent and it is the other "
        "party's turn",
        "turn_taking",
    ),
    (
        [],
        ("s", "b", "PROPOSE", "0", proposal(1)),
        "PROPOSE from the responder refused: it must reply to the latest move '1', not '0'",
        "reply_to_latest_move",
    ),
    (
        [],
        ("s", "b", "PROPOSE", None, proposal(1)),
        "PROPOSE from the responder refused: it must reply to the latest move '1', not None",
        "reply_to_latest_move",
    ),
    (
        [],
        ("x", "b", "PROPOSE", "1", proposal(1)),
        "PROPOSE refused: 'x' has no dialogue 'd1' with 'b'; only a dialogue's two parties "
        "may move in it, to each other",
        "not_a_party",
    ),
    (
        [],
        ("s", "b", "CFP", None, CFP),
        "CFP refused: conversation_id 'd1' already names a dialogue",
        "conversation_id_in_use",
    ),
    (
        [],
        ("s", "b", "PROPOSE", "1", {"proposal": 5}),
        "a PROPOSE payload needs an object 'proposal'",
        "bad_payload",
    ),
    *(
        (
            [],
            ("s", "b", "PROPOSE", "1", {"proposal": {"price": price}}),
            "PROPOSE refused: the proposal's 'price' is no number",
            "bad_payload",
        )
        for price in ("abc", [1], None)
    ),
    *(
        (
            [],
            ("s", "b", "PROPOSE", "1", {"proposal": {"price": price}}),
            "PROPOSE refused: the proposal's 'price' must be a non-negative number",
            "bad_payload",
        )
        for price in (-0.01, "Infinity", "NaN")
    ),
    (
        PROPOSED,
        ("s", "b", "PROPOSE", "2", proposal(2)),
        "PROPOSE from the responder refused: dialogue 'd1' is proposed and it is the other "
        "party's turn",
        "turn_taking",
    ),
    (
        PROPOSED,
        ("b", "s", "MATCH_ACCEPT", "2", {}),
        "MATCH_ACCEPT from the initiator refused: dialogue 'd1' is proposed, where only "
        "PROPOSE, ACCEPT, DECLINE may follow",
        "invalid_reply",
    ),
    (
        [("s", "b", "2", "DECLINE", "1", {})],
        ("b", "s", "PROPOSE", "2", proposal(1)),
        "PROPOSE refused: dialogue 'd1' is declined, it is over",
        "dialogue_over",
    ),
]


@pytest.mark.parametrize(("moves", "bad", "reason", "rule"), MOVE_REFUSALS)
def test_each_refused_move_says_what_is_wrong(
    moves: list[tuple[Any, ...]], bad: tuple[Any, ...], reason: str, rule: str
) -> None:
    d = started()
    for move in moves:
        play(d, move)
    with pytest.raises(IllegalMove) as refused:
        d.check(*bad)
    assert refused.value.reason == reason
    assert str(refused.value) == f"{reason} (rule: {rule})"


@pytest.mark.parametrize("price", [0, 0.5, "0.99"])
def test_a_price_below_one_is_a_price(price: Any) -> None:
    d = started()
    d.apply("s", "b", "2", "PROPOSE", "1", {"proposal": {"price": price}}, 0.0)
    assert d.state is DialogueState.PROPOSED


def test_a_short_reply_by_is_a_deadline() -> None:
    assert started(reply_by=0.5).reply_by == 100.5


def test_a_dialogue_records_its_parties_moves_and_times() -> None:
    d = started()
    assert (d.created_at, d.updated_at, d.moves) == (100.0, 100.0, 1)
    assert (d.role_of("b"), d.role_of("s"), d.role_of("x")) == (
        "initiator",
        "responder",
        "outsider",
    )
    assert (d.other("b"), d.other("s")) == ("s", "b")
    d.apply("s", "b", "2", "PROPOSE", "1", proposal(20), now=101.0)
    assert (d.last_move_id, d.last_sender, d.updated_at, d.moves) == ("2", "s", 101.0, 2)
    assert (d.last_proposal, d.last_proposer) == (proposal(20)["proposal"], "s")
    assert d.accepted_proposal is None
    d.apply("b", "s", "3", "ACCEPT", "2", {}, now=102.0)
    assert (d.accepted_proposal, d.accepted_proposer) == (proposal(20)["proposal"], "s")
    assert d.moves == 3
    assert d.terms() is None  # accepted, not matched yet
    d.expire(150.0)
    assert (d.state, d.updated_at) == (DialogueState.EXPIRED, 150.0)


def test_a_decline_after_a_proposal_accepts_nothing() -> None:
    d = started()
    d.apply("s", "b", "2", "PROPOSE", "1", proposal(20), now=101.0)
    d.apply("b", "s", "3", "DECLINE", "2", {}, now=102.0)
    assert d.accepted_proposal is None
    assert d.terms() is None


# -- sealed rounds ---------------------------------------------------------------------------


def sealed_dialogue(deadline: float = 110.0) -> Dialogue:
    """A round's dialogue as the lobby starts it: sealed until `deadline`."""
    d = started()
    d.state, d.round_id, d.sealed_by = DialogueState.SEALED, "r1", deadline
    return d


def test_a_sealed_proposal_is_held_then_revealed_and_answered_as_usual() -> None:
    d = sealed_dialogue()
    assert d.apply("s", "b", "2", "PROPOSE", "1", proposal(7), 105.0) is DialogueState.HELD
    with pytest.raises(IllegalMove) as refused:
        d.check("b", "s", "ACCEPT", "2", {}, 106.0)
    assert refused.value.rule == "round_not_revealed"
    d.reveal(111.0)
    assert (d.state, d.updated_at) == (DialogueState.REVEALED, 111.0)
    assert d.apply("b", "s", "3", "ACCEPT", "2", {}, 112.0) is DialogueState.ACCEPTED
    d.apply("s", "b", "4", "MATCH_ACCEPT", "3", {}, 113.0)
    assert d.terms() == Terms("b", "s", Decimal(7), {"r": 1})


def test_a_reply_after_the_sealed_deadline_names_it() -> None:
    d = sealed_dialogue(deadline=110.0)
    with pytest.raises(IllegalMove) as refused:
        d.check("s", "b", "PROPOSE", "1", proposal(1), 110.0)
    assert refused.value.rule == "sealed_reply_by_passed"
    assert "'r1' closed at its reply_by deadline 110.000" in refused.value.reason
    d.expire(111.0)  # the round was revealed without it
    with pytest.raises(IllegalMove) as refused:
        d.check("s", "b", "DECLINE", "1", {}, 112.0)
    assert refused.value.rule == "sealed_reply_by_passed"
    # Without a clock (as an agent's own view checks) the usual rule answers.
    with pytest.raises(IllegalMove) as refused:
        d.check("s", "b", "PROPOSE", "1", proposal(1))
    assert refused.value.rule == "dialogue_over"


def test_a_sealed_dialogue_may_be_declined_before_the_deadline_and_ends_at_the_reveal() -> None:
    d = sealed_dialogue()
    assert d.apply("s", "b", "2", "DECLINE", "1", {}, 105.0) is DialogueState.DECLINE_HELD
    assert not d.is_over  # still open for the buyer's count until the reveal
    d.reveal(111.0)
    assert (d.state, d.updated_at) == (DialogueState.DECLINED, 111.0)
    assert d.is_over


def test_the_lobby_transitions_are_in_the_diagram() -> None:
    diagram = mermaid_diagram()
    for state, events in LOBBY_TRANSITIONS.items():
        for event, target in events.items():
            assert f"{state} --> {target}: {event}" in diagram


ROUND = {"query": {}, "receivers": ["s1", "s2"], "sealed": {"reply_by": 5}}


def test_a_round_is_parsed_from_its_cfp() -> None:
    sealed = SealedRound.parse("r1", "b", ROUND, "seed", 100.0)
    assert (sealed.receivers, sealed.reply_by) == (["s1", "s2"], 105.0)
    assert sealed.dialogue_id("s2") == "r1:s2"
    assert SealedRound.from_dict(sealed.to_dict()) == sealed


NEEDS_SECONDS = "a CFP to several receivers needs 'sealed': {'reply_by': positive seconds}"
NEEDS_RECEIVERS = "a sealed CFP needs 'receivers': a non-empty list of agent ids"
DISTINCT = "a sealed CFP's receivers must be distinct and not include its sender"
TOO_LONG = (
    "a sealed round stays open at most 86400 seconds (24 h); its 'sealed' 'reply_by' asks "
    "for longer"
)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"sealed": None}, NEEDS_SECONDS),
        ({"sealed": {"reply_by": 0}}, NEEDS_SECONDS),
        ({"sealed": {"reply_by": True}}, NEEDS_SECONDS),
        ({"sealed": {"reply_by": MAX_ROUND_REPLY_BY + 0.001}}, TOO_LONG),
        ({"sealed": {"reply_by": 1e300}}, TOO_LONG),
        ({"receivers": "s1"}, NEEDS_RECEIVERS),
        ({"receivers": []}, NEEDS_RECEIVERS),
        ({"receivers": [1]}, NEEDS_RECEIVERS),
        ({"receivers": ["s1", "b"]}, DISTINCT),
        ({"receivers": ["s1", "s1"]}, DISTINCT),
        (
            {"receivers": [f"s{i}" for i in range(MAX_ROUND_RECEIVERS + 1)]},
            "a sealed CFP asks at most 1000 receivers",
        ),
    ],
)
def test_a_bad_round_names_its_problem(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(IllegalMove) as refused:
        SealedRound.parse("r1", "b", {**ROUND, **change}, "seed", 100.0)
    assert (refused.value.rule, refused.value.reason) == ("bad_payload", reason)


def test_a_round_id_must_leave_room_for_the_receivers() -> None:
    with pytest.raises(IllegalMove) as refused:
        SealedRound.parse("r" * 101, "b", ROUND, "seed", 100.0)
    assert (refused.value.rule, refused.value.reason) == (
        "bad_payload",
        "a sealed round's conversation_id has at most 100 characters",
    )
    assert SealedRound.parse("r" * 100, "b", ROUND, "seed", 100.0).round_id == "r" * 100


def test_a_round_takes_any_positive_reply_by_and_up_to_its_most_receivers() -> None:
    receivers = [f"s{i}" for i in range(MAX_ROUND_RECEIVERS)]
    round_ = {**ROUND, "receivers": receivers, "sealed": {"reply_by": 0.5}}
    sealed = SealedRound.parse("r1", "b", round_, "seed", 100.0)
    assert (sealed.receivers, sealed.reply_by) == (receivers, 100.5)
    assert (sealed.seed, sealed.created_at, sealed.revealed_at) == ("seed", 100.0, None)
    longest = {**ROUND, "sealed": {"reply_by": MAX_ROUND_REPLY_BY}}
    assert SealedRound.parse("r1", "b", longest, "seed", 100.0).reply_by == 100.0 + 86_400


def test_the_reveal_order_is_a_reproducible_shuffle() -> None:
    bidders = [f"bidder-{i}" for i in range(10)]
    order = reveal_order("0f" * 16, bidders)
    assert order == reveal_order("0f" * 16, list(reversed(bidders)))  # arrival does not count
    assert sorted(order) == bidders
    digest = hashlib.sha256(f"{'0f' * 16}:{order[0]}".encode()).hexdigest()
    assert all(digest <= hashlib.sha256(f"{'0f' * 16}:{b}".encode()).hexdigest() for b in bidders)
    assert reveal_order("another seed", bidders) != order
