"""The dashboard's files (`GET /dashboard`): plain HTML, JS and CSS shipped inside the package,
no CDN and no build step. The page asks for the admin token, opens `/admin?auth=message`,
sends the token as its first message, then `observe`s: the lobby pushes a snapshot and events
(`lobby.observer`), the page never polls. When the connection closes (the lobby restarts) it
opens a new one with backoff and the same token, which the lobby keeps across restarts.
"""

from __future__ import annotations

from functools import cache
from http import HTTPStatus
from importlib import resources

from lobby.transport.base import HttpAnswer

PATH = "/dashboard"

FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


@cache
def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


def answer(path: str) -> HttpAnswer:
    """The answer to `GET /dashboard` (the page) or `GET /dashboard/FILE`."""
    name = path[len(PATH) :].lstrip("/") or "index.html"
    content_type = FILES.get(name)
    if content_type is None:
        error = f"no such dashboard file {name[:64]!r}: one of {', '.join(FILES)}"
        return HttpAnswer.json(HTTPStatus.NOT_FOUND, {"error": error})
    return HttpAnswer(HTTPStatus.OK, _read(name), content_type)


__all__ = ["FILES", "PATH", "answer"]
