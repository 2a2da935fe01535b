"""What a move tells its sender about a dialogue it did not make, synchronously: every move each
prober can send into a sealed round's dialogue (or to its parties) is answered alike whatever
the receiver did before the reveal (lobby/core/commerce/sealed.py, protocol/fipa.py
`Dialogue.check`).

Each world is a fresh lobby in which the buyer's round `r1` asks `t` (the target), `c` (a
competing seller, who bids) and `w` (who answers only where the round is to be revealed early);
`x` is in no round. Worlds differ only in what `t` did, so the same probe sent in each must get
the same frames back, change nothing and journal nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from lobby.core import Router
from tests.routerkit import Clock, Peer, join, make_router, world

AGENTS = ("buyer", "t", "c", "w", "x")
MOVES: dict[str, dict[str, Any]] = {
    "CFP": {"query": {}},
    "PROPOSE": {"proposal": {"price": 1}},
    "ACCEPT": {},
    "DECLINE": {},
    "MATCH_ACCEPT": {},
}
TARGETS = (None, "cfp-1", "bid-t", "no-t")
"""`in_reply_to` of the probes: none, the round's CFP, the target's bid or DECLINE (if any)."""

Probe = tuple[str, str, str, str, str | None, str]
"""(prober, receiver, message type, conversation_id, in_reply_to, message_id)"""


def probes(prober: str, receivers: tuple[str, ...], *, cfp: bool = True) -> list[Probe]:
    moves = [kind for kind in MOVES if cfp or kind != "CFP"]
    made: list[Probe] = [
        (prober, receiver, kind, "r1:t", target, f"probe-{prober}-{receiver}-{kind}-{target}")
        for receiver in receivers
        for kind in moves
        for target in TARGETS
    ]
    # A move that reuses the target's own move ids: no shortcut may treat it as the target's.
    made += [(prober, r, "PROPOSE", "r1:t", "cfp-1", "bid-t") for r in receivers]
    made += [(prober, r, "DECLINE", "r1:t", "cfp-1", "no-t") for r in receivers]
    return made


def move(peer: Peer, to: str, kind: str, conversation: str, move_id: str, target: str) -> None:
    peer.to(
        to, kind, MOVES[kind], conversation_id=conversation, in_reply_to=target, message_id=move_id
    )


World = tuple[Router, Clock, dict[str, Peer]]


def lobby() -> World:
    clock = Clock()
    router = make_router(clock)
    return router, clock, {name: join(router, name) for name in AGENTS}


def sealed(target: str, *, reveal: str = "") -> World:
    """The round with `t` in `target` ("bid", "declined", "silent"); revealed early (every
    receiver answered: `reveal="early"`), at its deadline (`"deadline"`), or not at all; after
    the reveal the buyer may have accepted (`"won"`) or declined (`"lost"`) `t`'s bid."""
    router, clock, peers = lobby()
    body = {"query": {"goods": "apples"}, "receivers": ["t", "c", "w"], "sealed": {"reply_by": 10}}
    peers["buyer"].send("CFP", body, conversation_id="r1", message_id="cfp-1")
    move(peers["c"], "buyer", "PROPOSE", "r1:c", "bid-c", "cfp-1")
    if target == "bid":
        move(peers["t"], "buyer", "PROPOSE", "r1:t", "bid-t", "cfp-1")
    elif target == "declined":
        move(peers["t"], "buyer", "DECLINE", "r1:t", "no-t", "cfp-1")
    if reveal in ("early", "won", "lost"):
        move(peers["w"], "buyer", "DECLINE", "r1:w", "no-w", "cfp-1")
    elif reveal == "deadline":
        clock.now += 10
        world.deliver(router.tick())
    if reveal == "won":
        move(peers["buyer"], "t", "ACCEPT", "r1:t", "accept-t", "bid-t")
    elif reveal == "lost":
        move(peers["buyer"], "t", "DECLINE", "r1:t", "decline-t", "bid-t")
    revealed = router.negotiations.sealed.rounds["r1"].revealed_at is not None
    assert revealed is bool(reveal)
    return settled(router, clock, peers)


def plain(state: str) -> World:
    """No round: a plain dialogue `r1:t` between the buyer and `t`, or none (`state=""`)."""
    router, clock, peers = lobby()
    buyer, t = peers["buyer"], peers["t"]
    if state:
        buyer.to("t", "CFP", {"query": {}}, conversation_id="r1:t", message_id="cfp-1")
    if state in ("proposed", "accepted", "matched"):
        move(t, "buyer", "PROPOSE", "r1:t", "bid-t", "cfp-1")
    if state == "declined":
        move(t, "buyer", "DECLINE", "r1:t", "no-t", "cfp-1")
    if state in ("accepted", "matched"):
        move(buyer, "t", "ACCEPT", "r1:t", "accept-t", "bid-t")
    if state == "matched":
        move(t, "buyer", "MATCH_ACCEPT", "r1:t", "match-t", "accept-t")
    return settled(router, clock, peers)


def settled(router: Router, clock: Clock, peers: dict[str, Peer]) -> World:
    world.deliver(router.committed(router.take_journal()))
    for peer in peers.values():
        peer.take()
    return router, clock, peers


