"""The forward link's bookkeeping (`lobby.cluster.links`), synchronously: a home routes a
node's batches only without a gap, confirmations cover only what it routed, a left-out message
stays kept, and resends cover every number from where they start."""

from __future__ import annotations

from collections.abc import Iterable

from lobby.cluster import links
from lobby.cluster.links import Chunk, Inbound, Outbound, Pending


def sent(link: Outbound, *receivers: str, at: float = 0.0, decided: bool = False) -> int:
    """Number a batch to `receivers` (one message each, ids m<batch>.<n>) and publish it."""
    batch = link.number()
    entries = [
        Pending(batch, to, "alice", f"m{batch}.{n}", b"{}", decided)
        for n, to in enumerate(receivers)
    ]
    link.keep(entries, limit=1000)
    link.went_out(batch, at)
    return batch


def ids(entries: Iterable[Pending]) -> list[str]:
    return [e.message_id for e in entries]


def test_a_home_routes_batches_in_order_and_refuses_one_past_a_gap() -> None:
    home = Inbound()
    assert home.take("i1", 1, 1, low=1)
    assert home.take("i1", 2, 2, low=1)
    assert not home.take("i1", 4, 4, low=1)  # 3 never arrived
    assert home.expect == 3
    assert home.ask(now=10.0)
    assert not home.ask(now=10.1)  # the same gap, asked a moment ago
    assert home.ask(now=10.0 + links.ASK_EVERY)
    assert home.take("i1", 3, 4, low=3)  # the resend: 3 and 4 together
    assert home.expect == 5
    assert home.take("i1", 2, 4, low=2)  # a repeat is routed (dedupe absorbs it)
    assert home.expect == 5


def test_a_new_incarnation_on_either_end_starts_from_the_senders_low() -> None:
    home = Inbound()
    assert not home.take("i1", 7, 7, low=5)  # a home that restarted: 5 and 6 are not here
    assert home.expect == 5
    assert home.take("i1", 5, 7, low=5)
    assert home.take("i2", 1, 1, low=1)  # the sending node restarted: numbering anew
    assert home.expect == 2


def test_a_low_past_what_the_home_expects_moves_it_on() -> None:
    home = Inbound()
    assert home.take("i1", 1, 1, low=1)
    # Batch 2 was lost, and its only receiver moved to another home: nothing left to send.
    assert home.take("i1", 3, 3, low=3)
    assert home.expect == 4


def test_a_confirmation_covers_up_to_its_batch_and_keeps_what_was_left_out() -> None:
    link = Outbound()
    sent(link, "bob", "carol")
    sent(link, "bob")
    sent(link, "bob")
    link.confirmed(1, 2, [("alice", "m1.1")])  # carol is not the home's agent any more
    assert ids(link.kept) == ["m1.1", "m3.0"]
    assert link.low() == 1
    link.confirmed(3, 3, [])  # a later confirmation does not drop what was left out
    assert ids(link.kept) == ["m1.1"]
    assert link.moved("carol")[0].message_id == "m1.1"
    assert not link.kept
    assert not link.left_out
    assert link.low() == 4


def test_a_left_out_message_routed_on_a_resend_is_confirmed_then() -> None:
    link = Outbound()
    sent(link, "carol")
    link.confirmed(1, 1, [("alice", "m1.0")])
    assert ids(link.kept) == ["m1.0"]
    link.confirmed(1, 1, [])  # the resend found carol there after all
    assert not link.kept
    assert not link.left_out


def test_a_confirmation_for_an_older_range_changes_nothing_newer() -> None:
    link = Outbound()
    for _ in range(3):
        sent(link, "bob")
    link.confirmed(1, 2, [])
    link.confirmed(1, 1, [])  # late and out of order
    assert ids(link.kept) == ["m3.0"]


def test_a_resend_covers_every_number_from_where_it_starts_to_the_newest_published() -> None:
    link = Outbound()
    for _ in range(4):
        sent(link, "bob")
    link.moved("bob")
    sent(link, "dave")
    link.number()  # a decided batch waiting for this node's commit: not published yet
    link.keep([Pending(6, "dave", "alice", "m6.0", b"{}", True)], limit=1000)
    assert link.resend(2) == [Chunk(2, 5, [Pending(5, "dave", "alice", "m5.0", b"{}", False)])]
    assert link.resend(6) == []


def test_a_large_resend_is_split_at_batch_boundaries_and_covers_the_whole_range() -> None:
    link = Outbound()
    big = b"x" * (links.BATCH_BYTES // 2 + 1)
    for _ in range(3):
        batch = link.number()
        link.keep([Pending(batch, "bob", "alice", f"m{batch}", big, False)], limit=1000)
        link.went_out(batch, 0.0)
    chunks = link.resend(1)
    assert [(c.first, c.last, ids(c.entries)) for c in chunks] == [
        (1, 1, ["m1"]),
        (2, 2, ["m2"]),
        (3, 3, ["m3"]),
    ]


def test_what_went_unconfirmed_too_long_is_overdue_from_its_oldest_batch() -> None:
    link = Outbound()
    sent(link, "bob", at=0.0)
    sent(link, "bob", at=1.0)
    assert link.overdue(4.9, after=5.0) is None
    assert link.overdue(5.0, after=5.0) == 1
    link.resent(5.0)
    assert link.overdue(9.0, after=5.0) is None
    link.confirmed(1, 1, [])
    assert link.overdue(10.0, after=5.0) == 2
    link.confirmed(2, 2, [])
    assert link.overdue(20.0, after=5.0) is None
    assert not link.sent


def test_the_resend_buffer_drops_its_oldest_past_its_limit() -> None:
    link = Outbound()
    batch = link.number()
    dropped = link.keep((Pending(batch, "bob", "alice", f"m{n}", b"", False) for n in range(5)), 3)
    assert ids(dropped) == ["m0", "m1"]
    assert ids(link.kept) == ["m2", "m3", "m4"]
