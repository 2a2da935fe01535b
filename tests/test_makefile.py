"""The Makefile's set-up as a newcomer meets it: a Python too old is named, a broken venv is made
again, and `make run EXTRAS=...` installs the extras from this checkout. Run with `make -n`
where a real install would take minutes: what make would do is what is checked."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from lobby.extras import install_hint

ROOT = Path(__file__).parent.parent

# Stands for a Python older than 3.11: its version, and a failed version check.
OLD_PYTHON = """#!/bin/sh
[ "$1" = "--version" ] && { echo "Python 3.10.12"; exit 0; }
exit 1
"""


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_python_too_old_is_named_and_leaves_no_venv(tmp_path: Path) -> None:
    old = tmp_path / "python3.10"
    old.write_text(OLD_PYTHON)
    old.chmod(0o755)
    venv = tmp_path / "venv"
    done = make("run", f"PYTHON={old}", f"VENV={venv}")
    assert done.returncode != 0
    assert (
        f"make: Agent Lobby needs Python 3.11 or newer; {old} is Python 3.10.12. "
        "Name one: make run PYTHON=python3.11"
    ) in done.stdout
    assert not venv.exists()


def test_a_missing_python_is_named(tmp_path: Path) -> None:
    done = make("run", f"PYTHON={tmp_path / 'python3.10'}", f"VENV={tmp_path / 'venv'}")
    assert done.returncode != 0
    assert "needs Python 3.11 or newer" in done.stdout
    assert "is not found" in done.stdout


def test_a_venv_whose_python_is_gone_is_made_again(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(tmp_path / "python-that-was-removed")
    (venv / ".installed-run").touch()  # a stamp that would otherwise say all is installed
    done = make("-n", "run", f"VENV={venv}")
    assert f"make: {venv} has no working Python 3.11 or newer: making it again" in done.stdout
    assert not venv.exists()
    assert f"-m venv {venv}" in done.stdout
    assert "pip install" in done.stdout


def test_a_venv_made_by_an_old_python_is_made_again(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    old = venv / "bin" / "python"
    old.write_text(OLD_PYTHON)
    old.chmod(0o755)
    done = make("-n", "run", f"VENV={venv}")
    assert "has no working Python 3.11 or newer: making it again" in done.stdout
    assert not venv.exists()


def test_extras_install_from_the_checkout(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = make("-n", "run", "EXTRAS=cluster bridges", f"VENV={venv}")
    assert done.returncode == 0, done.stderr
    assert (
        f"{venv}/bin/python -m pip install --quiet --disable-pip-version-check "
        "-e '.[bridges,cluster]'"
    ) in done.stdout
    assert f"touch {venv}/.installed-run-bridges-cluster" in done.stdout
    plain = make("-n", "run", f"VENV={venv}")
    assert "-e '.'" in plain.stdout


def test_every_install_hint_names_an_extra_the_checkout_has() -> None:
    """Extras are not on PyPI: the docs and the lobby's errors say how to install them from
    this checkout, and name only extras pyproject.toml declares."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        assert "pip install 'agent-lobby[" not in page.read_text(), page
    named = set()
    for page in pages:
        named |= set(re.findall(r"EXTRAS=\"?([a-z ]+)", page.read_text()))
    assert named, "the docs name no extra"
    for words in named:
        assert set(words.split()) <= set(extras), words
    for extra in ("bridges", "cluster", "otel", "picows"):
        hint = install_hint(extra)
        assert extra in extras
        assert hint == (
            f"make run EXTRAS={extra}, or .venv/bin/pip install -e '.[{extra}]' in the checkout"
        )


def test_what_the_docs_commands_write_is_ignored_by_git() -> None:
    """Files the docs' commands leave in the checkout (a tokens file, NATS and lobby data
    directories) never show up as changes to commit."""
    paths = ["a2a-tokens.json", ".nats-0/x", ".nats/x", ".lobby/x", ".lobby-b/x", "echo.token"]
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", *paths],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert done.stdout.split() == paths
