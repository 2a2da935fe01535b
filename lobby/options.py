"""Where `lobby serve` gets its settings: a flag wins over a `LOBBY_*` environment variable,
which wins over the TOML file given by `--config` (or `LOBBY_CONFIG`), which wins over the
default. Every value is converted and checked (`Settings.check`) before anything is opened; a
bad one is a `SettingError` whose message names where it came from."""

from __future__ import annotations

import argparse
import math
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from lobby.config import SettingError, Settings

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return "LOBBY_" + name.upper()


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """One option per setting, with its help and its default as people read it. Options not
    given stay absent from the namespace, so the environment and the file can fill them."""
    parser.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="a TOML file of settings, named as the options without dashes "
        "(max_message_bytes = 1000); flags and LOBBY_* variables win over it",
    )
    for f in fields(Settings):
        convert, choices = _converter(f.name)
        default = f.default if f.default is not MISSING else None
        shown = "" if default is None else f" (default: {_show(default)})"
        kwargs: dict[str, Any] = {"help": f.metadata["help"] + shown, "default": argparse.SUPPRESS}
        if convert is _boolean:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _for_argparse(convert)
            kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else _METAVARS[convert]
        parser.add_argument(flag_name(f.name), **kwargs)


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """The settings `args` (parsed by a parser with `add_serve_options`), `environ` and the
    config file make, checked. Raises `SettingError` with the source in its name."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config = getattr(args, "config", None) or environ.get("LOBBY_CONFIG")
    if config:
        for name, value in _from_toml(Path(config)).items():
            values[name], sources[name] = value, f"{config}: {name}"
    for f in fields(Settings):
        raw = environ.get(env_name(f.name))
        if raw is not None:
            source = f"{env_name(f.name)}={raw!r}"
            values[f.name], sources[f.name] = _convert(f.name, raw, source), source
        if f.name in vars(args):
            value = getattr(args, f.name)
            values[f.name], sources[f.name] = value, f"{flag_name(f.name)} {_show(value)}"
    settings = Settings(**values)
    try:
        settings.check()
    except SettingError as bad:
        raise SettingError(sources.get(bad.name, bad.name), bad.problem) from None
    return settings


def _from_toml(path: Path) -> dict[str, Any]:
    try:
        table = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingError(str(path), f"cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingError(str(path), f"not valid TOML ({exc})") from None
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        source = f"{path}: {key} = {value!r}"
        if name not in known:
            raise SettingError(str(path), f"unknown setting {key!r} (see lobby serve --help)")
        values[name] = _convert(name, value, source)
    return values


def _convert(name: str, raw: Any, source: str) -> Any:
    """Text (a variable's, a flag's) or a TOML value, as setting `name` holds it."""
    convert, _ = _converter(name)
    try:
        return convert(raw if isinstance(raw, str) else _toml_value(raw))
    except ValueError as exc:
        raise SettingError(source, str(exc)) from None


def _toml_value(value: Any) -> str:
    """A TOML value as the text a flag would carry (TOML's own types, back to text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    raise ValueError(f"expected a number, a string or a boolean, not {type(value).__name__}")


def _converter(name: str) -> tuple[Callable[[str], Any], list[str]]:
    """How to read setting `name` from text, and its allowed values if it has a fixed set."""
    hint = typing.get_type_hints(Settings)[name]
    if isinstance(hint, types.UnionType):  # X | None: optional
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        choices = [str(choice) for choice in typing.get_args(hint)]
        return _one_of(choices), choices
    return {bool: _boolean, int: _integer, float: _number, Path: _path}.get(hint, str), []


def _one_of(choices: list[str]) -> Callable[[str], str]:
    def convert(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return raw.lower()

    return convert


def _boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word in _TRUE | _FALSE:
        return word in _TRUE
    raise ValueError("expected true or false (also 1/0, yes/no, on/off)")


def _integer(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("expected a whole number") from None


def _number(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def _path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("expected a path, not an empty string")
    return Path(raw)


def _for_argparse(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse reports a converter's ValueError as "invalid <name> value": give it ours."""

    def parse(raw: str) -> Any:
        try:
            return convert(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None

    return parse


_METAVARS: dict[Callable[[str], Any], str] = {
    _integer: "N",
    _number: "NUM",
    _path: "PATH",
    str: "TEXT",
}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535)")
    return port


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above zero."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return seconds
