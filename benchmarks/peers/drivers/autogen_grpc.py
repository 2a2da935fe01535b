"""AutoGen's distributed runtime over gRPC (autogen-core + autogen-ext[grpc]), run by
`.venv-peers/autogen/bin/python`: `--host PORT` is the broker (GrpcWorkerAgentRuntimeHost, its
own process); otherwise the driver starts one and runs the patterns through two workers
(GrpcWorkerAgentRuntime): echo agents on one, the askers' calls from the other. A REQUEST is
`send_message` (an RPC through the host), one-way is `publish_message` to a counting agent.
No auth, no persistence: the host forwards in memory."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from autogen_core import (
    AgentId,
    DefaultTopicId,
    MessageContext,
    RoutedAgent,
    default_subscription,
    message_handler,
    try_get_known_serializers_for_type,
)
from autogen_ext.runtimes.grpc import GrpcWorkerAgentRuntime, GrpcWorkerAgentRuntimeHost

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pattern import Window, arguments, emit, request_payload, response_payload


@dataclass
class Request:
    payload: dict[str, Any]


@dataclass
class Response:
    payload: dict[str, Any]


@dataclass
class Note:
    payload: dict[str, Any]


class Echo(RoutedAgent):
    def __init__(self) -> None:
        super().__init__("echo")

    @message_handler
    async def on_request(self, message: Request, ctx: MessageContext) -> Response:
        return Response(response_payload(message.payload.get("n")))


@default_subscription
class Counter(RoutedAgent):
    expected = 0
    done: asyncio.Event

    def __init__(self) -> None:
        super().__init__("counter")
        self.seen = 0

    @message_handler
    async def on_note(self, message: Note, ctx: MessageContext) -> None:
        self.seen += 1
        if self.seen == Counter.expected:
            Counter.done.set()


async def host(port: int) -> None:
    server = GrpcWorkerAgentRuntimeHost(address=f"127.0.0.1:{port}")
    server.start()
    await server.stop_when_signal()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def worker(address: str) -> GrpcWorkerAgentRuntime:
    runtime = GrpcWorkerAgentRuntime(host_address=address)
    for kind in (Request, Response, Note):
        runtime.add_message_serializer(try_get_known_serializers_for_type(kind))
    await runtime.start()
    return runtime


async def ask(runtime: GrpcWorkerAgentRuntime, target: AgentId, n: int) -> list[float]:
    rtts = []
    for i in range(n):
        started = time.perf_counter()
        await runtime.send_message(Request(request_payload(i)), target)
        rtts.append(time.perf_counter() - started)
    return rtts


async def main(broker: subprocess.Popen[bytes], port: int) -> dict[str, Any]:
    args = arguments()
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the gRPC host did not listen within 20 s") from None
                await asyncio.sleep(0.05)
        agents, askers = await worker(address), await worker(address)
        await Echo.register(agents, "echo", Echo)
        Counter.expected, Counter.done = args.one_way, asyncio.Event()
        await Counter.register(agents, "counter", Counter)
        targets = [AgentId("echo", f"e{i}") for i in range(args.pairs)]
        await asyncio.gather(*(ask(askers, t, 5) for t in targets))  # warm-up
        window = Window(broker.pid)
        runs = await asyncio.gather(*(ask(askers, t, args.round_trips) for t in targets))
        rtts = [rtt for run in runs for rtt in run]
        request_response = window.close(2 * len(rtts), rtts)
        window = Window(broker.pid)
        for i in range(args.one_way):
            await askers.publish_message(Note(request_payload(i)), DefaultTopicId())
        await asyncio.wait_for(Counter.done.wait(), 300)
        one_way = window.close(args.one_way)
        await askers.stop()
        await agents.stop()
        return {"request_response": request_response, "one_way": one_way}
    finally:
        broker.terminate()
        broker.wait(10)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--host"]:
        asyncio.run(host(int(sys.argv[2])))
    else:
        port = free_port()
        emit(
            asyncio.run(
                main(subprocess.Popen([sys.executable, __file__, "--host", str(port)]), port)
            )
        )
