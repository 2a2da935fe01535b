"""Capturing the SDK's log (stdlib `logging`, the `agent_sdk` logger) as a list of events."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agent_sdk.logs import LOGGER_NAME


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = getattr(record, "fields", {})
        event = {"event": getattr(record, "event", None), **fields}
        event["line"] = self.format(record)
        self.events.append(event)


@contextmanager
def sdk_events(level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """Every line the SDK logs meanwhile, from `level` up: its event, fields and whole text."""
    logger = logging.getLogger(LOGGER_NAME)
    handler, before = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.events
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
