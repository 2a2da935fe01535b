"""Structured logging: JSON lines or console (the default in a terminal), level-filtered before
any work is done.

Events are named as the protocol's flow names them (AGENT_REGISTERED, REQUEST_AUTHORIZED, ...),
with agent and conversation ids as fields. Tokens are never passed to a logger.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from lobby.config import LogFormat


def configure(*, log_format: LogFormat = "json", level: str = "info") -> None:
    """Set up logging for the process; `auto` is console when stdout is a terminal (a person
    watching `make run`), JSON when it goes to a file, a pipe or a log collector."""
    if log_format == "auto":
        log_format = "console" if sys.stdout.isatty() else "json"
    numeric = logging.getLevelNamesMapping()[level.upper()]
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    logger_factory: Callable[..., Any]
    if log_format == "console":
        # Colour codes only for a terminal, never into a file or a pipe.
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty()))
        logger_factory = structlog.PrintLoggerFactory(sys.stdout)
    else:
        processors.append(structlog.processors.JSONRenderer(serializer=orjson.dumps))
        logger_factory = structlog.BytesLoggerFactory(sys.stdout.buffer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=logger_factory,
        cache_logger_on_first_use=True,
    )
    # websockets logs through the standard library; keep its chatter at warnings.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
