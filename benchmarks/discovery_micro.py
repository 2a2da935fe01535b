"""What one DISCOVER_SERVICES costs the lobby's event loop, in process, without sockets:
`python -m benchmarks.discovery_micro [--capabilities 100000]`.

A Router holding that many capabilities (1,000 per agent; names, descriptions, keywords and
attributes in rotation, so every kind of query has many matches) answers each DISCOVER below;
`Router.handle` is timed, best of 5, decode and encode included. The heaviest queries an agent
can send are here: everything, keywords every capability has, the largest page, deep pages,
wide filters, a ranked search for words every capability has. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import orjson
import structlog

from benchmarks.micro import _join
from lobby.core import Router, Send
from lobby.core.limits import Limits
from protocol.payloads import MAX_DISCOVER_LIMIT

LIMIT = MAX_DISCOVER_LIMIT
QUERIES: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("everything, default page", {}, 1),
    ("everything, largest page", {"limit": LIMIT}, 1),
    ("everything, 20th page", {"limit": LIMIT}, 20),
    ("keyword every capability has", {"keywords": ["everywhere"], "limit": LIMIT}, 1),
    ("32 keywords", {"keywords": [f"kw{n}" for n in range(32)], "limit": LIMIT}, 1),
    ("exact name", {"capability_name": "skill_42", "limit": LIMIT}, 1),
    ("lexical, a word everywhere", {"query": "task", "limit": LIMIT}, 1),
    ("lexical, two words everywhere, 3rd page", {"query": "task number", "limit": LIMIT}, 3),
    ("lexical, 16 words", {"query": " ".join(str(n) for n in range(16)), "limit": LIMIT}, 1),
    ("simple, a word everywhere", {"query": "task", "algorithm": "simple", "limit": LIMIT}, 1),
    ("simple, no match (one window)", {"query": "zzz", "algorithm": "simple"}, 1),
    ("filtered, everything", {"algorithm": "filtered", "limit": LIMIT}, 1),
    (
        "filtered, 8 wide filters",
        {
            "algorithm": "filtered",
            "filters": [{"attribute": "price", "op": "ge", "value": n} for n in range(8)],
            "limit": LIMIT,
        },
        1,
    ),
    (
        "filtered, ne (two thirds)",
        {
            "algorithm": "filtered",
            "filters": [{"attribute": "city", "op": "ne", "value": "rome"}],
            "limit": LIMIT,
        },
        1,
    ),
    (
        "lexical + keyword + filter, all wide",
        {
            "query": "task",
            "keywords": ["half0", "half1"],
            "filters": [{"attribute": "city", "value": "rome"}],
            "limit": LIMIT,
        },
        1,
    ),
)


def build(capabilities: int) -> tuple[Router, Any, str]:
    router = Router(limits=Limits(message_rate=0, registration_rate=0))
    for start in range(0, capabilities, 1000):
        caps = [
            {
                "name": f"skill_{n % 1000}",
                "description": f"does task number {n} well",
                "keywords": [f"kw{n % 500}", "everywhere", f"half{n % 2}"],
                "attributes": {"price": n % 997, "city": ("rome", "paris", "tokyo")[n % 3]},
            }
            for n in range(start, min(start + 1000, capabilities))
        ]
        _join(router, f"p{start // 1000:04d}", caps)
    session, token = _join(router, "asker", [])
    return router, session, token


def measure(router: Router, session: Any, token: str, payload: dict[str, Any], page: int) -> Any:
    """(ms, capabilities, bytes, whether more follows) for the `page`-th page, best of 5."""
    best, answer, size = float("inf"), {}, 0
    for _ in range(5):
        cursor = None
        for _ in range(page):
            body = {**payload, **({"cursor": cursor} if cursor else {})}
            frame = orjson.dumps(
                {
                    "sender_id": "asker",
                    "receiver_id": "global_lobby",
                    "message_type": "DISCOVER_SERVICES",
                    "payload": body,
                    "auth_token": token,
                }
            )
            started = time.perf_counter()
            router.handle(session, frame)
            (send,) = router.answer_query()
            elapsed = time.perf_counter() - started
            assert isinstance(send, Send)
            answer, size = orjson.loads(send.frame)["payload"], len(send.frame)
            cursor = answer.get("next")
        best = min(best, elapsed)
    found = sum(len(s["relevant_capabilities"]) for s in answer.get("services_found", ()))
    return best * 1000, found, size, answer.get("next") is not None, answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.discovery_micro")
    parser.add_argument("--capabilities", type=int, default=100_000)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    started = time.perf_counter()
    router, session, token = build(args.capabilities)
    print(f"{args.capabilities:,} capabilities registered in {time.perf_counter() - started:.0f} s")
    print()
    print("| DISCOVER | ms (best of 5) | capabilities | KiB | next | total |")
    print("|---|---|---|---|---|---|")
    for label, payload, page in QUERIES:
        ms, found, size, more, answer = measure(router, session, token, payload, page)
        total = answer.get("total", "")
        note = " (approximate)" if answer.get("approximate") else ""
        print(
            f"| {label}{note} | {ms:.2f} | {found} | {size / 1024:.0f} | {'yes' if more else 'no'}"
            f" | {'null' if total is None else total} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
