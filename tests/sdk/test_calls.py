"""agent_sdk/calls.py: the futures of waiting calls and questions, completed from the
dispatcher's actions (an event loop, no socket)."""

from __future__ import annotations

import asyncio

import pytest

from agent_sdk.calls import PROGRESS_QUEUE_SIZE, Outstanding
from agent_sdk.dispatch import Answer, Deliver, Dispatcher, Reply
from agent_sdk.errors import (
    InvalidInputError,
    NotConnectedError,
    RequestRefusedError,
    RequestTimeoutError,
    UnknownReceiverError,
)
from agent_sdk.stats import AgentStats
from protocol.codec import encode
from protocol.models import LOBBY_ID, Message, MessageType


def frame(sender_id: str, message_type: MessageType, payload: dict[str, object], cid: str) -> bytes:
    return encode(Message(sender_id, "me", message_type, dict(payload), cid))


def pair() -> tuple[Dispatcher, Outstanding]:
    """An agent's `Outstanding` and the dispatcher that reads it."""
    outstanding = Outstanding()
    dispatcher = Dispatcher(
        AgentStats(),
        calls=outstanding.calls,
        questions=outstanding.questions,
        dedupe_window=10,
        max_unconfirmed=10,
    )
    return dispatcher, outstanding


async def test_a_call_yields_progress_then_its_result_and_ignores_a_second_final() -> None:
    dispatcher, outstanding = pair()
    call = outstanding.call("c1", "seller", "price", stream=True)
    (update,) = dispatcher.receive(
        frame("seller", MessageType.RESPONSE, {"status": "in_progress", "n": 1}, "c1")
    )
    assert isinstance(update, Answer)
    outstanding.answer(update.conversation_id, update.payload)
    outstanding.answer("c1", {"status": "success", "price": 3})
    outstanding.answer("c1", {"status": "success", "price": 4})
    assert call.updates is not None
    assert call.updates.get_nowait() == {"status": "in_progress", "n": 1}
    assert await call.result == {"status": "success", "price": 3}


async def test_a_slow_stream_consumer_keeps_the_latest_updates_and_counts_the_dropped() -> None:
    _, outstanding = pair()
    call = outstanding.call("c1", "seller", "price", stream=True)
    for n in range(PROGRESS_QUEUE_SIZE + 3):
        outstanding.answer("c1", {"status": "in_progress", "n": n})
    assert call.dropped_updates == 3
    assert call.updates is not None
    assert call.updates.get_nowait() == {"status": "in_progress", "n": 3}


async def test_an_error_response_and_a_refusal_raise_their_typed_errors() -> None:
    _, outstanding = pair()
    remote = outstanding.call("c1", "seller", "price", stream=False)
    outstanding.answer("c1", {"status": "error", "code": "invalid_input", "error": "bad"})
    with pytest.raises(InvalidInputError):
        await remote.result
    unknown = outstanding.call("c2", "nobody", "price", stream=False)
    outstanding.refuse("c2", "unknown_receiver", "no such agent")
    with pytest.raises(UnknownReceiverError, match=r"^unknown_receiver: no such agent$"):
        await unknown.result
    full = outstanding.call("c3", "seller", "price", stream=False)
    outstanding.refuse("c3", "mailbox_full", "full")
    with pytest.raises(RequestRefusedError) as refused:
        await full.result
    assert (refused.value.code, refused.value.message) == ("mailbox_full", "full")


async def test_a_question_takes_one_reply_and_an_answered_one_takes_no_more() -> None:
    dispatcher, outstanding = pair()
    future = outstanding.question("q1")
    (reply,) = dispatcher.receive(frame(LOBBY_ID, MessageType.MESSAGES, {"messages": []}, "q1"))
    assert isinstance(reply, Reply)
    assert outstanding.reply(reply.conversation_id, reply.message)
    assert (await future).message_type is MessageType.MESSAGES
    assert not outstanding.reply("q1", reply.message)  # the core delivers a second one
    timed_out = outstanding.question("q2")
    timed_out.cancel()
    assert not outstanding.reply("q2", reply.message)


