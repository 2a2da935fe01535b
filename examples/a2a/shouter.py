"""A small A2A agent built with the official a2a-sdk: skill `shout` upper-cases `text`, after
one status update saying it started. `lobby a2a join` makes it a lobby agent:

    .venv/bin/python -m examples.a2a.shouter [--port 9001]
    .venv/bin/lobby a2a join --agent-id shouter \
        --card http://127.0.0.1:9001/.well-known/agent-card.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from a2a.helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState
from starlette.applications import Starlette

from bridges.a2a import base_url, bind, serve_http
from bridges.a2a_parts import data_parts, payload_of

PORT = 9001


class Shouter(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        assert context.task_id
        assert context.context_id
        await event_queue.enqueue_event(new_task_from_user_message(message))
        task = TaskUpdater(event_queue, context.task_id, context.context_id)
        text = payload_of(list(message.parts)).get("text")
        if not isinstance(text, str):
            error = {"code": "invalid_input", "error": "shout needs a text"}
            await task.failed(task.new_agent_message(data_parts(error)))
            return
        progress = {"stage": "shouting"}
        await task.update_status(
            TaskState.TASK_STATE_WORKING, task.new_agent_message(data_parts(progress))
        )
        await task.add_artifact(data_parts({"text": text.upper()}), name="result")
        await task.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def app(url: str) -> Starlette:
    """The shouter's HTTP app, its card giving `url` as where it answers."""
    card = AgentCard(
        name="shouter",
        description="Upper-cases text.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["application/json"],
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(id="shout", name="shout", description="Upper-case a text", tags=["text"])
        ],
    )
    handler = DefaultRequestHandler(Shouter(), InMemoryTaskStore(), card)
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])


async def serve(port: int) -> None:
    """Serve the shouter on 127.0.0.1:`port` until interrupted."""
    sock = bind("127.0.0.1", port)
    url = base_url(sock)
    async with serve_http(app(url + "/"), sock):
        print(f"shouter (A2A agent): card at {url}/.well-known/agent-card.json", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The shouter A2A agent.")
    parser.add_argument("--port", type=int, default=PORT, help="(%(default)s)")
    try:
        asyncio.run(serve(parser.parse_args().port))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # a port in use: one line, not a traceback
        sys.exit(f"shouter: cannot listen on port {parser.parse_args().port}: {exc.strerror}")