def answers(make: Callable[[], World], sent: list[Probe]) -> list[list[dict[str, Any]]]:
    """What each probe brought back, in a world made afresh by `make`. Every probe must be
    refused alike by every world: nothing saved, nothing for anyone else, no state changed."""
    router, _, peers = make()
    dialogues = {k: d.to_dict() for k, d in router.negotiations.dialogues.items()}
    got = []
    for prober, receiver, kind, conversation, target, move_id in sent:
        envelope: dict[str, Any] = {"conversation_id": conversation, "message_id": move_id}
        if target is not None:
            envelope["in_reply_to"] = target
        peers[prober].to(receiver, kind, MOVES[kind], **envelope)
        frames = peers[prober].take()
        for frame in frames:
            frame.pop("message_id")  # the lobby numbers its ERRORs
        got.append(frames)
        assert router.take_journal().records == [], (prober, kind, target)
        assert [p.take() for name, p in peers.items() if name != prober] == [[]] * 4
    assert {k: d.to_dict() for k, d in router.negotiations.dialogues.items()} == dialogues
    return got


def alike(worlds: dict[str, Callable[[], World]], sent: list[Probe]) -> list[list[Any]]:
    """The answers to `sent`, asserted the same in every world."""
    seen = {name: answers(make, sent) for name, make in worlds.items()}
    first, *_ = seen.values()
    for name, got in seen.items():
        for probe, mine, theirs in zip(sent, got, first, strict=True):
            assert mine == theirs, (name, probe)
    return first


BEFORE: dict[str, Callable[[], World]] = {
    "bid": partial(sealed, "bid"),
    "declined": partial(sealed, "declined"),
    "silent": partial(sealed, "silent"),
}
AFTER: dict[str, Callable[[], World]] = {
    "won": partial(sealed, "bid", reveal="won"),
    "lost": partial(sealed, "bid", reveal="lost"),
    "revealed": partial(sealed, "bid", reveal="early"),
    "declined, revealed": partial(sealed, "declined", reveal="early"),
    "expired": partial(sealed, "silent", reveal="deadline"),
}
PLAIN: dict[str, Callable[[], World]] = {
    f"plain, {state}": partial(plain, state)
    for state in ("cfp_sent", "proposed", "accepted", "matched", "declined")
}


@pytest.mark.parametrize("prober", ["x", "c"])
def test_an_outsider_or_a_competitor_gets_the_same_not_a_party_in_any_state(prober: str) -> None:
    sent = probes(prober, ("t", "buyer"))
    got = alike(BEFORE | AFTER | PLAIN, sent)
    for (_, receiver, kind, *_), frames in zip(sent, got, strict=True):
        (error,) = frames
        assert error["payload"] == {
            "error": f"{kind} refused: {prober!r} has no dialogue 'r1:t' with {receiver!r}; "
            "only a dialogue's two parties may move in it, to each other (rule: not_a_party)",
            "code": "invalid_dialogue",
            "original_message_type": kind,
            "original_conversation_id": "r1:t",
        }
    # A move other than CFP into a dialogue that does not exist reads the same.
    no_cfp = [p for p in sent if p[2] != "CFP"]
    nothing = alike({"none": partial(plain, "")}, no_cfp)
    assert nothing == [g for p, g in zip(sent, got, strict=True) if p[2] != "CFP"]


def test_the_buyer_learns_nothing_of_a_receiver_before_the_reveal() -> None:
    sent = probes("buyer", ("t",)) + probes("buyer", ("c", "x"))
    got = alike(BEFORE, sent)
    for (_, receiver, kind, *_), frames in zip(sent, got, strict=True):
        (error,) = frames
        if receiver == "t":
            assert error["payload"]["error"] == (
                f"{kind} refused: sealed round 'r1' is not revealed yet; its buyer moves in "
                "dialogue 'r1:t' after BIDS_REVEALED (rule: round_not_revealed)"
            )
        else:
            assert "(rule: not_a_party)" in error["payload"]["error"]
    # Its count of open dialogues (and the lobby's) does not tell a DECLINE from silence.
    counts = set()
    for make in BEFORE.values():
        router, _, _ = make()
        counts.add((router.negotiations.started["buyer"], len(router.negotiations.open)))
    assert counts == {(3, 3)}


@pytest.mark.parametrize("target", ["bid", "declined"])
def test_a_receiver_that_answered_cannot_tell_when_the_others_have(target: str) -> None:
    sent = probes("t", ("buyer", "c"))
    worlds: dict[str, Callable[[], World]] = {
        "waiting": partial(sealed, target),
        "revealed early": partial(sealed, target, reveal="early"),
        "revealed at the deadline": partial(sealed, target, reveal="deadline"),
    }
    got = alike(worlds, sent)
    rules = {f["payload"]["error"].rsplit("(rule: ", 1)[1] for frames in got for f in frames}
    if target == "bid":
        assert rules == {"turn_taking)", "not_a_party)"}
    else:
        assert rules == {"dialogue_over)", "not_a_party)"}
