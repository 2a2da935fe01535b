"""An agent-side client generated from protocol/asyncapi-agent.json by @asyncapi/generator's own
client templates, offline, as a team writing an agent would make one: the Python client, driven
through its generated API alone (tests/asyncapi/drive_client.py), registers, discovers an SDK
agent's capability, calls it and acknowledges the answers against a real lobby. The JavaScript
client is generated too and is valid JavaScript; it does not run here, as it requires
@asyncapi/keeper, which the npm registry does not serve to this project
(docs/generated-clients.md)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from examples.js.counterparts import Doubler
from tests.conftest import make_lobby
from tests.nodejs import ROOT, node, npm_installed

TOOLS = ROOT / "tests" / "asyncapi"
AGENT_DOCUMENT = ROOT / "protocol" / "asyncapi-agent.json"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generated-client")
    npm_installed(TOOLS)
    done = subprocess.run(
        [node(), str(TOOLS / "generate-client.mjs"), str(AGENT_DOCUMENT), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_generated_clients_are_named_after_the_document_and_parse(generated: Path) -> None:
    python = (generated / "python" / "client.py").read_text()
    javascript_file = generated / "javascript" / "client.js"
    javascript = javascript_file.read_text()
    assert "\nclass LobbyAgent:\n" in python
    assert "\nclass LobbyAgent {\n" in javascript
    # One generated method per operation of the agent's document, in each language.
    document = orjson.loads(AGENT_DOCUMENT.read_bytes())
    for operation in document["operations"]:
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in operation)
        if operation.startswith("send"):
            assert f"  def {snake}(self, message):" in python, operation
            assert f"  async {operation}(message){{" in javascript, operation
        else:
            assert f"  def register_{snake}_handler(self, handler," in python, operation
    compile(python, "client.py", "exec")
    checked = subprocess.run(
        [node(), "--check", str(javascript_file)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr


async def test_the_generated_python_client_registers_discovers_calls_and_acks(
    generated: Path, tmp_path: Path
) -> None:
    lobby = make_lobby(tmp_path / "lobby-data")
    await lobby.start()
    out = tmp_path / "result.json"
    try:
        async with Doubler(lobby_url=lobby.url):
            process = await asyncio.create_subprocess_exec(
                *(sys.executable, str(TOOLS / "drive_client.py"), str(generated / "python")),
                *(lobby.url, "generated_agent", "double", str(out)),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
    finally:
        await lobby.stop()
    assert process.returncode == 0, (stdout + stderr).decode()[-3000:]
    result = orjson.loads(out.read_bytes())
    assert result["registered"] == "success_registered_finalized"
    assert [s["agent_id"] for s in result["found"]] == ["doubler"]
    assert [c["name"] for c in result["found"][0]["relevant_capabilities"]] == ["double"]
    # ACCEPTED: the lobby stored the REQUEST before it was delivered.
    assert result["accepted"] == {"message_id": result["request_id"]}
    # The Doubler reports progress once, then answers 2 * 21.
    payloads = [r["payload"] for r in result["responses"]]
    assert payloads == [
        {"status": "in_progress", "working_on": 21},
        {"status": "success", "n": 42},
    ]
    # Both answers were acknowledged with the last one's seq: the mailbox holds nothing more.
    assert result["unacknowledged"] == []
    # Every frame the lobby sent was routed to its generated receive handler.
    assert result["unrouted"] == []
