"""Input schemas enforced by the lobby: compiled at REGISTER / UPDATE_CAPABILITIES / restore,
checked on every REQUEST before it is forwarded. Synchronously (the router), then over real
sockets (raw clients, a restart on the sqlite store, an SDK caller)."""

from __future__ import annotations

import datetime
import decimal
import enum
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, Field
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect

from agent_sdk import Agent, InvalidInputError, RequestContext, capability
from lobby.core import Send
from lobby.core.discovery.schemas import (
    REASON_MAX,
    SHARED_MAX_BYTES,
    InvalidInput,
    check_input_schemas,
    input_check,
    pointer,
)
from lobby.core.records import AgentSaved, Snapshot
from lobby.core.refusal import Refusal
from lobby.core.router import Router
from lobby.server import LobbyServer
from protocol.payloads import Capability
from tests.routerkit import Peer, join, make_router
from tests.wsclient import frame, register, reply, running


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    street: str
    zip: str = Field(pattern=r"^\d{5}$")


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Order(BaseModel):
    """A nested model as the SDK declares it: `$defs` and `$ref`, enums, literals, optionals,
    lists of models, and a pattern with a lookahead."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")
    item: str
    sku: str = Field(default="A-1", pattern=r"^(?=[A-Z])[A-Z]-\d+$")
    quantity: int = Field(ge=1)
    price: decimal.Decimal
    colour: Colour = Colour.RED
    mode: Literal["fast", "cheap"] = "cheap"
    deliver_to: Address
    also_to: list[Address] = []
    notes: dict[str, int] | None = None
    when: datetime.datetime | None = None


ORDER = {
    "item": "lamp",
    "sku": "B-12",
    "quantity": 2,
    "price": "19.90",
    "deliver_to": {"street": "Main St 1", "zip": "12345"},
    "also_to": [{"street": "Side St 2", "zip": "54321"}],
    "notes": {"gift": 1},
}
STRICT = {
    "type": "object",
    "properties": {"item": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["item"],
    "additionalProperties": False,
}


def cap(name: str, schema: dict[str, Any], authorized: list[str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "description": "",
        "input_schema": schema,
        "authorized_requester_ids": authorized,
    }


def call(peer: Peer, arguments: dict[str, Any], conversation: str = "k", name: str = "c") -> None:
    peer.to("bob", "REQUEST", {"capability_name": name, **arguments}, conversation_id=conversation)


def pair(schema: dict[str, Any]) -> tuple[Router, Peer, Peer]:
    router = make_router()
    return router, join(router, "alice"), join(router, "bob", capabilities=[cap("c", schema)])


# -- the router, synchronously -----------------------------------------------------------------


def test_a_request_that_breaks_the_schema_gets_invalid_input_and_is_not_forwarded() -> None:
    router, alice, bob = pair(STRICT)
    call(alice, {"item": 5})
    response = alice.last()
    assert response["message_type"] == "RESPONSE"
    assert response["sender_id"] == "global_lobby"
    assert response["conversation_id"] == "k"
    assert response["payload"] == {
        "status": "error",
        "code": "invalid_input",
        "error": "Invalid input for capability 'c' on agent 'bob' at /item: "
        '5 is not of type "string"',
        "path": "/item",
    }
    assert bob.take() == []
    assert router.conversations == {}
    assert router.registry.agents["alice"].open_requests == 0


def test_a_request_that_fits_is_forwarded_as_sent() -> None:
    router, alice, bob = pair(STRICT)
    call(alice, {"item": "lamp", "n": 3})
    assert bob.last()["payload"] == {"capability_name": "c", "item": "lamp", "n": 3}
    assert alice.take() == []
    assert router.conversations == {("alice", "bob", "k"): 1}


@pytest.mark.parametrize(
    ("arguments", "path", "says"),
    [
        ({}, "", "'item' is a required property"),
        ({"item": "x", "extra": 1}, "", "'extra' was unexpected"),
        ({"item": "x", "n": 1.5}, "/n", "is not of type 'integer'"),
    ],
)
def test_the_refusal_names_the_failing_path_and_reason(
    arguments: dict[str, Any], path: str, says: str
) -> None:
    _, alice, bob = pair(STRICT)
    call(alice, arguments)
    payload = alice.last()["payload"]
    assert payload["code"] == "invalid_input"
    assert payload["path"] == path
    assert (f"at {path}:" if path else "at the top level:") in payload["error"]
    assert says in payload["error"].replace('"', "'")
    assert bob.take() == []


def test_several_errors_are_named_and_a_long_value_is_clipped() -> None:
    _, alice, _ = pair(STRICT)
    call(alice, {"item": "x" * 10_000, "n": "y" * 10_000, "z": 1})
    error = alice.last()["payload"]["error"]
    assert "at /n:" in error
    assert "'z' was unexpected" in error
    assert len(error) < 4 * REASON_MAX


def test_a_sdk_nested_model_compiles_and_validates_through_defs_and_refs() -> None:
    schema = Order.model_json_schema()
    assert "$defs" in schema
    _, alice, bob = pair(schema)
    call(alice, ORDER)
    assert bob.last()["payload"] == {"capability_name": "c", **ORDER}
    bad = {**ORDER, "also_to": [{"street": "x", "zip": "123"}]}
    call(alice, bad, conversation="k2")
    payload = alice.last()["payload"]
    assert payload["path"] == "/also_to/0/zip"
    assert "does not match" in payload["error"]
    call(alice, {**ORDER, "deliver_to": {"street": "x", "zip": "12345", "floor": 3}}, "k3")
    assert alice.last()["payload"]["path"] == "/deliver_to"
    call(alice, {**ORDER, "sku": "a-1"}, conversation="k4")
    assert alice.last()["payload"]["path"] == "/sku"
    call(alice, {**ORDER, "colour": "green"}, conversation="k5")
    assert alice.last()["payload"]["path"] == "/colour"
    assert bob.take() == []


def test_an_unauthorized_requester_learns_nothing_about_the_schema() -> None:
    router = make_router()
    join(router, "bob", capabilities=[cap("c", STRICT, ["friend"])])
    rogue = join(router, "rogue")
    call(rogue, {"item": 5})
    assert rogue.last()["payload"]["code"] == "unauthorized"


def test_an_invalid_schema_is_refused_at_register_and_nothing_is_registered() -> None:
    router = make_router()
    session = router.open()
    register = {
        "sender_id": "bob",
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {"capabilities": [cap("ok", STRICT), cap("bad", {"type": "nope"})]},
    }
    (action,) = router.handle(session, orjson.dumps(register))
    assert isinstance(action, Send)
    error = orjson.loads(action.frame)
    assert error["message_type"] == "ERROR"
    assert error["payload"]["code"] == "malformed"
    assert error["payload"]["error"].startswith(
        "capability 'bad': input_schema is not a valid JSON Schema: "
    )
    assert "(at /type)" in error["payload"]["error"]
    assert router.registry.get("bob") is None
    assert session.agent is None


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "(at /properties/a/type)"),
        ({"type": "string", "pattern": "(["}, "is not a"),
        ({"$ref": "#/$defs/missing"}, "does not exist"),
        ({"$ref": "https://example.com/schema.json"}, "Retrieval is disabled"),
        ({"$ref": "file:///etc/passwd"}, "Retrieval is disabled"),
        ({"$schema": "https://example.com/my-meta", "type": "object"}, "meta-schema"),
        (
            {"required": ["capability_name", "item"]},
            "requires 'capability_name', but it describes a REQUEST's arguments",
        ),
    ],
)
def test_an_invalid_schema_is_refused_at_update_and_the_old_one_stays(
    schema: dict[str, Any], says: str
) -> None:
    router, alice, bob = pair(STRICT)
    bob.send("UPDATE_CAPABILITIES", {"capabilities": [cap("c", schema)]})
    error = bob.last()["payload"]
    assert error["code"] == "malformed"
    assert error["error"].startswith("capability 'c': input_schema ")
    assert says in error["error"]
    assert router.registry.agents["bob"].capabilities["c"].model.input_schema == STRICT
    call(alice, {"item": 5})
    assert alice.last()["payload"]["code"] == "invalid_input"


def test_an_invalid_schema_is_refused_on_resume_and_the_old_one_stays() -> None:
    router, alice, bob = pair(STRICT)
    session = router.open()
    resume = {
        "sender_id": "bob",
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {"capabilities": [cap("c", {"minLength": -1})]},
        "auth_token": bob.token,
    }
    (action,) = router.handle(session, orjson.dumps(resume))
    assert isinstance(action, Send)
    assert orjson.loads(action.frame)["payload"]["code"] == "malformed"
    assert router.registry.agents["bob"].session is bob.session
    call(alice, {"item": 5})
    assert alice.last()["payload"]["code"] == "invalid_input"


def test_update_capabilities_replaces_the_schema_and_its_check() -> None:
    _, alice, bob = pair(STRICT)
    bob.send("UPDATE_CAPABILITIES", {"capabilities": [cap("c", {"required": ["sku"]})]})
    assert bob.take() == []
    call(alice, {"item": "lamp"})
    assert alice.last()["payload"]["path"] == ""
    call(alice, {"sku": 1}, conversation="k2")
    assert bob.last()["payload"] == {"capability_name": "c", "sku": 1}


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"type": "object"},
        {"type": "object", "title": "Empty", "description": "no fields"},
        # What the SDK declares for a model without fields.
        {"properties": {}, "title": "Nothing", "type": "object"},
    ],
)
def test_a_schema_that_accepts_any_object_costs_no_check(schema: dict[str, Any]) -> None:
    capability = Capability(name="c", description="", input_schema=schema)
    assert input_check(capability) is None
    router, alice, bob = pair(schema)
    call(alice, {"anything": [1, 2]})
    assert bob.last()["payload"] == {"capability_name": "c", "anything": [1, 2]}
    assert router.registry.agents["bob"].capabilities["c"].input_check is None


def test_identical_schemas_share_one_compiled_validator() -> None:
    first = input_check(Capability(name="a", description="", input_schema=STRICT))
    second = input_check(Capability(name="b", description="", input_schema=dict(STRICT)))
    assert first is not None
    assert second is not None
    assert first._validator is second._validator
    backwards = input_check(
        Capability(name="c", description="", input_schema=dict(reversed(STRICT.items())))
    )
    assert backwards is not None
    assert backwards._validator is first._validator  # the same schema in another key order


def test_a_schema_is_shared_up_to_its_bound_and_compiled_apart_past_it() -> None:
    def sized(size: int) -> dict[str, Any]:
        schema = {**STRICT, "description": ""}
        padding = size - len(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
        return {**schema, "description": "x" * padding}

    for size, shared in ((SHARED_MAX_BYTES, True), (SHARED_MAX_BYTES + 1, False)):
        checks = [
            input_check(Capability(name=name, description="", input_schema=sized(size)))
            for name in ("a", "b")
        ]
        assert checks[0] is not None
        assert checks[1] is not None
        assert (checks[0]._validator is checks[1]._validator) is shared, size
        assert checks[1].invalid({"item": 5}) is not None  # enforced either way
        assert checks[1].invalid({"item": "tea", "n": 2}) is None


def test_a_stored_schema_that_does_not_compile_is_logged_and_not_enforced() -> None:
    legacy = Capability(name="legacy", description="", input_schema={"type": "nope"})
    with pytest.raises(Refusal) as refused:
        check_input_schemas([legacy])
    with capture_logs() as logs:
        assert input_check(legacy) is None
    problem = refused.value.reason.removeprefix(
        "capability 'legacy': input_schema is not a valid JSON Schema: "
    )
    assert logs == [
        {
            "event": "INPUT_SCHEMA_NOT_ENFORCED",
            "log_level": "warning",
            "capability": "legacy",
            "problem": problem,
        }
    ]


def test_pointers_escape_tilde_and_slash() -> None:
    assert pointer([]) == ""
    assert pointer(["a/b", "c~d", 0]) == "/a~1b/c~0d/0"


def test_schemas_are_compiled_again_when_the_state_is_restored() -> None:
    capabilities = [cap("c", STRICT), cap("legacy", {"type": "nope"})]
    saved = AgentSaved("bob", b"\0" * 32, orjson.dumps(capabilities), False)
    router = make_router()
    router.restore(Snapshot(agents=[saved]))
    entries = router.registry.agents["bob"].capabilities
    assert entries["c"].input_check is not None
    # A schema stored before the lobby compiled schemas is kept but not enforced, so a bad
    # one does not stop the lobby from starting.
    assert entries["legacy"].input_check is None
    alice = join(router, "alice")
    call(alice, {"item": 5})
    assert alice.last()["payload"]["code"] == "invalid_input"
    call(alice, {"x": 1}, conversation="k2", name="legacy")
    assert alice.take() == []
    assert router.conversations == {("alice", "bob", "k2"): 1}


# -- over real sockets ---------------------------------------------------------------------------


async def raw_agent(
    url: str, agent_id: str, capabilities: list[dict[str, Any]] | None = None
) -> tuple[ClientConnection, str]:
    ws = await connect(url)
    ack = await register(ws, agent_id, capabilities=capabilities or [])
    return ws, ack["payload"]["auth_token"]


def request_frame(token: str, conversation: str, **arguments: Any) -> str:
    return frame(
        "alice",
        "REQUEST",
        {"capability_name": "c", **arguments},
        receiver_id="bob",
        conversation_id=conversation,
        auth_token=token,
    )


async def test_over_sockets_a_bad_request_is_refused_and_a_good_one_delivered(
    lobby: LobbyServer,
) -> None:
    bob, _ = await raw_agent(lobby.url, "bob", [cap("c", Order.model_json_schema())])
    alice, token = await raw_agent(lobby.url, "alice")
    async with bob, alice:
        bad = {**ORDER, "deliver_to": {"street": "x"}}
        await alice.send(request_frame(token, "k1", **bad))
        refused = await reply(alice)
        assert refused["message_type"] == "RESPONSE"
        assert refused["conversation_id"] == "k1"
        assert refused["payload"]["code"] == "invalid_input"
        assert refused["payload"]["path"] == "/deliver_to"
        assert "'zip' is a required property" in refused["payload"]["error"].replace('"', "'")
        await alice.send(request_frame(token, "k2", **ORDER))
        # Delivery is in order per sender: the first REQUEST bob sees is the second one.
        delivered = await reply(bob)
        assert delivered["conversation_id"] == "k2"
        assert delivered["payload"] == {"capability_name": "c", **ORDER}
        assert lobby.router.conversations == {("alice", "bob", "k2"): 1}


async def test_over_sockets_an_invalid_schema_is_refused_at_register_and_update(
    lobby: LobbyServer,
) -> None:
    async with connect(lobby.url) as ws:
        refused = await register(ws, "bob", capabilities=[cap("c", {"type": 7})])
        assert refused["message_type"] == "ERROR"
        assert refused["payload"]["code"] == "malformed"
        assert "capability 'c': input_schema" in refused["payload"]["error"]
        token = (await register(ws, "bob", capabilities=[cap("c", STRICT)]))["payload"][
            "auth_token"
        ]
        update = {"capabilities": [cap("c", {"properties": {"x": {"minimum": "0"}}})]}
        await ws.send(frame("bob", "UPDATE_CAPABILITIES", update, auth_token=token))
        error = await reply(ws)
        assert error["payload"]["code"] == "malformed"
        assert "(at /properties/x/minimum)" in error["payload"]["error"]
    assert lobby.router.registry.agents["bob"].capabilities["c"].model.input_schema == STRICT


async def test_schemas_survive_a_restart_on_the_sqlite_store(tmp_path: Path) -> None:
    async with running(tmp_path) as lobby:
        bob, _ = await raw_agent(lobby.url, "bob", [cap("c", STRICT)])
        await bob.close()
    async with running(tmp_path) as lobby:
        alice, token = await raw_agent(lobby.url, "alice")
        async with alice:
            await alice.send(request_frame(token, "k1", item="lamp", extra=True))
            refused = await reply(alice)
            assert refused["payload"]["code"] == "invalid_input"
            assert "'extra' was unexpected" in refused["payload"]["error"]
            await alice.send(request_frame(token, "k2", item="lamp"))
            # A lobby message after it: once its answer is here, the REQUEST was handled.
            await alice.send(frame("alice", "DISCOVER_SERVICES", {}, auth_token=token))
            assert (await reply(alice))["message_type"] == "SERVICES_AVAILABLE"
            assert lobby.router.conversations == {("alice", "bob", "k2"): 1}
            # Held for bob, who is offline.
            assert len(lobby.router.registry.agents["bob"].mailbox) == 1


class Shop(Agent):
    agent_id = "shop"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.orders: list[Order] = []

    @capability("order")
    async def order(self, request: Order, ctx: RequestContext) -> dict[str, Any]:
        self.orders.append(request)
        return {"accepted": True}


async def test_an_sdk_caller_gets_invalid_input_error_from_the_lobby(lobby: LobbyServer) -> None:
    async with Shop(lobby_url=lobby.url) as shop, Agent("buyer", lobby_url=lobby.url) as buyer:
        with pytest.raises(InvalidInputError) as caught:
            await buyer.request("shop", "order", {**ORDER, "quantity": 0})
        assert caught.value.code == "invalid_input"
        # `path` is the lobby's: the shop's own check (pydantic) does not send one.
        assert caught.value.payload["path"] == "/quantity"
        assert "/quantity" in caught.value.message
        assert await buyer.request("shop", "order", ORDER) == {"accepted": True}
        assert [o.item for o in shop.orders] == ["lamp"]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {"type": 5},
            "5 is not valid under any of the schemas listed in the 'anyOf' keyword (at /type)",
        ),
        ({"$ref": "#/nope"}, "Pointer '/nope' does not exist"),  # the schema itself: no "at"
        (
            {"$ref": "http://example.com/x"},
            "Resource 'http://example.com/x' is not present in a registry and retrieving it "
            "failed: Retrieval is disabled, cannot fetch http://example.com/x",
        ),
    ],
)
def test_a_schema_that_does_not_compile_is_refused_with_its_first_problem(
    schema: dict[str, Any], problem: str
) -> None:
    declared = Capability(name="c", description="", input_schema=schema, output_schema={})
    with pytest.raises(Refusal) as refused:
        check_input_schemas([declared])
    assert refused.value.code == "malformed"
    assert refused.value.reason == (
        f"capability 'c': input_schema is not a valid JSON Schema: {problem}"
    )


def test_a_schema_error_is_kept_whole_up_to_its_bound_and_clipped_past_it() -> None:
    declared = Capability(
        name="c",
        description="",
        input_schema={"properties": {"a": {"type": "integer"}}},
        output_schema={},
    )
    check = input_check(declared)
    assert check is not None
    at_bound = check.invalid({"a": "x" * 173})  # '"xx..x" is not of type "integer"': 200
    assert at_bound is not None
    assert at_bound.reason == '"' + "x" * 173 + '" is not of type "integer"'
    past = check.invalid({"a": "x" * 174})
    assert past is not None
    assert past.reason == '"' + "x" * 174 + '" is not of type "inte...'
    assert len(past.reason) == REASON_MAX


def test_a_pattern_that_backtracks_too_long_counts_as_not_matching() -> None:
    """A pattern with lookaround runs with a bound on backtracking (`BACKTRACK_LIMIT`): this
    one tries about 2^n ways to fail its first branch before its second matches."""
    router = make_router()
    pattern = "^(?:(?=a)(a|aa)*c|a+b)$"
    schema = {"properties": {"word": {"type": "string", "pattern": pattern}}}
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c", schema)])
    for n in (10, 20):
        word = "a" * n + "b"
        alice.to("bob", "REQUEST", {"capability_name": "c", "word": word}, conversation_id="k")
    assert [m["payload"]["word"] for m in bob.take()] == ["a" * 10 + "b"]
    assert alice.last()["payload"]["code"] == "invalid_input"


def test_a_refusal_names_at_most_three_errors_each_where_it_is() -> None:
    declared = Capability(
        name="c",
        description="",
        input_schema={
            "properties": {p: {"type": "integer"} for p in "abc"},
            "additionalProperties": False,
        },
        output_schema={},
    )
    check = input_check(declared)
    assert check is not None
    one_inside_one_at_the_top = check.invalid({"capability_name": "c", "a": "1", "zz": 1})
    assert one_inside_one_at_the_top == InvalidInput(
        "/a",
        '"1" is not of type "integer"; at the top level: Additional properties are not '
        "allowed ('zz' was unexpected)",
    )
    four = check.invalid({"capability_name": "c", "a": "1", "b": "2", "c": "3", "zz": 1})
    assert four is not None
    assert four.reason == (
        '"1" is not of type "integer"; at /b: "2" is not of type "integer"; '
        'at /c: "3" is not of type "integer"'
    )
