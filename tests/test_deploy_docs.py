"""docs/deploy.md stays true: its systemd unit starts `lobby serve` with flags and settings
that exist and are valid, its nginx snippet upgrades WebSockets and outlasts the keepalive,
both are the files in examples/deploy/, and it names every log event and close code."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from lobby.cli import build_parser
from lobby.config import Settings
from lobby.options import env_name, settings_from
from protocol.models import CLOSE_CODE_NAMES

ROOT = Path(__file__).parent.parent
DEPLOY = (ROOT / "docs" / "deploy.md").read_text()
UNIT = ROOT / "examples" / "deploy" / "agent-lobby.service"
NGINX = ROOT / "examples" / "deploy" / "nginx.conf"
LOG_LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
EVENT_NAME = re.compile(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+")


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file as configparser reads an INI file, except that a key may repeat
    (`Environment=` does) and each value is kept: {section: {key: [values]}}."""
    sections: dict[str, dict[str, list[str]]] = {}
    section: dict[str, list[str]] | None = None
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        while line.endswith("\\"):  # a continued line
            line = line[:-1] + " " + next(lines).strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert section is not None, f"a line before any [section]: {line!r}"
        assert sep, f"not a key=value line: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    values = section[key]
    assert len(values) == 1, f"{key}= is given {len(values)} times"
    return values[0]


def serve_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lobby", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def test_the_unit_runs_lobby_serve_with_flags_it_has() -> None:
    service = parse_unit(UNIT.read_text())["Service"]
    command = shlex.split(one(service, "ExecStart"))
    assert command[0].startswith("/")  # systemd wants an absolute path
    assert command[0].endswith("/bin/lobby")
    assert command[1] == "serve"
    flags = [arg.split("=")[0] for arg in command[2:] if arg.startswith("-")]
    assert flags
    helped = serve_help()
    for flag in flags:
        assert re.search(rf"\s{re.escape(flag)}\b", helped), f"{flag} is not in lobby serve --help"


def test_the_units_flags_and_environment_are_valid_settings(tmp_path: Path) -> None:
    """ExecStart's arguments and every LOBBY_* variable of the unit make settings that pass
    the check `lobby serve` runs before it opens anything (the data dir aside: that is
    checked on the machine that runs it)."""
    service = parse_unit(UNIT.read_text())["Service"]
    env = dict(value.split("=", 1) for value in service["Environment"])
    known = {env_name(f.name) for f in fields(Settings)}
    assert set(env) <= known, f"not settings: {set(env) - known}"
    assert env["LOBBY_DATA_DIR"] == one(service, "WorkingDirectory")
    args = build_parser().parse_args(shlex.split(one(service, "ExecStart"))[1:])
    settings = settings_from(args, env | {"LOBBY_DATA_DIR": str(tmp_path / "data")})
    assert settings.store == "sqlite"

    # Enough descriptors for every connection allowed, and time to stop cleanly.
    assert int(one(service, "LimitNOFILE")) > settings.max_connections + 100
    assert one(service, "KillSignal") == "SIGTERM"
    assert float(one(service, "TimeoutStopSec")) > settings.shutdown_timeout
    assert one(service, "Restart") in ("on-failure", "always")
    assert "2" in one(service, "RestartPreventExitStatus").split()  # a bad setting
    assert one(service, "User") not in ("", "root")


def test_the_unit_installs_and_orders_itself() -> None:
    unit = parse_unit(UNIT.read_text())
    assert "network-online.target" in one(unit["Unit"], "After")
    assert one(unit["Install"], "WantedBy") == "multi-user.target"
    assert one(unit["Service"], "Type") in ("exec", "simple")


def nginx_directives(text: str) -> dict[str, list[list[str]]]:
    """Every simple directive of an nginx config: {name: [arguments, ...]}, comments out."""
    found: dict[str, list[list[str]]] = {}
    text = re.sub(r"#[^\n]*", "", text)
    for statement in re.split(r"[;{}]", text):
        words = statement.split()
        if words:
            found.setdefault(words[0], []).append(words[1:])
    return found


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value)
    assert match, value
    return int(match[1]) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[match[2]]


