"""Every shell block of README.md and docs/ runs as a new user runs it: in a fresh directory
with the venv on PATH, against the lobby `make run` starts, long-running commands in the
background, printing the output the page shows (tests/shellblocks.py says how), twice: the
second run meets what the first left, as a user who follows a page again does. Blocks that
cannot run in a test are marked with the reason, which this test prints; the list is short."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.shellblocks import ROOT, STOPS_THE_LOBBY, Block, Sandbox, commands, shell_blocks, stop

FILES = [
    *(ROOT / name for name in ("README.md", "BENCHMARKS.md", "examples/js/README.md")),
    *sorted((ROOT / "docs").glob("*.md")),
]
"""README.md and the site's pages: docs/, and the files they include whole (PROTOCOL.md has no
shell block)."""
BLOCKS = [block for path in FILES for block in shell_blocks(path)]
NOT_RUN_AT_MOST = 12


def test_every_shell_block_is_read_and_the_ones_not_run_say_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for path in FILES:
        text = path.read_text()
        for other in ("```bash\n", "```shell\n", "```console\n"):
            assert other not in text, f"{path.name}: write ```sh"
        joined = sum(1 + len(b.continued) for b in shell_blocks(path))
        assert text.count("```sh\n") == joined, f"{path.name}: a block not read"
    skipped = [b for b in BLOCKS if b.not_run]
    with capsys.disabled():
        print()
        for block in skipped:
            print(f"not run: {block.source}: {block.not_run}")
    assert len(skipped) <= NOT_RUN_AT_MOST
    assert len(BLOCKS) - len(skipped) >= 10


def run(block: Block, path: Path) -> str | None:
    """Run the block twice in a sandbox of its own, against one lobby: the second run meets
    what the first left (its saved tokens, its registered ids, its files and data dirs), as a
    user who runs a page again does. A sentence saying what went wrong, or None."""
    sandbox = Sandbox.make(path)
    stops = any(STOPS_THE_LOBBY.search(line) for line in commands(block.whole_script))
    with ExitStack() as stack:
        lobby = stack.enter_context(sandbox.lobby())
        if not stops:  # a lobby that already holds other agents
            stack.enter_context(sandbox.someone_else())
        for time in ("first", "second"):
            if stops:  # the page says to stop `make run` first: it was running again
                if lobby.poll() is not None:
                    lobby = stack.enter_context(sandbox.lobby())
                stop(lobby)
            problem = check(sandbox, block, sandbox.run(block, timeout=50))
            if problem is not None:
                return f"{block.source}, run a {time} time: {problem}"
    return None


def check(sandbox: Sandbox, block: Block, done: subprocess.CompletedProcess[str]) -> str | None:
    logs = sandbox.logs()
    said = f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}\n{logs}"
    if done.returncode != 0:
        return f"exit status {done.returncode}: {said}"
    if "Traceback" in done.stderr + logs:
        return f"a traceback: {said}"
    if sandbox.not_printed():
        return f"not printed: {sandbox.not_printed()}: {said}"
    if block.whole_output is not None and sandbox.delocalize(done.stdout) != block.whole_output:
        return f"printed {sandbox.delocalize(done.stdout)!r}, the page shows: {said}"
    return None


@pytest.mark.timeout(150)  # ~60 s alone: its lobbies, NATS and servers share the cores
def test_every_shell_block_runs_as_written(tmp_path: Path) -> None:
    # The longest first (the cluster walk-through, twice ~25 s): the others run beside it.
    runnable = sorted((b for b in BLOCKS if not b.not_run), key=lambda b: -len(b.whole_script))
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = pool.map(lambda n: run(runnable[n], tmp_path / f"b{n}"), range(len(runnable)))
        problems = [p for p in failures if p is not None]
    assert not problems, "\n\n".join(problems)
