"""agent_sdk/connection.py's `Link.serve` against a real websockets server: every message
reaches `receive` in the order sent, whichever path it took (a whole text frame as it is
parsed, as bytes; the rest through websockets' queue), and a `receive` that raises fails the
connection (1011), is raised from `serve()`, and nothing after it is handed over. The frames
an agent writes itself (`text_frames`) read back as websockets reads a client's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from agent_sdk.connection import INTERNAL_ERROR, Link
from agent_sdk.wire import AgentConnection, text_frames

Script = Callable[[ServerConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def _serving(
    script: Script, receive: Callable[[str | bytes], None]
) -> AsyncIterator[tuple[asyncio.Task[None], asyncio.Future[int | None]]]:
    """A server running `script` once the client says "go" (so its frames come after
    `serve()` started), and the client's `Link.serve(receive)` as a task; the close code
    the server got."""
    closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await script(ws)
        await ws.wait_closed()
        closed.set_result(ws.close_code)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        ws = await connect(
            f"ws://127.0.0.1:{port}", compression=None, create_connection=AgentConnection
        )
        link = Link(ws)  # type: ignore[arg-type]  # made by create_connection
        serving = asyncio.create_task(link.serve(receive))
        await ws.send("go")
        try:
            yield serving, closed
        finally:
            await link.close()


async def test_messages_reach_receive_in_order_whole_fragmented_binary_or_large() -> None:
    async def script(ws: ServerConnection) -> None:
        await ws.send("one")
        await ws.send(["two-", "fragmented"])  # a fragmented text message: websockets' queue
        await ws.send("three")  # may follow the fragments in the queue
        await ws.send(b"four")  # binary: websockets' queue
        await ws.send("five")
        await (await ws.ping())  # answered by websockets, between frames parsed here
        await ws.send("six" * 100_000)  # comes in several reads
        for n in range(100):
            await ws.send(f"many-{n}")
        await ws.close()

    got: list[str | bytes] = []
    async with _serving(script, got.append) as (serving, closed):
        await serving
    assert [f if isinstance(f, str) else f.decode() for f in got] == [
        "one",
        "two-fragmented",
        "three",
        "four",
        "five",
        "six" * 100_000,
        *(f"many-{n}" for n in range(100)),
    ]
    assert got[0] == b"one"  # as parsed, not queued
    assert got[1] == "two-fragmented"  # assembled by websockets
    assert await closed == 1000


async def test_a_receive_that_raises_fails_the_connection_and_is_raised() -> None:
    async def script(ws: ServerConnection) -> None:
        for text in ("one", "two", "three"):
            await ws.send(text)

    got: list[str | bytes] = []

    def receive(frame: str | bytes) -> None:
        if frame == b"two":
            raise ValueError("cannot handle two")
        got.append(frame)

    async with _serving(script, receive) as (serving, closed):
        with pytest.raises(ValueError, match="cannot handle two"):
            await serving
    assert got == [b"one"]  # nothing after the failure is handed over
    assert await closed == INTERNAL_ERROR


def test_text_frames_are_what_websockets_reads_as_masked_final_text_frames() -> None:
    messages = [b"", b"x" * 125, b"y" * 126, "\u00e9".encode() * 40_000, b"z" * 65_536]
    reader = StreamReader()
    reader.feed_data(text_frames(messages))
    parsed = []
    for _ in messages:
        parser = Frame.parse(reader.read_exact, mask=True)
        with pytest.raises(StopIteration) as done:
            next(parser)
        parsed.append(done.value.value)
    assert [(f.opcode, f.fin, f.data) for f in parsed] == [(Opcode.TEXT, True, m) for m in messages]
    assert reader.buffer == b""
