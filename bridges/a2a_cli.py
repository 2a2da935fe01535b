"""`lobby a2a serve | join`: run an A2A bridge until SIGINT or SIGTERM. A start that cannot happen
(an unreadable tokens file, a port in use, a card that cannot be read) is one line on stderr and
exit status 2 for a bad flag, 1 otherwise."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import signal
import sys

import httpx
from a2a.client import AgentCardResolutionError

from agent_sdk.errors import AgentSDKError
from bridges.a2a import Gateway, TokensFileError, base_url, bind, load_tokens, serving
from bridges.a2a_join import A2AAgent, fetch_card


def run(args: argparse.Namespace) -> int:
    """Run the `lobby a2a` command `args` asks for; its exit status."""
    try:
        if args.a2a_command == "serve":
            tokens = load_tokens(args.tokens) if args.tokens is not None else {}
            asyncio.run(_serve(args, tokens))
        else:
            asyncio.run(_join(args))
    except TokensFileError as bad:
        sys.stderr.write(f"lobby a2a: {bad}\n")
        return 2
    except OSError as failed:
        sys.stderr.write(f"lobby a2a {args.a2a_command}: {_listen_failure(failed, args)}\n")
        return 1
    except (AgentSDKError, AgentCardResolutionError, httpx.HTTPError) as failed:
        sys.stderr.write(f"lobby a2a {args.a2a_command}: {failed}\n")
        return 1
    return 0


def _listen_failure(error: OSError, args: argparse.Namespace) -> str:
    """A port in use said with its fix (the server's own words name neither flag nor fix)."""
    if error.errno == errno.EADDRINUSE and args.a2a_command == "serve":
        return (
            f"port {args.port} is in use on {args.host}: "
            "stop what holds it, or choose another --port"
        )
    return str(error)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


async def _serve(args: argparse.Namespace, tokens: dict[str, str]) -> None:
    sock = bind(args.host, args.port)
    gateway = Gateway(
        args.agent_id,
        tokens=tokens,
        anonymous=args.anonymous,
        default_agent=args.default_agent,
        lobby_url=args.lobby,
    )
    async with serving(gateway, sock):
        print(f"A2A gateway: {base_url(sock)}/agents/<agent id>/", flush=True)
        if args.default_agent is not None:
            print(f"A2A gateway of {args.default_agent}: {base_url(sock)}/", flush=True)
        await _until_signalled()


async def _join(args: argparse.Namespace) -> None:
    # No read timeout: a skill may take long; the lobby caller's own timeout bounds a call.
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as http:
        card = await fetch_card(args.card, http)
        agent = A2AAgent(args.agent_id, card, http, authorized=args.authorize, lobby_url=args.lobby)
        async with agent:
            skills = ", ".join(agent.capabilities) or "none"
            print(f"joined {card.name!r} as lobby agent {args.agent_id!r}: {skills}", flush=True)
            with contextlib.suppress(asyncio.CancelledError):
                await _until_signalled()
