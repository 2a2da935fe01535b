"""Settings from flags, `LOBBY_*` variables and a TOML file: each bad value is one sentence
naming where it came from, checked before anything is opened."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lobby.config import SettingError, Settings
from lobby.options import add_serve_options, settings_from


def settings(*flags: str, env: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    return settings_from(parser.parse_args(list(flags)), env or {})


def test_a_flag_wins_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "lobby.toml"
    config.write_text('port = 7000\nmax-message-bytes = 1000\nlog_level = "debug"\n')
    got = settings(
        "--config", str(config), "--port", "7002", env={"LOBBY_PORT": "7001", "LOBBY_FSYNC": "yes"}
    )
    assert (got.port, got.max_message_bytes, got.log_level, got.fsync) == (
        7002,
        1000,
        "debug",
        True,
    )
    assert settings("--config", str(config), env={"LOBBY_PORT": "7001"}).port == 7001
    assert settings(env={"LOBBY_CONFIG": str(config)}).port == 7000
    assert settings() == Settings()


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--port", "99999"], {}, "--port 99999: not a port (0-65535)"),
        ([], {"LOBBY_PORT": "abc"}, "LOBBY_PORT='abc': expected a whole number"),
        ([], {"LOBBY_STORE": "bogus"}, "LOBBY_STORE='bogus': expected one of sqlite, memory"),
        ([], {"LOBBY_FSYNC": "maybe"}, "LOBBY_FSYNC='maybe': expected true or false"),
        (
            [],
            {"LOBBY_LOG_FORMAT": "xml"},
            "LOBBY_LOG_FORMAT='xml': expected one of auto, json, console",
        ),
        ([], {"LOBBY_MAX_MESSAGE_BYTES": "-5"}, "LOBBY_MAX_MESSAGE_BYTES='-5': must be above 0"),
        ([], {"LOBBY_COMMIT_INTERVAL": "nan"}, "expected a finite number"),
        (["--message-rate", "-1"], {}, "--message-rate -1: must be at least 0"),
        (["--tls-cert", "cert.pem"], {}, "--tls-cert and --tls-key go together"),
        (
            ["--tls-cert", "missing.pem", "--tls-key", "missing.pem"],
            {},
            "--tls-cert missing.pem: not a readable file",
        ),
    ],
)
def test_a_bad_value_names_its_source(flags: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError) as bad:
        settings(*flags, env=env)
    assert message in str(bad.value)


def test_a_data_dir_that_is_a_file_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(SettingError, match="exists and is not a directory"):
        settings("--data-dir", str(a_file))
    with pytest.raises(SettingError, match=r"cannot be created: .* is a file"):
        settings("--data-dir", str(a_file / "inside"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    # A data dir for the memory store is never opened, so it is not checked.
    assert settings("--data-dir", str(a_file), "--store", "memory").store == "memory"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port = [1]\n", "port = [1]: expected a number, a string or a boolean, not list"),
        ("colour = true\n", "unknown setting 'colour'"),
        ("port = \n", "not valid TOML"),
        ('fsync = "maybe"\n', "fsync = 'maybe': expected true or false"),
        ("max_message_bytes = 1.5\n", "expected a whole number"),
    ],
)
def test_a_bad_config_file_names_the_file_and_the_setting(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "lobby.toml"
    config.write_text(text)
    with pytest.raises(SettingError) as bad:
        settings("--config", str(config))
    assert str(config) in str(bad.value)
    assert message in str(bad.value)


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match=r"nope\.toml: cannot read it"):
        settings("--config", str(tmp_path / "nope.toml"))


def test_the_delivery_window_is_at_most_half_the_outbound_bound() -> None:
    """What is held past the window counts towards `--max-outbound-bytes`: a window as large
    would leave a slow reader no room, so the one in force is capped at half of it."""
    assert Settings().outbound_window == 1024 * 1024
    assert settings("--delivery-window", "65536").outbound_window == 65536
    capped = settings("--delivery-window", "8000000", "--max-outbound-bytes", "1000000")
    assert capped.outbound_window == 500_000
    assert capped.outbound_low_water == 125_000
    with pytest.raises(SettingError, match="--delivery-window 0: must be above 0"):
        settings("--delivery-window", "0").check()
