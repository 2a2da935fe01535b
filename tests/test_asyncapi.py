"""protocol/asyncapi.py and `lobby asyncapi`: the AsyncAPI 3.0 document of the protocol is
generated from the models, committed in sync with them, and accepted by the official AsyncAPI
parser (@asyncapi/parser, run under node), which rejects a broken copy."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from lobby.cli import schema_file_bytes
from lobby.core.router import _LOBBY_ONLY
from protocol.asyncapi import (
    BETWEEN_AGENTS,
    FROM_LOBBY,
    REPLIES,
    TO_LOBBY,
    asyncapi_document,
    delivered_name,
    sent_name,
)
from protocol.models import MessageType
from protocol.payloads import PAYLOAD_MODELS
from tests.nodejs import ROOT, node, npm_installed

COMMITTED = ROOT / "protocol" / "asyncapi.json"
COMMITTED_AGENT = ROOT / "protocol" / "asyncapi-agent.json"
PARSER_DIR = ROOT / "tests" / "asyncapi"


def _drop_capability(doc: dict[str, Any]) -> None:
    del doc["components"]["schemas"]["Capability"]


def _bad_action(doc: dict[str, Any]) -> None:
    doc["operations"]["receiveRegister"]["action"] = "publish"


def _message_missing_from_channel(doc: dict[str, Any]) -> None:
    del doc["channels"]["lobby"]["messages"]["Request"]


def _bad_schema_type(doc: dict[str, Any]) -> None:
    doc["components"]["schemas"]["AckPayload"]["properties"]["up_to"]["type"] = "integr"


CORRUPTIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "dangling_ref": (_drop_capability, "Capability"),
    "bad_action": (_bad_action, "operations/receiveRegister/action"),
    "message_missing_from_channel": (_message_missing_from_channel, "operations/receiveRequest"),
    "bad_schema_type": (_bad_schema_type, "AckPayload"),
}


@dataclass
class ParserRun:
    exit_code: int
    reports: dict[str, dict[str, Any]]
    """File name -> what the parser said of it."""


@pytest.fixture(scope="module")
def parser_run(tmp_path_factory: pytest.TempPathFactory) -> ParserRun:
    """@asyncapi/parser over the committed document and a broken copy per corruption, in one
    node process (each parse costs about a second of CPU; loading the parser more)."""
    directory = tmp_path_factory.mktemp("asyncapi")
    paths = [COMMITTED, COMMITTED_AGENT]
    for name, (corrupt, _) in CORRUPTIONS.items():
        document = copy.deepcopy(asyncapi_document())
        corrupt(document)
        paths.append(directory / f"{name}.json")
        paths[-1].write_bytes(orjson.dumps(document))
    npm_installed(PARSER_DIR)
    done = subprocess.run(
        [node(), str(PARSER_DIR / "validate.mjs"), *map(str, paths)],
        capture_output=True,
        timeout=300,
        check=False,
    )
    reports = [orjson.loads(line) for line in done.stdout.splitlines()]
    return ParserRun(done.returncode, {Path(r["path"]).stem: r for r in reports})


@pytest.mark.parametrize(("view", "committed"), [("lobby", COMMITTED), ("agent", COMMITTED_AGENT)])
def test_committed_documents_match_the_models(view: str, committed: Path) -> None:
    expected = schema_file_bytes(asyncapi_document(view))
    assert committed.read_bytes() == expected, "stale: run `make asyncapi` and commit the result"


def test_lobby_asyncapi_prints_and_writes_the_document(tmp_path: Path) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "lobby", "asyncapi"], capture_output=True, check=True, timeout=30
    )
    assert printed.stdout == COMMITTED.read_bytes()
    target = tmp_path / "asyncapi.json"
    subprocess.run(
        [sys.executable, "-m", "lobby", "asyncapi", "--write", str(target)],
        check=True,
        timeout=30,
    )
    assert target.read_bytes() == COMMITTED.read_bytes()
    agent = subprocess.run(
        [sys.executable, "-m", "lobby", "asyncapi", "--view", "agent"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert agent.stdout == COMMITTED_AGENT.read_bytes()


def _frames_of(union: dict[str, Any]) -> list[str]:
    return [branch["$ref"].rsplit("/", 1)[1] for branch in union["oneOf"]]


def test_every_frame_has_a_named_schema_per_direction_with_its_named_payload() -> None:
    document = asyncapi_document()
    assert sorted({*TO_LOBBY, *FROM_LOBBY, *BETWEEN_AGENTS}) == sorted(MessageType)
    # CANCEL goes both ways: a requester's to the lobby, the lobby's to a provider.
    assert set(TO_LOBBY) & set(FROM_LOBBY) == {MessageType.CANCEL}
    assert set(FROM_LOBBY) - set(TO_LOBBY) == _LOBBY_ONLY, (
        "the lobby-only types are those the router refuses"
    )
    assert (sent_name(MessageType.CANCEL), delivered_name(MessageType.CANCEL)) == (
        "Cancel",
        "CancelDelivered",
    )
    assert document["asyncapi"] == "3.0.0"
    (channel,) = document["channels"].values()
    assert channel["address"] == "/"
    schemas = document["components"]["schemas"]
    sent = {t: sent_name(t) for t in (*TO_LOBBY, *BETWEEN_AGENTS)}
    delivered = {t: delivered_name(t) for t in (*FROM_LOBBY, *BETWEEN_AGENTS)}
    assert sent[MessageType.REGISTER] == "Register"
    assert delivered[MessageType.REGISTER_ACK] == "RegisterAck"
    assert delivered[MessageType.REQUEST] == "RequestDelivered"
    assert sorted(channel["messages"]) == sorted({*sent.values(), *delivered.values()})
    for names, is_sent in ((sent, True), (delivered, False)):
        for message_type, name in names.items():
            message = document["components"]["messages"][name]
            assert message["payload"] == {"$ref": f"#/components/schemas/{name}"}
            frame = schemas[name]
            assert frame["title"] == name
            kind = frame["properties"]["message_type"]["$ref"].rsplit("/", 1)[1]
            assert schemas[kind]["enum"] == [message_type.value]
            model = PAYLOAD_MODELS[message_type].__name__
            assert frame["properties"]["payload"] == {"$ref": f"#/components/schemas/{model}"}
            assert schemas[model]["title"] == model
            # What an agent sends carries its token; what the lobby sends never does.
            assert ("auth_token" in frame["properties"]) == is_sent
            needs_token = is_sent and message_type is not MessageType.REGISTER
            assert ("auth_token" in frame["required"]) == needs_token
            numbered = not is_sent and message_type is not MessageType.ACCEPTED
            assert ("message_id" in frame["required"]) == numbered
            assert ("seq" in frame["properties"]) == (not is_sent)
    assert _frames_of(schemas["AgentFrame"]) == list(sent.values())
    assert _frames_of(schemas["LobbyFrame"]) == list(delivered.values())
    assert schemas["AgentFrame"]["discriminator"] == "message_type"
    assert schemas["Message"]["required"] == ["sender_id", "receiver_id", "message_type", "payload"]


def _no_null_unions(schema: object, path: str = "") -> list[str]:
    """Where a schema still says `anyOf: [T, null]` (generators make odd types of it)."""
    found = []
    if isinstance(schema, dict):
        if {"type": "null"} in schema.get("anyOf", []):
            found.append(path)
        for key, value in schema.items():
            found += _no_null_unions(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            found += _no_null_unions(value, f"{path}/{index}")
    return found


def test_optional_fields_are_plain_types_that_generators_understand() -> None:
    schemas = asyncapi_document()["components"]["schemas"]
    assert _no_null_unions(schemas) == []
    register_ack = schemas["RegisterAck"]["properties"]
    assert register_ack["conversation_id"]["type"] == ["string", "null"]
    assert register_ack["sender_id"] == {"$ref": "#/components/schemas/LobbyId"}
    assert schemas["Register"]["properties"]["receiver_id"] == register_ack["sender_id"]
    assert schemas["LobbyId"]["enum"] == ["global_lobby"]
    assert schemas["CfpPayload"]["properties"]["sealed"]["$ref"].endswith("/SealedTerms")
    assert schemas["Transaction"]["properties"]["kind"]["enum"] == ["negotiation", "payment"]


@pytest.mark.parametrize("view", ["lobby", "agent"])
def test_operations_say_who_sends_what_and_what_answers_it(view: str) -> None:
    operations = asyncapi_document(view)["operations"]
    agent_sends, agent_receives = ("send", "receive") if view == "agent" else ("receive", "send")
    by_action: dict[str, dict[str, Any]] = {"send": {}, "receive": {}}
    for operation_id, operation in operations.items():
        (message,) = operation["messages"]
        name = message["$ref"].rsplit("/", 1)[1]
        assert operation_id == operation["action"] + name
        by_action[operation["action"]][name] = operation
    sent = {sent_name(t): t for t in (*TO_LOBBY, *BETWEEN_AGENTS)}
    assert set(by_action[agent_sends]) == set(sent)
    assert set(by_action[agent_receives]) == {
        delivered_name(t) for t in (*FROM_LOBBY, *BETWEEN_AGENTS)
    }
    register = by_action[agent_sends]["Register"]["reply"]["messages"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in register] == ["RegisterAck", "Error"]
    assert all(("reply" in by_action[agent_sends][n]) == (t in REPLIES) for n, t in sent.items())


@pytest.mark.timeout(300)  # the first user of parser_run pays for one node process's parses
def test_the_official_parser_accepts_the_committed_documents(parser_run: ParserRun) -> None:
    for name in ("asyncapi", "asyncapi-agent"):
        report = parser_run.reports[name]
        assert report["errors"] == []
        assert report["valid"] is True
        both_ways = len(set(TO_LOBBY) & set(FROM_LOBBY))  # CANCEL
        assert report["messages"] == len(MessageType) + len(BETWEEN_AGENTS) + both_ways
        assert report["operations"] == len(asyncapi_document()["operations"])


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
@pytest.mark.timeout(300)
def test_the_official_parser_rejects_a_broken_copy(parser_run: ParserRun, corruption: str) -> None:
    report = parser_run.reports[corruption]
    assert report["valid"] is False
    assert parser_run.exit_code == 1
    where = CORRUPTIONS[corruption][1]
    assert any(where in error["message"] + error["path"] for error in report["errors"])
