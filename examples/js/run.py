"""The Node.js agent (agent.mjs) with its SDK counterparts against one lobby: it calls
`doubler`, serves `js_caller` and buys from seller `s`; its JSON lines, then what the
counterparts saw. Needs Node.js 18 or newer and the agent's packages (`cd examples/js && npm
ci`, or `make node-deps`).

    .venv/bin/python -m examples.js.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
from pathlib import Path

from agent_sdk import Agent
from examples.fipa_haggle.run import Seller
from examples.js.counterparts import Doubler, call_js_agent

HERE = Path(__file__).parent


def node() -> str | None:
    """The `node` on PATH, else the one `make node-deps` put beside the venv's python."""
    return shutil.which("node") or shutil.which("node", path=str(Path(sys.executable).parent))


async def main(lobby_url: str) -> int:
    found = node()
    if found is None:
        print("examples.js needs Node.js 18 or newer: install it, or `make node-deps`")
        return 1
    if not (HERE / "node_modules" / "ws").is_dir():
        print("examples.js needs its packages: cd examples/js && npm ci (or `make node-deps`)")
        return 1
    async with (
        Doubler(lobby_url=lobby_url) as doubler,
        Seller(lobby_url=lobby_url) as seller,
        Agent("js_caller", lobby_url=lobby_url) as caller,
    ):
        # Run from its directory, as its README does (its token is kept per lobby identity).
        js_agent = await asyncio.create_subprocess_exec(
            found, "agent.mjs", lobby_url, cwd=HERE, stdout=asyncio.subprocess.PIPE
        )
        try:
            reversed_ = await call_js_agent(caller, "hello lobby")
            out, _ = await asyncio.wait_for(js_agent.communicate(), 40)
            sold = await asyncio.wait_for(seller.confirmed, 5)
        finally:
            with contextlib.suppress(ProcessLookupError):
                js_agent.kill()
            await js_agent.wait()
            # Leave for good, so that the next run can register these ids again.
            for agent in (doubler, seller, caller):
                await agent.unregister()
    sys.stdout.write(out.decode())
    print(f"js_caller called reverse: {reversed_}")
    print(f"s sold {sold['goods']} to {sold['buyer']} at {sold['amount']}")
    return js_agent.returncode or 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    sys.exit(asyncio.run(main(parser.parse_args().lobby_url)))
