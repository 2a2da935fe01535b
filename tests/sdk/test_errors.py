"""agent_sdk/errors.py: one exception tree that holds. Every `raise` in the SDK's source raises
an `AgentSDKError` (read from the ast), and each failure a user meets over a real lobby
arrives as its own class: a remote error by its code, a capability's timeout, an illegal move
with its rule, a dialogue's silence, an answer that does not fit its model."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import agent_sdk
from agent_sdk import (
    Agent,
    AgentSDKError,
    CapabilityError,
    DialogueHandle,
    IllegalMoveError,
    MoveTimeoutError,
    PayloadError,
    RemoteError,
    RequestContext,
    capability,
)
from agent_sdk.errors import (
    AgentIdTakenError,
    DialogueEndedError,
    LobbyError,
    RegistrationError,
    RequestRefusedError,
    UnknownReceiverError,
    refused_error,
    remote_error,
    with_code,
)
from lobby.server import LobbyServer

SDK = Path(agent_sdk.__file__).parent

ALLOWED_OUTSIDE_THE_TREE = {
    # Bugs in the caller's own code, raised at once where they are made (as Python does):
    # declaring a capability on a sync function or one without a request parameter, a handler
    # returning something that is no payload (answered `internal`), an agent without an id,
    # run() twice at once. They are to be fixed, not caught.
    "TypeError",
    "ValueError",
    "RuntimeError",
    # Bidder.bid() and execute() are abstract: a subclass must write them.
    "NotImplementedError",
    # run_forever() is a script's entry point: it ends the script with one line (status 1).
    "SystemExit",
    # connection.py's signal to back off and register again; caught where it is raised.
    "_RetryLater",
    # The end of an `async for` over a watch that was closed (the iterator protocol).
    # turns.Conversation is an async iterator: the end of its iteration.
    "StopAsyncIteration",
}


class RaiseSite:
    def __init__(self, path: Path, node: ast.Raise) -> None:
        self.path, self.node = path, node

    def __repr__(self) -> str:
        return f"{self.path.name}:{self.node.lineno}: {ast.unparse(self.node)}"


def raise_sites() -> list[RaiseSite]:
    sites = []
    for path in sorted(SDK.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise):
                sites.append(RaiseSite(path, node))
    return sites


def returned_class(function_name: str) -> type | None:
    """The class a function or method of the SDK named so says it returns, if one does."""
    for path in SDK.glob("*.py"):
        module = importlib.import_module(f"agent_sdk.{path.stem}")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name == function_name and node.returns is not None:
                found = vars(module).get(ast.unparse(node.returns))
                if isinstance(found, type):
                    return found
    return None


def raised_class(site: RaiseSite) -> type | str | None:
    """What a `raise` raises: a class, the name of an allowed one, or None for a re-raise."""
    exc = site.node.exc
    if exc is None:
        return None  # a bare `raise`: re-raises what was caught
    target = exc.func if isinstance(exc, ast.Call) else exc
    name = target.attr if isinstance(target, ast.Attribute) else ast.unparse(target)
    if name in ALLOWED_OUTSIDE_THE_TREE:
        return name
    module = importlib.import_module(f"agent_sdk.{site.path.stem}")
    found = vars(module).get(name, getattr(builtins, name, None))
    if isinstance(found, type):
        return found
    made = returned_class(name)  # e.g. `raise self._identity.refusal(...)`
    assert made is not None, f"cannot tell what {site} raises"
    return made


def test_every_raise_in_the_sdk_raises_inside_the_tree() -> None:
    sites = raise_sites()
    assert len(sites) > 20  # the walk found the SDK's source
    outside = []
    for site in sites:
        raised = raised_class(site)
        if isinstance(raised, type) and not issubclass(raised, AgentSDKError):
            outside.append(site)
    assert outside == []


def test_each_allowed_exception_is_still_raised_somewhere() -> None:
    """The allow-list holds only what the source needs."""
    raised = {raised_class(site) for site in raise_sites()}
    assert raised >= ALLOWED_OUTSIDE_THE_TREE


class OutOfStock(RemoteError, code="out_of_stock"):
    """What a caller catches when the shop answers code `out_of_stock`."""


def test_a_remote_error_is_the_class_declared_for_its_code() -> None:
    error = remote_error({"status": "error", "code": "out_of_stock", "error": "none left"})
    assert type(error) is OutOfStock
    assert (error.code, error.message) == ("out_of_stock", "none left")
    assert type(remote_error({"code": "no_such_code", "error": "?"})) is RemoteError


def test_a_class_declared_later_is_raised_for_its_code_and_one_without_code_for_none() -> None:
    class Sold(RemoteError, code="sold_out_today"):
        pass

    class Plain(RemoteError):
        pass

    assert type(remote_error({"code": "sold_out_today", "error": "gone"})) is Sold
    assert type(remote_error({"error": "no code"})) is RemoteError  # Plain took no code


def test_an_error_names_its_code_once() -> None:
    assert with_code("unauthorized", "Unauthorized: Agent 'a' may not") == (
        "unauthorized: Agent 'a' may not"
    )
    assert with_code("capability_not_found", "Capability not found: 'x'") == (
        "capability_not_found: 'x'"
    )
    assert with_code("out_of_stock", "none left: try later") == (
        "out_of_stock: none left: try later"
    )
    assert str(RequestRefusedError("mailbox_full", "Mailbox full: 'b'")) == "mailbox_full: 'b'"


def test_a_remote_error_without_code_or_text_says_so_and_keeps_its_payload() -> None:
    bare = remote_error({"status": "error"})
    assert (bare.code, bare.message, str(bare)) == (
        "error",
        "the request failed",
        "error: the request failed",
    )
    assert bare.payload == {"status": "error"}
    worded = remote_error({"code": "x", "message": "from message"})
    assert (worded.message, worded.payload) == (
        "from message",
        {"code": "x", "message": "from message"},
    )
    both = remote_error({"code": "x", "error": "from error", "message": "from message"})
    assert both.message == "from error"
    assert RemoteError("x", "text").payload == {}


def test_a_refusal_from_the_lobby_is_unknown_receiver_or_a_refused_request() -> None:
    unknown = refused_error("unknown_receiver", "no agent 'x'")
    assert (type(unknown), str(unknown)) == (UnknownReceiverError, "unknown_receiver: no agent 'x'")
    refused = refused_error("mailbox_full", "the mailbox is full")
    assert type(refused) is RequestRefusedError
    assert (refused.code, refused.message, str(refused)) == (
        "mailbox_full",
        "the mailbox is full",
        "mailbox_full: the mailbox is full",
    )


def test_each_error_keeps_its_fields_and_says_them_in_its_text() -> None:
    for error_class in (RegistrationError, LobbyError, RequestRefusedError):
        error = error_class("some_code", "what happened")
        assert (error.code, error.message, str(error)) == (
            "some_code",
            "what happened",
            "some_code: what happened",
        )
    taken = AgentIdTakenError("held elsewhere", agent_id="shop", source="a file")
    assert (taken.code, taken.message, taken.agent_id, taken.source, str(taken)) == (
        "agent_id_taken",
        "held elsewhere",
        "shop",
        "a file",
        "agent_id_taken: held elsewhere",
    )
    payload = PayloadError("does not fit", [{"loc": ["price"]}])
    assert (str(payload), payload.errors, PayloadError("no").errors) == (
        "does not fit",
        [{"loc": ["price"]}],
        [],
    )
    illegal = IllegalMoveError("turn_taking", "not your turn")
    assert (illegal.rule, illegal.reason, str(illegal)) == (
        "turn_taking",
        "not your turn",
        "not your turn (rule: turn_taking)",
    )
    ended = DialogueEndedError("declined", kind="DECLINE")
    assert (str(ended), ended.kind) == ("declined", "DECLINE")
    chosen = CapabilityError("none left", code="out_of_stock")
    assert (chosen.code, chosen.message, str(chosen)) == ("out_of_stock", "none left", "none left")
    assert CapabilityError("oops").code == "error"


class Item(BaseModel):
    name: str


class Quote(BaseModel):
    price: int


class Shop(Agent):
    agent_id = "shop"

    @capability("quote")
    async def quote(self, request: Item, ctx: RequestContext) -> dict[str, Any]:
        if request.name != "apple":
            raise CapabilityError(f"no {request.name!r} here", code="out_of_stock")
        return {"price": "twelve"}  # not what a Quote holds

    async def on_cfp(self, dialogue: DialogueHandle, query: dict[str, Any]) -> None:
        pass  # never answers


async def test_failures_over_a_lobby_arrive_as_their_own_classes(lobby: LobbyServer) -> None:
    async with Shop(lobby_url=lobby.url), Agent("buyer", lobby_url=lobby.url) as buyer:
        with pytest.raises(OutOfStock) as out:
            await buyer.request("shop", "quote", Item(name="pear"), timeout=5)
        assert out.value.message == "no 'pear' here"
        with pytest.raises(PayloadError) as unfit:
            await buyer.request("shop", "quote", Item(name="apple"), output_type=Quote)
        assert "Quote" in str(unfit.value)
        assert unfit.value.errors[0]["loc"] == ("price",)
        dialogue = await buyer.cfp("shop", {"goods": "apples"})
        with pytest.raises(MoveTimeoutError) as silent:
            await dialogue.next_move(timeout=0.2)
        assert isinstance(silent.value, TimeoutError)
        with pytest.raises(IllegalMoveError) as illegal:
            await dialogue.accept()  # nothing was proposed
        assert illegal.value.rule == "turn_taking"
        with pytest.raises(IllegalMoveError) as reused:
            await buyer.cfp("shop", {"goods": "pears"}, dialogue_id=dialogue.dialogue_id)
        assert reused.value.rule == "conversation_id_in_use"
        for caught in (out, unfit, silent, illegal, reused):
            assert isinstance(caught.value, AgentSDKError)
