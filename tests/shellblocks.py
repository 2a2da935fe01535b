"""The shell blocks of README.md and docs/, run as a new user runs them (tests/test_doc_shell.py).

A ```sh block is run as one bash script (`bash -e -o pipefail`: a command that fails fails the
block), in a sandbox that looks like a fresh clone where `make run` already runs:

- its own temporary directory, holding links to the checkout's code and `.venv` (and a copy of
  the examples' Node.js agent, whose `npm ci` installs into it), a fresh `.lobby` data dir, and
  the venv first on PATH, as `. .venv/bin/activate` puts it;
- the lobby the docs assume running: `.venv/bin/lobby serve` (what `make run` runs once it has
  installed it; installing is tests/test_makefile.py's), with the data dir `.lobby`;
- every port the docs name (`PORTS`) replaced by a free one, as a user whose ports are taken
  would choose others, and `LOBBY_PORT` / `LOBBY_URL` exported for the lobby's, as that user
  would (a command that listens on one of them by default, `lobby nats` and the shouter, is
  given `--port`); `make run` is run as `.venv/bin/lobby serve`; `xdg-open` is a stand-in
  that fetches the page (there is no browser here);
- a command that runs until stopped (`LONG_RUNNING`: a lobby, NATS, a bridge, a server, an
  agent) goes to the background with its output in a file, and the script waits until it is
  up (its port answers, or it printed its first line) before the next command, as a user waits
  for it in another terminal; a block that starts a lobby of its own (`STOPS_THE_LOBBY`) has
  the sandbox's lobby stopped first, as the docs ask ("stop `make run` first");
- the script's standard output (the long-running commands' is in their files) is compared
  with the ```text title="Output" block after it, if any, exactly, once the ports are put back;
  comment lines right after a long-running command are what it prints, and must be in its
  output;
- at the end every process it started is sent SIGTERM (a non-interactive shell's background
  commands ignore SIGINT, Ctrl-C's), then killed.

Markers (an HTML comment on the line before the block): `<!-- not run: REASON -->` for a block
that cannot run in a test (the test prints REASON); `<!-- same shell as the block before -->`
for a block that goes on in the shell of the one before it (it uses its variables)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.docblocks import SOMEONE_ELSE

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = '```text title="Output"'
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
SAME_SHELL = "<!-- same shell as the block before -->"
PORTS = (8765, 8766, 8767, 8768, 9000, 9001, 4222, 4223, 4224, 6222, 6223, 6224)
"""The ports the docs name: the lobby, a cluster's second node, `lobby mcp --http`, `lobby a2a
serve`, the MCP tools server, the shouter, and NATS's client and cluster ports."""
LOBBY_PORT = 8765
IN_CHECKOUT = ("agent_sdk", "bridges", "lobby", "protocol", "tests", "pyproject.toml", "Makefile")
LONG_RUNNING: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(^|&& )make run\b"), "port"),
    (re.compile(r"\blobby serve\b"), "port"),
    (re.compile(r"\blobby nats\b"), "port"),
    (re.compile(r"\blobby mcp\b.*--http \d+"), "port"),
    (re.compile(r"\blobby a2a serve\b"), "port"),
    (re.compile(r"\bexamples\.mcp\.tools_server --http \d+"), "port"),
    (re.compile(r"\bexamples\.a2a\.shouter\b"), "port"),
    (re.compile(r"\blobby bridge mcp\b"), "line"),
    (re.compile(r"\blobby a2a join\b"), "line"),
    (re.compile(r"\bexamples\.echo\.echo_agent\b"), "line"),
    (re.compile(r"\bexamples\.js\.counterparts\b"), "line"),
)
"""Commands that run until stopped, and how the script knows one is up: its port answers
(`--port`/`--http N`, else its default: the lobby's, NATS's 4222, the shouter's 9001), or it
printed a line (each of these prints one once it is registered)."""
DEFAULT_PORTS = {"lobby nats": 4222, "shouter": 9001}
STOPS_THE_LOBBY = re.compile(r"(^|&& )make run\b|\blobby serve\b|\blobby reset\b")
"""A block running one of these needs the sandbox's lobby stopped (its port, its data dir)."""

PRELUDE = """\
up() {  # up PID PORT|LOG: wait until PID's port answers, or its log has a line
    for _ in $(seq 600); do
        kill -0 "$1" 2>/dev/null || { echo "the command started as $1 exited" >&2; exit 1; }
        case "$2" in
            *.log) [ -s "$2" ] && return 0 ;;
            *) (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0 ;;
        esac
        sleep 0.1
    done
    echo "the command started as $1 was not up within 60 s" >&2; exit 1
}
"""
XDG_OPEN = """\
#!/bin/sh
# The test's stand-in for a browser: the page must answer.
exec curl -sf -o /dev/null "$1"
"""


@dataclass
class Block:
    source: str  # FILE:LINE, for messages
    script: str
    output: str | None
    not_run: str | None = None
    continued: list[Block] = field(default_factory=list)

    @property
    def whole_script(self) -> str:
        return "\n".join([self.script, *(b.script for b in self.continued)])

    @property
    def whole_output(self) -> str | None:
        outputs = [b.output for b in [self, *self.continued] if b.output is not None]
        return "".join(outputs) if outputs else None


def shell_blocks(path: Path) -> list[Block]:
    """Every ```sh block of the file, a block marked as the same shell as the one before it
    joined to that one."""
    lines = path.read_text().splitlines(keepends=True)
    name = str(path.relative_to(ROOT))
    blocks: list[Block] = []
    at = 0
    while at < len(lines):
        if lines[at] != "```sh\n":
            at += 1
            continue
        before = lines[at - 1].strip() if at else ""
        end = lines.index("```\n", at + 1)
        output = None
        after = next((i for i in range(end + 1, len(lines)) if lines[i].startswith("```")), None)
        if after is not None and lines[after].rstrip("\n") == OUTPUT:
            output = "".join(lines[after + 1 : lines.index("```\n", after + 1)])
        marked = NOT_RUN.match(before)
        block = Block(f"{name}:{at + 1}", "".join(lines[at + 1 : end]), output)
        block.not_run = marked.group(1) if marked else None
        if before == SAME_SHELL:
            blocks[-1].continued.append(block)
        else:
            blocks.append(block)
        at = end + 1
    return blocks


def commands(script: str) -> list[str]:
    """The script's lines, a command continued with `\\` joined into one line."""
    return re.sub(r"\\\n\s*", "", script).splitlines()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Sandbox:
    """A fresh clone's directory (links to the checkout), its ports and its environment."""

    path: Path
    ports: dict[int, int]
    env: dict[str, str]
    shown: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def make(cls, path: Path) -> Sandbox:
        path.mkdir(parents=True)
        for name in IN_CHECKOUT:
            (path / name).symlink_to(ROOT / name)
        (path / ".venv").symlink_to(ROOT / ".venv")
        examples = path / "examples"
        examples.mkdir()
        for entry in (ROOT / "examples").iterdir():
            if entry.name != "js":
                (examples / entry.name).symlink_to(entry)
        (examples / "js").mkdir()  # npm ci installs here (node looks beside agent.mjs's own path)
        for entry in (ROOT / "examples" / "js").iterdir():
            if entry.is_file():
                shutil.copy(entry, examples / "js" / entry.name)
        tools = path / ".test-bin"
        tools.mkdir()
        (tools / "xdg-open").write_text(XDG_OPEN)
        (tools / "xdg-open").chmod(0o755)
        ports = {port: free_port() for port in PORTS}
        lobby = ports[LOBBY_PORT]
        venv = path / ".venv"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("LOBBY_", "PYTEST"))},
            "PATH": f"{venv}/bin:{tools}:{os.environ['PATH']}",
            "VIRTUAL_ENV": str(venv),
            "LOBBY_HOST": "127.0.0.1",
            "LOBBY_PORT": str(lobby),
            "LOBBY_URL": f"ws://127.0.0.1:{lobby}/",
            "AGENT_LOBBY_STATE_DIR": str(path / ".agent-state"),
        }
        return cls(path, ports, env)

    def localize(self, text: str) -> str:
        """The docs' ports as this sandbox's."""
        docs = "|".join(map(str, PORTS))
        return re.sub(rf"\b({docs})\b", lambda m: str(self.ports[int(m[1])]), text)

    def delocalize(self, text: str) -> str:
        """This sandbox's ports as the docs'."""
        back = {str(new): str(old) for old, new in self.ports.items()}
        return re.sub(rf"\b({'|'.join(back)})\b", lambda m: back[m[1]], text)

    def script(self, block: Block) -> str:
        """The block as the bash script the sandbox runs; `shown` gets what the block says its
        long-running commands print (the comment lines right after one)."""
        self.shown = {}
        out = [PRELUDE]
        log = None
        for number, line in enumerate(commands(self.localize(block.whole_script))):
            if log is not None and line.startswith("# "):
                self.shown.setdefault(log, []).append(self.delocalize(line[2:]))
                continue
            kind = next((k for pattern, k in LONG_RUNNING if pattern.search(line)), None)
            log = None
            if kind is None:
                out.append(line)
                continue
            command = re.sub(r"\s+#\s.*$", "", line).rstrip().removesuffix("&").rstrip()
            command = re.sub(r"(^|&& )make run\b", r"\1.venv/bin/lobby serve", command)
            log = f".bg-{number}.log"
            if kind == "port" and not {"--port", "--http"} & set(shlex.split(command)):
                default = next((p for name, p in DEFAULT_PORTS.items() if name in command), None)
                if default is not None:  # listens on a port the docs name: the sandbox's
                    command += f" --port {self.ports[default]}"
            ready = log if kind == "line" else str(self.port_of(command))
            if "&&" in command:  # a list: all of it in the background, writing to the log
                command = f"( {command} )"
            out.append(f"{command} >{log} 2>&1 &")
            out.append(f"up $! {ready}")
        return "\n".join(out) + "\n"

    def not_printed(self) -> list[str]:
        """The lines `shown` that their command did not print."""
        return [
            f"{log}: {line!r}"
            for log, lines in self.shown.items()
            for line in lines
            if line not in self.delocalize((self.path / log).read_text()).splitlines()
        ]

    def port_of(self, command: str) -> int:
        words = shlex.split(command)
        for flag in ("--port", "--http"):
            if flag in words:
                return int(words[words.index(flag) + 1])
        default = next((p for name, p in DEFAULT_PORTS.items() if name in command), LOBBY_PORT)
        return self.ports[default]

    @contextmanager
    def lobby(self) -> Iterator[subprocess.Popen[bytes]]:
        """`make run`'s lobby, until the block stops it or the run ends."""
        log = (self.path / ".make-run.log").open("wb")
        process = subprocess.Popen(
            [str(self.path / ".venv/bin/lobby"), "serve"],
            cwd=self.path,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, (self.path / ".make-run.log").read_text()
                with (
                    suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.ports[LOBBY_PORT]), timeout=1),
                ):
                    break
                assert time.monotonic() < deadline, "the sandbox's lobby did not start"
                time.sleep(0.05)
            yield process
        finally:
            stop(process)
            log.close()

    @contextmanager
    def someone_else(self) -> Iterator[None]:
        """Another agent in the lobby, offering what the pages call (`SOMEONE_ELSE`), as in a
        lobby others share: a page that takes whichever provider the lobby lists first meets
        it. Stopped at the end."""
        (self.path / ".someone_else.py").write_text(SOMEONE_ELSE)
        process = subprocess.Popen(
            [str(self.path / ".venv/bin/python"), ".someone_else.py"],
            cwd=self.path,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            log = self.path / ".make-run.log"
            while not any(
                "AGENT_REGISTERED" in line and '"someone_else"' in line
                for line in log.read_text().splitlines()
            ):
                assert process.poll() is None, "someone_else exited"
                assert time.monotonic() < deadline, "someone_else never registered"
                time.sleep(0.05)
            yield
        finally:
            stop(process)

    def run(self, block: Block, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run the block (and those going on in its shell); every process it started is
        stopped at the end."""
        path = self.path / "block.sh"
        path.write_text(self.script(block))
        for log in self.path.glob(".bg-*.log"):  # a run before's: not this run's first line
            log.unlink()
        out, err = self.path / "block.out", self.path / "block.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            # Files, not pipes: a process left in the background must not hold the run open.
            process = subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", str(path)],
                cwd=self.path,
                env=self.env,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # its own process group: everything it starts
            )
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
            err.write_text(err.read_text() + f"\n(stopped after {timeout} s)")
        finally:
            stop_group(process.pid)
        return subprocess.CompletedProcess(process.args, code, out.read_text(), err.read_text())

    def logs(self) -> str:
        """What the long-running commands printed, each file under its name."""
        return "".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(self.path.glob(".bg-*")))


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def stop_group(group: int) -> None:
    """SIGTERM to every process left in the group, then SIGKILL to what remains."""
    with suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
