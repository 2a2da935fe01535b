"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor, or a
page left out of the nav, fails it), and the Python blocks of its pages run as README.md's do:
each whole program twice against one durable lobby, printing the output the page shows;
fragments are marked as such (tests/docblocks.py)."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.conftest import start_lobby_process
from tests.docblocks import ROOT, program_env, programs, python_blocks, run_once, someone_else

PAGES = sorted((ROOT / "docs").glob("*.md"))


def hooks() -> ModuleType:
    """docs/hooks.py, which MkDocs loads by its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_of_an_included_file_are_made_relative_to_the_page() -> None:
    relink = hooks().relink
    # From README.md (the repository's root) into docs/index.md: pages stay links...
    assert relink("[p](PROTOCOL.md#4-x)", "README.md", "docs/index.md") == "[p](protocol.md#4-x)"
    assert relink("[s](docs/sdk.md#a)", "README.md", "docs/index.md") == "[s](sdk.md#a)"
    # ...a file the site does not publish becomes its path in code, code blocks are left alone.
    assert relink("[`e.py`](examples/e.py)", "README.md", "docs/index.md") == "`e.py`"
    assert relink("[it](examples/e.py)", "README.md", "docs/x.md") == "it (`examples/e.py`)"
    fenced = "```md\n[p](PROTOCOL.md)\n```\n"
    assert relink(fenced, "README.md", "docs/index.md") == fenced
    # From examples/js/README.md, relative to its own directory; web links are kept.
    assert relink("[P](../../PROTOCOL.md)", "examples/js/README.md", "docs/node-agent.md") == (
        "[P](protocol.md)"
    )
    assert relink("[w](https://a2a-protocol.org)", "README.md", "docs/a.md") == (
        "[w](https://a2a-protocol.org)"
    )


def test_an_include_takes_a_whole_file_or_one_marked_section() -> None:
    expand = hooks().expand
    page = expand('--8<-- "README.md:first-agent"', "docs/getting-started.md")
    assert page.startswith("Save this agent")
    assert "--8<--" not in page
    assert "class EchoAgent(Agent):" in page
    assert expand('--8<-- "PROTOCOL.md"', "docs/protocol.md").startswith("# The Agent Lobby")


def test_make_docs_builds_the_site_strictly(tmp_path: Path) -> None:
    # `make docs` itself, with this venv (installed already: its stamp is not remade).
    venv = Path(sys.prefix)
    site = tmp_path / "site"
    make = ["make", "--no-print-directory", "-o", f"{venv}/.installed-dev"]
    done = subprocess.run(
        [*make, "docs", f"VENV={venv}", f"SITE={site}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mkdocs build --strict" in done.stdout
    assert "WARNING" not in done.stderr, done.stderr
    # The included files and the API reference are there, not just their pages' titles.
    assert "1. Connecting" in (site / "protocol.html").read_text()
    assert "FileTokenStore" in (site / "reference.html").read_text()
    assert "the echo agent is online" in (site / "getting-started.html").read_text()


def test_every_python_block_is_a_program_or_marked_as_a_fragment() -> None:
    fragments = 0
    for page in PAGES:
        text = page.read_text()
        assert "```py\n" not in text, f"{page.name}: write ```python, a program or marked"
        blocks = python_blocks(page)
        assert text.count("```python\n") == len(blocks), f"{page.name}: a block not read"
        fragments += sum(not whole for whole, _, _ in blocks)
    assert fragments >= 2  # the SDK guide's OutOfStock and policy fragments


def test_every_docs_program_runs_twice_against_one_durable_lobby(tmp_path: Path) -> None:
    found = [program for page in PAGES for program in programs(page)]
    assert {p.source for p in found} >= {"docs/negotiation.md"}
    assert all(p.output for p in found if "print(" in p.code), "a program's output is not shown"
    data_dir = tmp_path / "data"
    lobby = start_lobby_process(data_dir)
    try:
        env = program_env(lobby, tmp_path / "state")
        with someone_else(lobby, tmp_path, env):  # a lobby that already holds other agents
            for _ in range(2):
                run_once(lobby, found, tmp_path, env)
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(10)
