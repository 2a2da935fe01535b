"""Every package's exported names (`__all__`): each is listed once, exists, and imports by name
in a fresh namespace; the lists themselves are pinned so that a change to the public API is a
deliberate one."""

from __future__ import annotations

import importlib

import pytest

EXPORTS = {
    "protocol": None,  # the wire vocabulary: checked for presence, too long to pin here
    "lobby": set(),
    "lobby.core": {"Action", "Batch", "Close", "LobbyState", "Pause", "Router", "Send", "Session"},
    "lobby.store": {
        "Compaction",
        "MemoryStore",
        "Record",
        "Snapshot",
        "SqliteStore",
        "Store",
        "open_store",
        "StoreSettings",
        "StoreUnavailable",
    },
    "lobby.server": {"LobbyServer", "Session"},
    "lobby.transport": {"Link", "Lobby", "Transport", "TransportSettings", "tls_context"},
    "agent_sdk": None,  # pinned by tests/sdk/test_exports.py
}


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_every_exported_name_exists_and_imports(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) == len(set(names)), f"{package}.__all__ lists a name twice"
    expected = EXPORTS[package]
    if expected is not None:
        assert set(names) == expected
    for name in names:
        assert getattr(module, name) is not None, f"{package}.{name}"
        namespace: dict[str, object] = {}
        exec(f"from {package} import {name}", namespace)
        assert namespace[name] is getattr(module, name)


def test_protocol_exports_its_message_vocabulary() -> None:
    import protocol

    assert {"Message", "MessageType", "ErrorCode", "CloseCode", "decode", "encode"} <= set(
        protocol.__all__
    )
