"""Models generated from protocol/asyncapi-agent.json by the AsyncAPI project's own generator
(Modelina), as a team writing an agent in another language would make them: they compile
(`tsc --strict`, `go vet` and `go build`) or import, and parse every frame of a recorded session
of every message type (tests/recording.py) with nothing lost: each frame, parsed and written
back, is the same JSON. Go builds offline, with the standard library alone (`make test`
installs Debian's golang-go)."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from protocol.asyncapi import delivered_name, sent_name
from protocol.models import MessageType
from tests.nodejs import ROOT, node, npm_installed
from tests.recording import Recording, record_session

TOOLS = ROOT / "tests" / "asyncapi"
AGENT_DOCUMENT = ROOT / "protocol" / "asyncapi-agent.json"


@dataclass
class Session:
    """The recorded frames, each with the name of the generated model that should parse it."""

    frames: list[tuple[str, str]]
    """(model name, frame text), in the order they crossed the wire, sent and received."""


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    directory = tmp_path_factory.mktemp("recorded")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AGENT_LOBBY_STATE_DIR", str(directory / "agent-state"))
        recording: Recording = asyncio.run(record_session(directory / "lobby-data"))
    every_type = {t.value for t in MessageType}
    assert recording.types(recording.sent) | recording.types(recording.received) == every_type
    frames = [(_model(text, sent_name), text) for text in recording.sent]
    frames += [(_model(text, delivered_name), text) for text in recording.received]
    return Session(frames)


def _model(text: str, name_of: Any) -> str:
    return str(name_of(MessageType(orjson.loads(text)["message_type"])))


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Modelina's TypeScript, Python and Go models of the agent's document."""
    out = tmp_path_factory.mktemp("generated")
    npm_installed(TOOLS)
    subprocess.run(
        [node(), str(TOOLS / "generate.mjs"), str(AGENT_DOCUMENT), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def _same_json(
    frames: list[tuple[str, str]], written: list[str], read: Callable[[Any], Any] = lambda v: v
) -> list[str]:
    """Each frame whose model wrote it back differently (as `read` sees them), with both."""
    assert len(written) == len(frames)
    return [
        f"{name}: {text} -> {again}"
        for (name, text), again in zip(frames, written, strict=True)
        if read(orjson.loads(text)) != read(orjson.loads(again))
    ]


def _as_go_reads(value: Any) -> Any:
    """`value` without the fields a Go model cannot tell from absent: a null, an empty list or
    map (nil, all of them). For an optional field each means what absence does, the schema's
    default; the one exception, a resuming REGISTER's `capabilities: []` (clear them, where
    absent keeps them), a Go agent says with UPDATE_CAPABILITIES, where the field is required."""
    if isinstance(value, dict):
        kept = {key: _as_go_reads(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in (None, [], {})}
    if isinstance(value, list):
        return [_as_go_reads(item) for item in value]
    return value


TS_CHECK = """\
import {{ readFileSync }} from "node:fs";
{imports}

interface Model {{ marshal(): string }}
const models: Record<string, {{ unmarshal(json: string | object): Model }}> = {{ {names} }};
const frames = JSON.parse(readFileSync(process.argv[2], "utf8")) as [string, string][];
for (const [name, text] of frames) {{
  console.log(models[name].unmarshal(text).marshal());
}}
"""


@pytest.mark.timeout(300)
def test_typescript_models_compile_strictly_and_parse_every_frame(
    session: Session, generated: Path
) -> None:
    ts = generated / "ts"
    # Modelina renames a model whose name TypeScript reserves (Text: ReservedText).
    names = {n: n if (ts / f"{n}.ts").exists() else f"Reserved{n}" for n, _ in session.frames}
    imports = "\n".join(f'import {{ {c} }} from "./{c}";' for c in sorted(set(names.values())))
    table = ", ".join(f"{n}: {c}" for n, c in sorted(names.items()))
    (ts / "check.ts").write_text(TS_CHECK.format(imports=imports, names=table))
    tsc = TOOLS / "node_modules" / "typescript" / "bin" / "tsc"
    compiled = subprocess.run(
        [
            node(),
            str(tsc),
            "--strict",
            "--target",
            "es2022",
            "--module",
            "commonjs",
            "--typeRoots",
            str(TOOLS / "node_modules" / "@types"),
            "--types",
            "node",
            "--outDir",
            str(generated / "ts-js"),
            *map(str, sorted(ts.glob("*.ts"))),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stdout[-3000:]
    frames_file = generated / "frames.json"
    frames_file.write_bytes(orjson.dumps(session.frames))
    parsed = subprocess.run(
        [node(), str(generated / "ts-js" / "check.js"), str(frames_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert _same_json(session.frames, parsed.stdout.splitlines()) == []


@pytest.fixture
def python_models(generated: Path) -> Iterator[str]:
    """The generated Python package on the import path, for this test only."""
    sys.path.insert(0, str(generated / "python"))
    try:
        yield "asyncapimodels"
    finally:
        sys.path.remove(str(generated / "python"))
        for module in [m for m in sys.modules if m.split(".")[0] == "asyncapimodels"]:
            del sys.modules[module]


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def test_python_models_parse_every_frame(session: Session, python_models: str) -> None:
    written = []
    for name, text in session.frames:
        module = importlib.import_module(f"{python_models}.{_snake(name)}")
        model = getattr(module, name).model_validate_json(text)
        written.append(model.model_dump_json(exclude_unset=True, by_alias=True))
    assert _same_json(session.frames, written) == []


GO_CHECK = """\
package main

import (
\t"bufio"
\t"encoding/json"
\t"fmt"
\t"os"

\t"lobby"
)

var models = map[string]func() any{{
{table}
}}

// Each frame, parsed into its model and written back, one line each.
func main() {{
\traw, err := os.ReadFile(os.Args[1])
\tif err != nil {{
\t\tpanic(err)
\t}}
\tvar frames [][2]string
\tif err := json.Unmarshal(raw, &frames); err != nil {{
\t\tpanic(err)
\t}}
\tout := bufio.NewWriter(os.Stdout)
\tdefer out.Flush()
\tfor _, frame := range frames {{
\t\tmodel := models[frame[0]]()
\t\tif err := json.Unmarshal([]byte(frame[1]), model); err != nil {{
\t\t\tfmt.Fprintf(os.Stderr, "%s: %v: %s\\n", frame[0], err, frame[1])
\t\t\tos.Exit(1)
\t\t}}
\t\tagain, err := json.Marshal(model)
\t\tif err != nil {{
\t\t\tpanic(err)
\t\t}}
\t\tout.Write(append(again, '\\n'))
\t}}
}}
"""


def go() -> str:
    found = shutil.which("go")
    assert found, "no go on PATH: `make test` installs Debian's golang-go"
    return found


@pytest.mark.timeout(300)
def test_go_models_vet_build_and_parse_every_frame(
    session: Session, generated: Path, tmp_path: Path
) -> None:
    """Offline, with the standard library alone: no module is fetched."""
    models = generated / "go"
    (models / "go.mod").write_text("module lobby\n\ngo 1.19\n")
    check = models / "cmd" / "check"
    check.mkdir(parents=True)
    table = "\n".join(
        f"\t{n!r}: func() any {{ return &lobby.{n}{{}} }},"
        for n in sorted({name for name, _ in session.frames})
    ).replace("'", '"')
    (check / "main.go").write_text(GO_CHECK.format(table=table))
    env = {
        **os.environ,
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOCACHE": str(tmp_path / "cache"),
        "GOPATH": str(tmp_path / "path"),
    }
    for command in (["vet", "./..."], ["build", "-o", str(tmp_path / "check"), "./cmd/check"]):
        done = subprocess.run(
            [go(), *command], cwd=models, env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, f"go {command[0]}: {done.stderr[-3000:]}"
    frames_file = tmp_path / "frames.json"
    frames_file.write_bytes(orjson.dumps(session.frames))
    parsed = subprocess.run(
        [str(tmp_path / "check"), str(frames_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert _same_json(session.frames, parsed.stdout.splitlines(), _as_go_reads) == []
