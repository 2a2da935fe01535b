"""The A2A gateway's executor: one A2A task is one lobby conversation, over as many turns as
the lobby agent asks for.

A task's first message is a REQUEST (`Agent.converse`); each `in_progress` RESPONSE is a status
update (working, a data part); one that asks for input (`input_required`) parks the task in
`input-required` with the question as its status message. A later message with the task's
`taskId` is the answer: it goes to the agent as INPUT and the task works again. The final
RESPONSE completes the task with the result as a data artifact; an error fails it with
`{"code", "error"}`. The conversation of each live task is kept by task id
(`LobbyExecutor.conversations`); `tasks/cancel` sends the lobby CANCEL for it (the agent is told
to stop) and cancels the task. The gateway's `task_timeout` is the REQUEST's deadline at the
lobby, every turn included. The REQUEST and each INPUT
carry the A2A message's `messageId` at the start of their `message_id` (`lobby_message_id`), so
an agent, and the lobby's log, can tell which A2A message each came from.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Final

from a2a.helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Part, TaskState

from agent_sdk.agent import Agent
from agent_sdk.errors import (
    AgentSDKError,
    RemoteError,
    RequestError,
    RequestRefusedError,
    UnknownReceiverError,
)
from agent_sdk.turns import Conversation, asks
from bridges.a2a_parts import data_parts, payload_of
from protocol.models import ErrorCode, ResponseStatus

CALLER: Final = "lobby_caller"
TARGET: Final = "lobby_target"
CAPABILITY: Final = "lobby_capability"
"""Keys of the call context's state: the caller's Agent, the lobby agent called, the capability."""

DEFAULT_TASK_TIMEOUT: Final = 600.0
"""Seconds a task may take, every turn included, before it fails with `timeout`."""


class LobbyExecutor(AgentExecutor):
    """Runs A2A tasks as lobby conversations through each caller's own lobby connection; owns
    the conversations of the live tasks (`conversations`, at most `max_waiting`: past that, the
    oldest is cancelled and its next message fails the task)."""

    def __init__(
        self, *, task_timeout: float = DEFAULT_TASK_TIMEOUT, max_waiting: int = 10_000
    ) -> None:
        self.task_timeout = task_timeout
        self.max_waiting = max_waiting
        self.conversations: dict[str, Conversation] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        caller: Agent = context.call_context.state[CALLER]
        message = context.message
        assert message is not None
        assert context.task_id
        assert context.context_id
        task = TaskUpdater(event_queue, context.task_id, context.context_id)
        payload = payload_of(list(message.parts))
        conversation = self.conversations.get(context.task_id)
        try:
            message_id = lobby_message_id(message.message_id)
            if conversation is not None:  # the answer to the agent's question
                await conversation.send_input(payload, message_id=message_id)
                await task.start_work()
            elif _waiting(context):
                await task.failed(
                    task.new_agent_message(
                        _error(
                            ErrorCode.UNKNOWN_CONVERSATION,
                            "the lobby conversation of this task is no longer held",
                        )
                    )
                )
                return
            else:
                if context.current_task is None:
                    await event_queue.enqueue_event(new_task_from_user_message(message))
                payload.pop("capability_name", None)
                capability: str = context.call_context.state[CAPABILITY]
                target: str = context.call_context.state[TARGET]
                await task.start_work()
                conversation = await caller.converse(
                    target, capability, payload, timeout=self.task_timeout, message_id=message_id
                )
                self._keep(context.task_id, conversation)
            if await self._turn(conversation, task):
                return  # waiting for input: the conversation stays
        except RemoteError as exc:
            await task.failed(task.new_agent_message(_error(exc.code, exc.message)))
        except RequestRefusedError as exc:
            await task.failed(task.new_agent_message(_error(exc.code, exc.message)))
        except UnknownReceiverError as exc:
            await task.failed(task.new_agent_message(_error(ErrorCode.UNKNOWN_RECEIVER, str(exc))))
        except RequestError as exc:
            await task.failed(task.new_agent_message(_error("timeout", str(exc))))
        self.conversations.pop(context.task_id, None)

    async def _turn(self, conversation: Conversation, task: TaskUpdater) -> bool:
        """Read the conversation until it ends (the task completes: False) or asks (the task
        waits for input: True)."""
        async for answer in conversation:
            if answer.get("status") != ResponseStatus.IN_PROGRESS:
                # The final RESPONSE's payload, its status already taken off.
                await task.add_artifact(data_parts(answer), name="result")
                await task.complete()
                return False
            asked = asks(answer)
            if asked is not None:
                await task.requires_input(task.new_agent_message(data_parts(asked)))
                return True
            update = {k: v for k, v in answer.items() if k != "status"}
            await task.update_status(
                TaskState.TASK_STATE_WORKING, task.new_agent_message(data_parts(update))
            )
        return False

    def _keep(self, task_id: str, conversation: Conversation) -> None:
        self.conversations[task_id] = conversation
        while len(self.conversations) > self.max_waiting:
            oldest = self.conversations.pop(next(iter(self.conversations)))
            oldest.close()  # at the lobby, its deadline (task_timeout) ends it

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id
        assert context.context_id
        conversation = self.conversations.pop(context.task_id, None)
        if conversation is not None:
            with contextlib.suppress(AgentSDKError):  # not connected: its deadline ends it
                await conversation.cancel("the A2A task was cancelled")
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def lobby_message_id(a2a_message_id: str) -> str:
    """The lobby `message_id` of what an A2A message becomes: its `messageId` (at most 200
    characters of it) and a unique suffix, since A2A clients reuse a messageId (the TCK does,
    within a run) where the lobby would take the second message for a resend of the first."""
    return f"{a2a_message_id[:200]}.{uuid.uuid4().hex}"


def _waiting(context: RequestContext) -> bool:
    """Whether the task the message continues waits for input (its conversation is gone)."""
    current = context.current_task
    return current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED


def _error(code: str, error: str) -> list[Part]:
    return data_parts({"code": code, "error": error})
