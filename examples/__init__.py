"""Runnable example agents; each has a `run.py` with a `main()` the tests run.

Every example takes `--lobby-url`, one address or several comma-separated: the nodes of a
cluster (docs/cluster.md). With several, `spread` starts each agent on the next node, so the
example's agents talk across nodes, and each fails over to the others.
"""

from __future__ import annotations


def spread(lobby_url: str, index: int) -> list[str]:
    """The addresses for an example's `index`-th agent: those of `lobby_url` (comma-separated),
    starting at the `index`-th (modulo their number), the others after it in order."""
    urls = [url.strip() for url in lobby_url.split(",") if url.strip()]
    if not urls:
        raise ValueError(f"no lobby URL in {lobby_url!r}")
    start = index % len(urls)
    return urls[start:] + urls[:start]
