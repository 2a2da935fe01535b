"""The lobby's own work per message, in process, without sockets: `python -m benchmarks.micro`.

`Router.handle` for REQUEST then RESPONSE (the frames of `load.throughput`), and the pieces it is
made of (decode, the token's SHA-256, encode), next to what the transport costs per message in
`websockets`' own sans-I/O code (parse one masked client frame, frame one reply): so the
profile's shares can be checked against plain timings. Best of 5 rounds of 20,000 messages.
"""

from __future__ import annotations

import gc
import hmac
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from benchmarks.addressed import addressed_request
from benchmarks.load import CAPABILITY, SCHEMA_CAPABILITY, request, response
from lobby.core import Router, Send, Session
from lobby.core.discovery.schemas import input_check
from lobby.core.limits import Limits
from lobby.core.refusal import hash_token
from lobby.core.tracing import Tracing
from protocol import tracecontext
from protocol.codec import decode, encode
from protocol.payloads import Capability

ROUNDS = 5
N = 20_000


def best_us(work: Callable[[int], None], n: int = N) -> float:
    """Microseconds per item of `work(n)`, the best of ROUNDS rounds."""
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter_ns()
        work(n)
        best = min(best, (time.perf_counter_ns() - started) / n / 1000)
    return best


def per_call(call: Callable[[], object]) -> float:
    def work(n: int) -> None:
        for _ in range(n):
            call()

    return best_us(work)


def _join(router: Router, agent_id: str, capabilities: list[Any]) -> tuple[Session, str]:
    session = router.open(agent_id)
    frame = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {"capabilities": capabilities},
    }
    (ack,) = router.handle(session, orjson.dumps(frame).decode())
    assert isinstance(ack, Send)
    return session, orjson.loads(ack.frame)["payload"]["auth_token"]


def router_round_trip(
    gc_on: bool,
    capability: dict[str, Any] = CAPABILITY,
    *,
    trace_ids: bool = False,
    traceparent: bool = False,
    addressed: bool = False,
) -> float:
    """us per message of Router.handle over REQUEST+RESPONSE pairs (the journal taken every
    500 messages, as the committer would); with `trace_ids` the lobby starts a trace for each
    REQUEST, with `traceparent` each REQUEST comes with one; `addressed`: each REQUEST to
    `global_lobby` by capability (PROTOCOL.md 5.1), one provider offering it."""
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0),
        tracing=Tracing(start_traces=trace_ids),
    )
    caller, ctoken = _join(router, "caller", [])
    echo, etoken = _join(router, "echo", [capability])
    caller.link = echo.link = object()
    turn = [0]

    def work(n: int) -> None:
        base = turn[0]
        turn[0] += n
        frames = []
        for i in range(base, base + n // 2):
            req = request("caller", "echo", ctoken, i)
            if addressed:
                req = addressed_request("caller", capability["name"], ctoken, i)
            if traceparent:
                req = req[:-1] + b',"traceparent":"%s"}' % tracecontext.start().encode()
            frames.append((caller, req.decode()))
            frames.append((echo, response("echo", etoken, orjson.loads(req)).decode()))
        handle, take_journal = router.handle, router.take_journal
        if not gc_on:
            gc.disable()
        try:
            started = time.perf_counter_ns()
            for k, (session, frame) in enumerate(frames):
                handle(session, frame)
                if k % 500 == 499:
                    take_journal()
            spent[0] = time.perf_counter_ns() - started
        finally:
            gc.enable()

    spent = [0]
    best = float("inf")
    for _ in range(ROUNDS):
        work(N)
        best = min(best, spent[0] / N / 1000)
    return best


def pieces() -> dict[str, float]:
    frame = request("caller", "echo", "7c1f0d4e-8a8e-4a51-9a0b-0d4bb0c7a0f1", 42).decode()
    msg = decode(frame)
    token = msg.auth_token or ""
    digest = hash_token(token)
    check = input_check(Capability.model_validate(SCHEMA_CAPABILITY))
    assert check is not None
    arguments = msg.payload
    return {
        "input schema check (load.EchoInput, copy without capability_name included)": per_call(
            lambda: check.invalid(arguments)
        ),
        "orjson.loads": per_call(lambda: orjson.loads(frame)),
        "decode (loads + envelope checks)": per_call(lambda: decode(frame)),
        "token SHA-256 + compare_digest": per_call(
            lambda: hmac.compare_digest(hash_token(token), digest)
        ),
        "encode (to_dict + orjson.dumps)": per_call(lambda: encode(msg)),
    }


def websockets_framing() -> dict[str, float]:
    """The transport's own Python work per message: parse one masked text frame as a server,
    and frame one text message for sending."""
    payload = request("caller", "echo", "7c1f0d4e-8a8e-4a51-9a0b-0d4bb0c7a0f1", 42)
    client_frame = Frame(Opcode.TEXT, payload).serialize(mask=True, extensions=[])
    server = ServerProtocol(state=State.OPEN, max_size=None)
    server.state = State.OPEN

    def parse(n: int) -> None:
        for _ in range(n):
            server.receive_data(client_frame)
            server.events_received()

    def send(n: int) -> None:
        for _ in range(n):
            server.send_text(payload)
            server.data_to_send()

    return {
        "websockets: parse one frame": best_us(parse),
        "websockets: frame one reply": best_us(send),
    }


class _Discarding:
    """A link that takes no frames (as a closing connection does): what is measured is the
    observer's own work, not the transport's."""

    remote = ""

    def put(self, frame: bytes) -> bool:
        return False


def observers() -> dict[str, float]:
    """What the observer stream costs per routed message: the one test `LobbyServer.received`
    makes while nobody observes, and the observer's work while one does (a summary of a
    REQUEST, its ring, its event encoded for the observer)."""
    from dataclasses import replace

    from lobby.config import Settings
    from lobby.server import LobbyServer

    server = LobbyServer(replace(Settings(), store="memory"))
    observing = server.observers.sessions
    frame = request("caller", "echo", "7c1f0d4e-8a8e-4a51-9a0b-0d4bb0c7a0f1", 42)

    def nobody(n: int) -> None:
        for _ in range(n):
            if observing:
                pass

    watcher = Session(link=_Discarding())
    sender = Session()
    observing.add(watcher)
    routed = server.observers.routed
    return {
        "observer test per message, nobody observing": best_us(nobody),
        "observer work per message, one observing": per_call(lambda: routed(sender, frame, [])),
    }


def main() -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results = {
        "Router.handle per message (REQUEST/RESPONSE), gc on": router_round_trip(True),
        "Router.handle per message (REQUEST/RESPONSE), gc off": router_round_trip(False),
        "Router.handle per message, REQUESTs to global_lobby by capability, gc off": (
            router_round_trip(False, addressed=True)
        ),
        "Router.handle per message, REQUESTs checked against an input schema, gc off": (
            router_round_trip(False, SCHEMA_CAPABILITY)
        ),
        "Router.handle per message, --trace-ids (the lobby starts each REQUEST's trace), gc off": (
            router_round_trip(False, trace_ids=True)
        ),
        "Router.handle per message, REQUESTs sent with a traceparent, gc off": (
            router_round_trip(False, traceparent=True)
        ),
        **pieces(),
        **websockets_framing(),
        **observers(),
    }
    print("| in process, no sockets | us |\n|---|---|")
    for name, us in results.items():
        print(f"| {name} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
