"""How the SDK logs: through the standard library's `logging`, under the `agent_sdk` logger.

A library prints nothing of its own: with logging left unconfigured, only warnings and errors
reach stderr (Python's last-resort handler) and stdout holds what the program prints. To see
more, configure logging as for any library (`logging.basicConfig(level=logging.INFO)`, or
`logging.getLogger("agent_sdk").setLevel(...)`), or pass `Agent(..., log_level="INFO")`.

Each line is an event name and its fields, `AGENT_CONNECTED agent_id=echo resumed=False`; the
record also carries them as attributes (`event`, `fields`, and each field by name) for an
application that renders logs with structlog (`structlog.stdlib.ProcessorFormatter` with
`ExtraAdder`) or as JSON. Tokens are never among them.
"""

from __future__ import annotations

import logging
from typing import Any

LOGGER_NAME = "agent_sdk"


class EventLog:
    """A named `logging.Logger` that takes an event and fields, structlog-style. The text is
    built only when the level is enabled, so a silenced line costs one level check."""

    __slots__ = ("logger",)

    def __init__(self, name: str = LOGGER_NAME) -> None:
        self.logger = logging.getLogger(name)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the traceback of the exception being handled: call in `except`."""
        self._log(logging.ERROR, event, fields, exc_info=True)

    def _log(self, level: int, event: str, fields: dict[str, Any], exc_info: bool = False) -> None:
        logger = self.logger
        if logger.isEnabledFor(level):
            text = " ".join([event, *(f"{key}={value}" for key, value in fields.items())])
            extra = {k: v for k, v in fields.items() if k not in _RESERVED}
            extra["event"], extra["fields"] = event, fields
            logger.log(level, text, exc_info=exc_info, extra=extra, stacklevel=3)


_RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "event", "fields"}
"""LogRecord attributes a field may not overwrite (`logging` refuses them in `extra`)."""


def set_level(level: int | str) -> None:
    """Log the SDK's events from `level` up. If the application configured no logging at all,
    they go to stderr, one line each; stdout stays the program's."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()  # stderr
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)


log = EventLog()
"""The SDK's own logger; every module logs through it."""
