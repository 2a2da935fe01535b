"""agent_sdk/turns.py: a handler's asks waiting for their INPUT, and a call read turn by turn
(`Conversation`), fed as the read loop feeds them (an event loop, no socket)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sdk.calls import Outstanding
from agent_sdk.errors import InputRequiredError, RemoteError, RequestTimeoutError
from agent_sdk.turns import Answer, Conversation, Inputs, asks, input_payload
from protocol.models import Message, MessageType
from tests.sdklogs import sdk_events

ASK = {"status": "in_progress", "input_required": {"question": "Which size?"}}


def an_input(sender: str, conversation_id: str, payload: dict[str, Any]) -> Message:
    return Message(sender, "tailor", MessageType.INPUT, payload, conversation_id, message_id="i1")


async def test_an_input_completes_the_ask_of_its_requester_and_conversation() -> None:
    inputs = Inputs("tailor")
    asked = inputs.expect("buyer", "c1")
    other = inputs.expect("buyer", "c2")
    inputs.receive(an_input("buyer", "c1", {"size": "M"}))  # at once: no task
    assert (await asked).payload == {"size": "M"}
    assert not other.done()
    assert set(inputs.waiting) == {("buyer", "c2")}


async def test_an_input_nobody_awaits_is_logged_and_dropped() -> None:
    inputs = Inputs("tailor")
    with sdk_events() as logs:
        inputs.receive(an_input("buyer", "c9", {"size": "M"}))
    assert [(e["event"], e["requester"], e["conversation_id"]) for e in logs] == [
        ("INPUT_NOT_AWAITED", "buyer", "c9")
    ]


def test_asks_reads_input_required_and_an_answer_is_sent_as_a_dict() -> None:
    assert asks(ASK) == {"question": "Which size?"}
    assert asks({"status": "in_progress", "step": 1}) is None
    answer: Answer = {"size": "M"}
    assert input_payload(answer) == {"size": "M"}


def conversation(outstanding: Outstanding, timeout: float = 5.0) -> tuple[Conversation, Any]:
    call = outstanding.call("c1", "tailor", "order", stream=True)
    sent: list[tuple[str, str, Answer, str | None]] = []

    async def send_input(
        agent_id: str, conversation_id: str, answer: Answer, *, message_id: str | None = None
    ) -> None:
        sent.append((agent_id, conversation_id, answer, message_id))

    async def cancel(conversation_id: str, reason: str | None) -> None:
        sent.append(("lobby", conversation_id, {"cancel": reason}, None))

    talk = Conversation(call, "c1", outstanding, send_input, timeout, cancel)
    return talk, sent


async def test_a_conversation_yields_each_update_then_the_result_from_any_task() -> None:
    outstanding = Outstanding()
    talk, sent = conversation(outstanding)
    outstanding.answer("c1", ASK)
    # Each step may be awaited from a task of its own (a server parks the call between turns).
    assert await asyncio.create_task(anext(talk)) == ASK
    await talk.send_input({"size": "M"}, message_id="m2")
    assert sent == [("tailor", "c1", {"size": "M"}, "m2")]
    later = asyncio.create_task(anext(talk))
    await asyncio.sleep(0)
    outstanding.answer("c1", {"status": "success", "size": "M"})
    assert await later == {"size": "M"}
    with pytest.raises(StopAsyncIteration):
        await anext(talk)
    assert outstanding.calls == {}


async def test_an_error_response_raises_and_a_deadline_times_the_conversation_out() -> None:
    outstanding = Outstanding()
    talk, _ = conversation(outstanding)
    outstanding.answer("c1", {"status": "error", "code": "out_of_stock", "error": "none"})
    with pytest.raises(RemoteError):
        await anext(talk)
    outstanding = Outstanding()
    talk, _ = conversation(outstanding, timeout=0.05)
    with pytest.raises(RequestTimeoutError):
        await anext(talk)
    assert outstanding.calls == {}


async def test_cancel_sends_cancel_and_stops_the_iteration() -> None:
    outstanding = Outstanding()
    talk, sent = conversation(outstanding)
    await talk.cancel("changed my mind")
    assert sent == [("lobby", "c1", {"cancel": "changed my mind"}, None)]
    assert [u async for u in talk] == []
    assert outstanding.calls == {}


async def test_a_call_that_streams_nothing_fails_on_an_ask() -> None:
    outstanding = Outstanding()
    call = outstanding.call("c1", "tailor", "order", stream=False)
    outstanding.answer("c1", ASK)
    with pytest.raises(InputRequiredError) as raised:
        await call.result
    assert raised.value.asked == {"question": "Which size?"}
