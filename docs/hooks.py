"""MkDocs hooks: pages include the repository's own Markdown files (PROTOCOL.md, BENCHMARKS.md,
examples/js/README.md, sections of README.md) so their text lives in one place, and links to
files the site does not publish become code spans, since the site is built from docs/ alone.

A line `--8<-- "PATH"` includes the file PATH (relative to the repository); `--8<-- "PATH:NAME"`
only the lines between `--8<-- [start:NAME]` and `--8<-- [end:NAME]` markers in it (written in
HTML comments, which GitHub hides)."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"[ \t]*$', re.MULTILINE)
MARKER = re.compile(r"^.*--8<-- \[(?:start|end):[\w-]+\].*\n?", re.MULTILINE)
# [text](target) outside code: the target is relative (no scheme, not an anchor alone).
LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\((?![a-z]+:|#)([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# Repository files the site publishes as pages of its own.
PAGES = {
    "README.md": "index.md",
    "PROTOCOL.md": "protocol.md",
    "BENCHMARKS.md": "benchmarks.md",
    "examples/js/README.md": "node-agent.md",
}


def section(text: str, name: str, path: str) -> str:
    start = re.search(rf"^.*--8<-- \[start:{name}\].*$", text, re.MULTILINE)
    end = re.search(rf"^.*--8<-- \[end:{name}\].*$", text, re.MULTILINE)
    if start is None or end is None:
        raise ValueError(f"{path} has no section {name!r}")
    return text[start.end() + 1 : end.start()]


def relink(text: str, source: str, page: str) -> str:
    """Links in `text`, written relative to the repository file `source`, made relative to the
    site page `page` (both repository paths); a file the site does not have becomes `code`."""

    def one(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        resolved = PAGES.get(resolved, resolved)
        if resolved in PAGES.values():
            resolved = f"docs/{resolved}"
        if resolved.startswith("docs/") and resolved.endswith(".md"):
            new = posixpath.relpath(resolved, posixpath.dirname(page))
            return f"[{label}]({new}{'#' + anchor if anchor else ''})"
        return label if label.startswith("`") else f"{label} (`{resolved}`)"

    parts = []
    last = 0
    for fence in FENCE.finditer(text):  # leave code blocks alone
        parts.append(LINK.sub(one, text[last : fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(one, text[last:]))
    return "".join(parts)


def expand(markdown: str, page: str) -> str:
    def include(match: re.Match[str]) -> str:
        path, name = match.group(1), match.group(2)
        text = (ROOT / path).read_text()
        if name:
            text = section(text, name, path)
        return relink(MARKER.sub("", text), path, page).rstrip("\n")

    return INCLUDE.sub(include, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    source = f"docs/{page.file.src_uri}"
    return relink(expand(markdown, source), source, source)