async def test_a_forgotten_conversation_is_no_longer_answered() -> None:
    dispatcher, outstanding = pair()
    outstanding.call("c1", "seller", "price", stream=False)
    outstanding.forget("c1")
    outstanding.question("q1")
    outstanding.forget("q1")  # a question only: no call to forget
    outstanding.forget("never")
    assert (outstanding.calls, outstanding.questions) == ({}, {})
    late = frame("seller", MessageType.RESPONSE, {"status": "success"}, "c1")
    assert [type(a) for a in dispatcher.receive(late)] == [Deliver]


async def test_a_stop_fails_every_call_and_cancels_every_question() -> None:
    _, outstanding = pair()
    call = outstanding.call("c1", "seller", "price", stream=False)
    question = outstanding.question("q1")
    outstanding.fail_all(NotConnectedError("stopped"))
    assert isinstance(call.result.exception(), NotConnectedError)
    assert question.cancelled()


async def test_a_call_knows_what_it_asked_and_says_which_response_is_final() -> None:
    _, outstanding = pair()
    call = outstanding.call("c1", "seller", "price", stream=False)
    assert (call.receiver_id, call.capability, call.updates) == ("seller", "price", None)
    assert call.on_response({"status": "in_progress"}) is False  # not kept: no stream
    assert call.on_response({"status": "success"}) is True
    assert call.on_response({"status": "success"}) is True  # a second final changes nothing
    assert await call.result == {"status": "success"}


async def test_calls_time_out_at_their_own_deadlines_on_one_timer() -> None:
    """Calls with different timeouts each fail at their deadline, whatever the order they
    were set in; one answered or forgotten in time never times out."""
    _, outstanding = pair()
    calls = {cid: outstanding.call(cid, "seller", "price", stream=False) for cid in "abcde"}
    for cid, after in (("a", 0.2), ("b", 0.05), ("c", 0.2), ("d", 0.05), ("e", 0.05)):
        outstanding.time_out(cid, after)
    outstanding.answer("d", {"status": "success", "price": 1})
    outstanding.forget("e")
    with pytest.raises(RequestTimeoutError, match="'seller' for 'price'"):
        await calls["b"].result
    assert not calls["a"].result.done()
    assert not calls["c"].result.done()
    assert await calls["d"].result == {"status": "success", "price": 1}
    outstanding.forget("b")
    outstanding.forget("d")
    failures = await asyncio.gather(calls["a"].result, calls["c"].result, return_exceptions=True)
    assert [type(f) for f in failures] == [RequestTimeoutError, RequestTimeoutError]
    assert not calls["e"].result.done()
    outstanding.forget("a")
    outstanding.forget("c")
    assert outstanding._deadlines == {}
    assert outstanding._timer is None


async def test_a_stopped_agent_fails_its_calls_and_drops_their_deadlines() -> None:
    _, outstanding = pair()
    call = outstanding.call("a", "seller", "price", stream=False)
    outstanding.time_out("a", 30)
    outstanding.fail_all(NotConnectedError("stopped"))
    with pytest.raises(NotConnectedError):
        await call.result
    assert outstanding._deadlines == {}
    assert outstanding._timer is None
    # The caller's `finally` forgets it as usual: the call holds no deadline to take back.
    outstanding.forget("a")
    assert outstanding.calls == {}


async def test_one_timer_is_armed_at_the_earliest_deadline_and_a_forgotten_call_leaves_it() -> None:
    _, outstanding = pair()
    for cid in "ab":
        outstanding.call(cid, "seller", "price", stream=False)
    outstanding.time_out("a", 30)
    outstanding.time_out("b", 60)  # later: the timer stays where it is
    timer = outstanding._timer
    assert timer is not None
    assert timer.when() == outstanding._deadlines[30]["a"]
    outstanding.forget("a")
    assert outstanding._deadlines[30] == {}
    assert list(outstanding._deadlines[60]) == ["b"]
    outstanding.fail_all(NotConnectedError("stopped"))
