"""The layers of DESIGN.md and docs/architecture.md, read from the source: our modules import
each other without a cycle, even for typing; nothing but the command line imports the server
(its satellites take a narrow interface); a transport imports nothing of the core or of the
lobby's configuration, and a store nothing of the core but its records; `protocol` imports
nothing of ours; `lobby` and `agent_sdk` never import each other, and neither imports the
bridges, which sit on top of both (`lobby` finds their commands through entry points); no
module is over 500 lines; and docs/architecture.md names every package.

Every import counts, at the top of a module or inside a function (the server's lazy import of
a transport is still a dependency). What runs is the graph without the imports under
`if TYPE_CHECKING:`; the layering rules hold for the graph with them too.
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

PACKAGES = ("lobby", "protocol", "agent_sdk", "bridges")
ROOT = Path(__file__).parent.parent
MAX_LINES = 500


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


def imported_by(name: str, source: Path, known: set[str], typing: bool = False) -> set[str]:
    """The modules of ours that module `name` imports when it runs (`typing`: and those it
    imports under TYPE_CHECKING)."""
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not typing and isinstance(child, ast.If) and _type_checking(child):
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
def graph(typing: bool = False) -> dict[str, frozenset[str]]:
    found = modules()
    known = set(found)
    return {name: frozenset(imported_by(name, path, known, typing)) for name, path in found.items()}


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
    assert "lobby.transport.websockets_server" in graph()["lobby.server"]  # imported in a function


@pytest.mark.parametrize("typing", [False, True], ids=["run", "typing"])
def test_no_import_cycles(typing: bool) -> None:
    try:
        order = list(graphlib.TopologicalSorter(graph(typing)).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' -> '.join(cycle.args[1])}")
    assert set(order) == set(graph(typing))


def test_the_typing_graph_holds_what_only_typing_imports() -> None:
    """The probe sees TYPE_CHECKING imports: a satellite names its server narrowly, there."""
    assert "lobby.core.router" not in graph()["lobby.metrics"]
    assert "lobby.core.router" in graph(typing=True)["lobby.metrics"]


def test_only_the_command_line_imports_the_server() -> None:
    """The server's satellites (/admin, metrics, observers, the discovery worker, HTTP, ...)
    each take a narrow protocol of what they use; none imports `lobby.server`."""
    importers = {name for name, imports in graph(typing=True).items() if "lobby.server" in imports}
    assert importers == {"lobby.cli"}


def _of(imports: frozenset[str], *prefixes: str) -> set[str]:
    return {m for m in imports if any(m == p or m.startswith(f"{p}.") for p in prefixes)}


def test_a_transport_imports_nothing_of_the_core_or_the_configuration() -> None:
    transports = [name for name in graph() if name.startswith("lobby.transport")]
    assert len(transports) >= 5
    for name in transports:
        assert not _of(graph(typing=True)[name], "lobby.core", "lobby.config"), name


def test_a_store_imports_nothing_of_the_core_but_its_records() -> None:
    stores = [name for name in graph() if name.startswith("lobby.store")]
    assert len(stores) >= 5
    for name in stores:
        imports = graph(typing=True)[name]
        assert _of(imports, "lobby.core") <= {"lobby.core", "lobby.core.records"}, name
        assert not _of(imports, "lobby.config"), name


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_500_lines(package: str) -> None:
    long = {
        name: lines
        for name, path in modules().items()
        if name.partition(".")[0] == package
        and (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_architecture_page_names_every_package() -> None:
    """docs/architecture.md draws the house: each package of it (a folder with an __init__)
    is named there by its path."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    packages = sorted(
        path.parent.relative_to(ROOT).as_posix() + "/"
        for name, path in modules().items()
        if path.name == "__init__.py"
    )
    assert "lobby/core/discovery/" in packages
    assert [package for package in packages if package not in page] == []


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


def test_protocol_lobby_sdk_and_bridges_import_only_what_is_below_them() -> None:
    below = {
        "protocol": {"protocol"},
        "lobby": {"protocol", "lobby"},
        "agent_sdk": {"protocol", "agent_sdk"},
        "bridges": {"protocol", "lobby", "agent_sdk", "bridges"},
    }
    for name, imports in graph(typing=True).items():
        top = {module.partition(".")[0] for module in imports}
        assert top <= below[name.partition(".")[0]], name


def test_lobby_finds_the_bridges_commands_through_entry_points() -> None:
    """`lobby mcp`, `lobby bridge mcp` and `lobby a2a` come from the installed `lobby.commands`
    entry points, and loading them (as `lobby serve` does) loads no SDK and no bridge."""
    code = (
        "import sys; from lobby import extra_commands;"
        "print(sorted(c for e in extra_commands.installed() for c in e.COMMANDS));"
        "print(sorted(m for m in sys.modules if m.startswith(('agent_sdk', 'mcp', 'a2a'))))"
    )
    found, loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert found == str(["a2a", "bridge", "mcp"])
    assert loaded == "[]"


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
