"""agent_sdk/delivery.py: the delivery watermark and the sends awaiting ACCEPTED, as plain
bookkeeping."""

from __future__ import annotations

from agent_sdk.delivery import Inbound, Outbound
from protocol.models import Message, MessageType


def test_the_watermark_is_the_highest_seq_with_everything_below_done() -> None:
    inbound = Inbound()
    inbound.received(1, done=True)
    inbound.received(2, done=False)
    inbound.received(4, done=True)  # 3 never came (the lobby skipped it): not waited for
    assert inbound.watermark == 1
    assert inbound.is_in_progress(2)
    inbound.done(2, inbound.epoch)
    assert not inbound.is_in_progress(2)
    assert inbound.watermark == 4


def test_an_ack_is_due_only_when_the_watermark_moved_past_the_last_one() -> None:
    inbound = Inbound()
    assert inbound.ack_due() is None
    inbound.received(1, done=True)
    assert inbound.ack_due() == 1
    inbound.acked = 1
    assert inbound.ack_due() is None
    inbound.received(1, done=True)  # the same again changes nothing
    assert inbound.ack_due() is None


def test_a_reset_restarts_numbering_and_drops_completions_of_the_old_epoch() -> None:
    inbound = Inbound()
    inbound.received(9, done=False)
    old = inbound.epoch
    inbound.acked = 8
    inbound.reset()
    assert (inbound.highest, inbound.acked, inbound.watermark) == (0, 0, 0)
    inbound.received(9, done=False)
    inbound.done(9, old)
    assert inbound.is_in_progress(9)
    inbound.done(9, inbound.epoch)
    assert inbound.ack_due() == 9


def message(message_id: str) -> Message:
    return Message("me", "other", MessageType.TEXT, {}, message_id=message_id)


def test_outbound_keeps_sends_in_order_until_confirmed_and_says_when_full() -> None:
    outbound = Outbound(limit=3)
    for message_id in ("a", "b", "c"):
        outbound.add(message(message_id))
    assert outbound.full
    assert outbound.confirmed("zzz") == 0  # unknown: nothing released
    assert outbound.confirmed("b") == 2  # "b" and everything before it
    assert not outbound.full
    assert [m.message_id for m in outbound.unconfirmed()] == ["c"]


def test_a_refused_send_is_dropped_and_never_resent() -> None:
    outbound = Outbound(limit=10)
    outbound.add(message("a"))
    outbound.add(message("b"))
    outbound.refused("a")
    outbound.refused("unknown")
    assert [m.message_id for m in outbound.unconfirmed()] == ["b"]
    assert len(outbound) == 1


def test_an_abandoned_seq_holds_the_watermark_until_it_is_delivered_again() -> None:
    inbound = Inbound()
    inbound.received(1, done=True)
    inbound.received(2, done=False)
    inbound.received(3, done=True)
    inbound.abandon(2, inbound.epoch)  # its handler was cancelled: the agent stopped
    assert not inbound.is_in_progress(2)
    inbound.received(4, done=True)
    assert inbound.watermark == 1
    inbound.received(2, done=False)  # the lobby's redelivery
    inbound.done(2, inbound.epoch)
    assert inbound.watermark == 4
