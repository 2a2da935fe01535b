"""Commands other installed packages add to `lobby`, found through the `lobby.commands`
entry-point group: the bridges' `mcp`, `bridge mcp` and `a2a serve | join` (`bridges`), so the
daemon names no package above it and imports none.

An entry point names a module (or any object) with `COMMANDS`, the top-level command names it
adds, `add_commands(commands, parser_class)`, which adds their parsers, and `run(parser,
args)`, which runs one and answers its exit status. Loading one must be cheap: `lobby serve`
loads them all to build its parser, so what a command needs is imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

GROUP = "lobby.commands"


class Commands(Protocol):
    """What an entry point of `GROUP` names."""

    COMMANDS: frozenset[str]

    def add_commands(
        self, commands: argparse._SubParsersAction[Any], parser_class: type[Any]
    ) -> None: ...

    def run(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int: ...


@cache
def installed() -> tuple[Commands, ...]:
    """The commands of every installed entry point of `GROUP`, by entry point name."""
    found = sorted(entry_points(group=GROUP), key=lambda point: point.name)
    return tuple(cast(Commands, point.load()) for point in found)
