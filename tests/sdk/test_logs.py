"""agent_sdk/logs.py: the SDK's lines are stdlib log records under `agent_sdk`, an event and its
fields, built only when their level is on."""

from __future__ import annotations

import logging

import pytest

from agent_sdk.logs import EventLog
from tests.sdklogs import sdk_events


def test_a_line_is_the_event_and_its_fields_and_carries_them_as_attributes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = EventLog()
    with caplog.at_level(logging.INFO, logger="agent_sdk"):
        log.info("AGENT_CONNECTED", agent_id="echo", resumed=False, name="kept in fields")
    (record,) = caplog.records
    assert record.name == "agent_sdk"
    assert record.getMessage() == "AGENT_CONNECTED agent_id=echo resumed=False name=kept in fields"
    assert record.__dict__["event"] == "AGENT_CONNECTED"
    assert record.__dict__["agent_id"] == "echo"
    assert record.__dict__["fields"]["name"] == "kept in fields"  # a reserved attribute: not set


def test_below_the_level_nothing_is_logged() -> None:
    log = EventLog()
    with sdk_events(logging.WARNING) as events:
        log.info("AGENT_CONNECTED", agent_id="echo")
        log.debug("DETAIL")
        log.warning("LOBBY_ERROR", code="malformed")
    assert [e["event"] for e in events] == ["LOBBY_ERROR"]


def test_an_exception_line_carries_the_traceback() -> None:
    log = EventLog()
    with sdk_events() as events:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("CAPABILITY_FAILED", capability="quote")
    assert "RuntimeError: boom" in events[0]["line"]
