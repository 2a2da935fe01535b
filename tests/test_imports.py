"""The layers of DESIGN.md, read from the source: our modules import each other without a cycle,
the transports never reach the server, `protocol` imports nothing of ours, and `lobby` and
`agent_sdk` never import each other (but for one stated door: `lobby.mcp_cli`, the command line
of the MCP bridges, runs `bridges` inside its command, never at import).

Every import counts, at the top of a module or inside a function (the server's lazy import of
a transport is still a dependency), except those under `if TYPE_CHECKING:`, which never run.
"""

from __future__ import annotations

import ast
import graphlib
import importlib.machinery
import importlib.util
import pkgutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import lobby.transport
from lobby.transport import memory

PACKAGES = ("lobby", "protocol", "agent_sdk")


def modules() -> dict[str, Path]:
    """Each module of ours, by name, with its source file."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None
        assert spec.origin is not None
        assert spec.submodule_search_locations is not None
        found[package] = Path(spec.origin)
        for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{package}."):
            finder = info.module_finder
            assert isinstance(finder, importlib.machinery.FileFinder)
            path = Path(finder.path) / info.name.rpartition(".")[2]
            found[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_by(name: str, source: Path, known: set[str]) -> set[str]:
    """The modules of ours that module `name` imports when it runs."""
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for branch in child.orelse:
                    visit(branch)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in child.names:
                    # `from package import module` imports the module; `from module import x`
                    # the module.
                    submodule = f"{base}.{alias.name}"
                    found.add(submodule if submodule in known else base)
            visit(child)

    visit(ast.parse(source.read_text(), str(source)))
    return {module for module in found if module in known and module != name}


@cache
def graph() -> dict[str, frozenset[str]]:
    found = modules()
    known = set(found)
    return {name: frozenset(imported_by(name, path, known)) for name, path in found.items()}


def reachable(start: str) -> set[str]:
    """Every module of ours that importing `start` runs: what it imports, and the packages
    that hold each (their `__init__` runs first)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        parents = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
        for module in graph()[name] | parents:
            if module not in seen:
                seen.add(module)
                todo.append(module)
    return seen - {start}


def test_the_graph_holds_every_module() -> None:
    names = set(graph())
    assert {"lobby.server", "lobby.transport.base", "lobby.transport.picows"} <= names
    assert {"protocol.codec", "agent_sdk.connection"} <= names
    assert "lobby.transport.base" in graph()["lobby.server"]
    assert "lobby.transport.websockets" in graph()["lobby.server"]  # imported in a function


def test_no_import_cycles() -> None:
    try:
        order = list(graphlib.TopologicalSorter(graph()).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' -> '.join(cycle.args[1])}")
    assert set(order) == set(graph())


@pytest.mark.parametrize("transport", ["base", "websockets", "picows", "memory"])
def test_a_transport_never_reaches_the_server(transport: str) -> None:
    reached = reachable(f"lobby.transport.{transport}")
    assert not reached & {"lobby.server", "lobby.committer", "lobby.cli"}
    transports = {module for module in reached if module.startswith("lobby.transport")}
    # The pure RFC 6455 checks are shared by the socket transports; nothing else of them is.
    assert transports <= {"lobby.transport", "lobby.transport.base", "lobby.transport.rfc6455"}


def test_the_transport_interface_is_a_leaf() -> None:
    """At run time `base` needs nothing of ours but its packages (what it names for typing
    only is imported under TYPE_CHECKING)."""
    assert reachable("lobby.transport.base") == {"lobby", "lobby.transport"}


BRIDGE_COMMANDS = {
    "lobby.mcp_cli": {"bridges.mcp", "bridges.mcp_agent", "agent_sdk.errors"},
    "lobby.a2a_cli": {"bridges.a2a_cli"},
}
"""The lobby's commands that run an SDK bridge, and the SDK modules each may import."""


def test_protocol_imports_nothing_of_ours_and_lobby_and_sdk_never_meet() -> None:
    for name, imports in graph().items():
        top = {module.partition(".")[0] for module in imports}
        if name.startswith("protocol"):
            assert top <= {"protocol"}, name
        elif name in BRIDGE_COMMANDS:
            sdk = {module for module in imports if module.startswith("agent_sdk")}
            assert sdk <= BRIDGE_COMMANDS[name] | {"agent_sdk", "bridges"}, name
        elif name.startswith("lobby"):
            assert "agent_sdk" not in top, name
        else:
            assert "lobby" not in top, name


def test_lobby_transport_exports() -> None:
    assert set(lobby.transport.__all__) == {
        "Link",
        "Lobby",
        "Transport",
        "TransportSettings",
        "tls_context",
    }
    assert set(memory.__all__) == {
        "ConnectionClosed",
        "MemoryClient",
        "MemoryTransport",
        "MemoryTransportError",
        "Refused",
    }
    for module in (lobby.transport, memory):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_the_core_loads_no_store_and_no_socket_library() -> None:
    """`import lobby.core`, in a fresh interpreter, loads no store, sqlite or WebSocket module:
    the core knows no persistence and no I/O, at import time too."""
    code = "import lobby.core, sys; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "lobby.core.router" in loaded  # the probe really imported the core
    forbidden = ("lobby.store", "sqlite3", "_sqlite3", "websockets", "picows", "lobby.server")
    # `startswith` catches their submodules too (lobby.store.sqlite, websockets.asyncio, ...).
    assert [m for m in loaded if m in forbidden or m.startswith(forbidden)] == []