def test_the_nginx_snippet_upgrades_websockets_and_outlasts_the_keepalive() -> None:
    conf = nginx_directives(NGINX.read_text())
    assert conf["proxy_http_version"] == [["1.1"]]
    headers = {args[0]: args[1] for args in conf["proxy_set_header"]}
    assert headers["Upgrade"] == "$http_upgrade"
    assert headers["Connection"] == "$connection_upgrade"
    assert conf["map"] == [["$http_upgrade", "$connection_upgrade"]]
    assert conf["default"] == [["upgrade"]]  # in the map: an upgrade is passed on

    # A quiet agent hears a ping every ping_interval; the lobby drops it after ping_timeout
    # more. nginx must not cut it first.
    keepalive = Settings().ping_interval + Settings().ping_timeout
    for timeout in ("proxy_read_timeout", "proxy_send_timeout"):
        assert seconds(conf[timeout][0][0]) > keepalive, timeout

    assert any("ssl" in args for args in conf["listen"])
    assert conf["ssl_certificate"]
    assert conf["ssl_certificate_key"]
    # It proxies to where the unit makes the lobby listen.
    command = shlex.split(one(parse_unit(UNIT.read_text())["Service"], "ExecStart"))
    where = f"{command[command.index('--host') + 1]}:{command[command.index('--port') + 1]}"
    assert conf["proxy_pass"] == [[f"http://{conf['upstream'][0][0]}"]] * 2
    # The operators' paths are refused to everyone else.
    assert conf["location"] == [["/"], ["~", "^/(dashboard|admin)(/|$)"]]
    assert conf["deny"] == [["all"]]
    assert [where] in conf["server"]


def fenced(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", DEPLOY, flags=re.S | re.M)


def test_the_docs_show_the_files_in_examples_deploy() -> None:
    assert fenced("ini") == [UNIT.read_text()]
    assert fenced("nginx") == [NGINX.read_text()]


def logged_events(package: str) -> set[str]:
    """The event names passed to `log.<level>(...)` anywhere in `package`: every UPPER_CASE
    string in the first argument (`"A" if removed else "B"` names two)."""
    events = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LOG_LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
                and node.args
            ):
                events |= {
                    part.value
                    for part in ast.walk(node.args[0])
                    if isinstance(part, ast.Constant)
                    and isinstance(part.value, str)
                    and EVENT_NAME.fullmatch(part.value)
                }
    return events


def documented_events() -> set[str]:
    """The events in the first column of the log event tables."""
    section = DEPLOY.split("## Log events", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", section, flags=re.M))


@pytest.mark.parametrize("package", ["lobby", "agent_sdk"])
def test_every_log_event_is_in_the_reference(package: str) -> None:
    events = logged_events(package)
    assert "AGENT_DISCONNECTED" in events  # the scan finds them
    missing = events - documented_events()
    assert not missing, f"add these {package} log events to docs/deploy.md: {sorted(missing)}"


def test_the_reference_names_no_event_that_is_not_logged() -> None:
    stale = documented_events() - logged_events("lobby") - logged_events("agent_sdk")
    assert not stale, f"docs/deploy.md names events no code logs: {sorted(stale)}"


def test_every_close_code_is_in_the_reference() -> None:
    section = DEPLOY.split("## Close codes", 1)[1]
    rows = dict(re.findall(r"^\| (\d{4}) \| `(\w+)` \|", section, flags=re.M))
    protocol = (ROOT / "PROTOCOL.md").read_text().split("## 12. Close codes", 1)[1]
    contract = re.findall(r"^\| (\d{4}) \|", protocol.split("\n## ", 1)[0], flags=re.M)
    assert contract
    for code in contract:
        assert code in rows, f"close code {code} (PROTOCOL.md §12) is not in docs/deploy.md"
    for code, name in CLOSE_CODE_NAMES.items():
        assert rows.get(str(code)) == name, f"close code {code} ({name}) in docs/deploy.md"


def test_the_readme_links_the_deploy_guide() -> None:
    assert "(docs/deploy.md)" in (ROOT / "README.md").read_text()
