"""A client that goes away is no error for an MCP server over streamable HTTP.

The official SDK's server logs a client that ends its session or drops its connection while a
stream is open as an ERROR with a traceback of `anyio.ClosedResourceError` ("Error in
standalone SSE writer"); a server with many clients would print one per client.
`quiet_disconnects()` makes each such record one DEBUG line (dropped unless DEBUG is on);
every other record is left as it is. Call it once before serving (`lobby mcp --http`, the
example tools server)."""

from __future__ import annotations

import logging

import anyio

SERVER_LOGGER = "mcp.server.streamable_http"
GONE = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
"""What a stream raises once its client has gone."""


def client_gone(error: BaseException | None) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return all(client_gone(inner) for inner in error.exceptions)
    return isinstance(error, GONE)


class Disconnects(logging.Filter):
    """Turns a record whose exception says the client went away into one DEBUG line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None or not client_gone(record.exc_info[1]):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        error = record.exc_info[1]
        record.msg = f"{record.getMessage()}: the client went away ({type(error).__name__})"
        record.args = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return True


def quiet_disconnects() -> None:
    """Install `Disconnects` on the SDK's streamable HTTP server logger (once)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, Disconnects) for f in logger.filters):
        logger.addFilter(Disconnects())
