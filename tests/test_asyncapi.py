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
from protocol.asyncapi import BETWEEN_AGENTS, FROM_LOBBY, REPLIES, TO_LOBBY, asyncapi_document
from protocol.models import MessageType
from protocol.payloads import PAYLOAD_MODELS
from tests.nodejs import ROOT, node, npm_installed

COMMITTED = ROOT / "protocol" / "asyncapi.json"
PARSER_DIR = ROOT / "tests" / "asyncapi"


def _drop_capability(doc: dict[str, Any]) -> None:
    del doc["components"]["schemas"]["Capability"]


def _bad_action(doc: dict[str, Any]) -> None:
    doc["operations"]["receiveREGISTER"]["action"] = "publish"


def _message_missing_from_channel(doc: dict[str, Any]) -> None:
    del doc["channels"]["lobby"]["messages"]["REQUEST"]


def _bad_schema_type(doc: dict[str, Any]) -> None:
    doc["components"]["schemas"]["AckPayload"]["properties"]["up_to"]["type"] = "integr"


CORRUPTIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "dangling_ref": (_drop_capability, "Capability"),
    "bad_action": (_bad_action, "operations/receiveREGISTER/action"),
    "message_missing_from_channel": (_message_missing_from_channel, "operations/receiveREQUEST"),
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
    paths = [COMMITTED]
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


def test_committed_document_matches_the_models() -> None:
    expected = schema_file_bytes(asyncapi_document())
    assert COMMITTED.read_bytes() == expected, "stale: run `make asyncapi` and commit the result"


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


def test_every_message_type_is_described_once_with_its_payload_schema() -> None:
    document = asyncapi_document()
    assert sorted((*TO_LOBBY, *FROM_LOBBY, *BETWEEN_AGENTS)) == sorted(MessageType)
    assert set(FROM_LOBBY) == _LOBBY_ONLY, "the lobby-only types are those the router refuses"
    assert document["asyncapi"] == "3.0.0"
    (channel,) = document["channels"].values()
    assert channel["address"] == "/"
    assert sorted(channel["messages"]) == sorted(t.value for t in MessageType)
    schemas = document["components"]["schemas"]
    for message_type, model in PAYLOAD_MODELS.items():
        message = document["components"]["messages"][message_type.value]
        envelope, specific = message["payload"]["allOf"]
        assert envelope == {"$ref": "#/components/schemas/Message"}
        assert specific["properties"]["message_type"]["const"] == message_type.value
        assert specific["properties"]["payload"] == {
            "$ref": f"#/components/schemas/{model.__name__}"
        }
        assert schemas[model.__name__]["title"] == model.__name__
    assert schemas["Message"]["required"] == ["sender_id", "receiver_id", "message_type", "payload"]


def test_operations_say_who_sends_what_and_what_answers_it() -> None:
    operations = asyncapi_document()["operations"]
    received = {
        o["messages"][0]["$ref"].rsplit("/", 1)[1]: o
        for o in operations.values()
        if o["action"] == "receive"
    }
    sent = {
        o["messages"][0]["$ref"].rsplit("/", 1)[1]
        for o in operations.values()
        if o["action"] == "send"
    }
    assert set(received) == {t.value for t in (*TO_LOBBY, *BETWEEN_AGENTS)}
    assert sent == {t.value for t in (*FROM_LOBBY, *BETWEEN_AGENTS)}
    register = received["REGISTER"]["reply"]["messages"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in register] == ["REGISTER_ACK", "ERROR"]
    assert all(
        ("reply" in received[t.value]) == (t in REPLIES) for t in (*TO_LOBBY, *BETWEEN_AGENTS)
    )


@pytest.mark.timeout(300)  # the first user of parser_run pays for one node process's parses
def test_the_official_parser_accepts_the_committed_document(parser_run: ParserRun) -> None:
    report = parser_run.reports["asyncapi"]
    assert report["errors"] == []
    assert report["valid"] is True
    assert report["messages"] == len(MessageType)
    assert report["operations"] == len(asyncapi_document()["operations"])


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
@pytest.mark.timeout(300)
def test_the_official_parser_rejects_a_broken_copy(parser_run: ParserRun, corruption: str) -> None:
    report = parser_run.reports[corruption]
    assert report["valid"] is False
    assert parser_run.exit_code == 1
    where = CORRUPTIONS[corruption][1]
    assert any(where in error["message"] + error["path"] for error in report["errors"])
