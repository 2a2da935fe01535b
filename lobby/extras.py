"""How to install one of pyproject.toml's optional extras, said the same way everywhere: they
are not on PyPI, so from the checkout. A leaf: it imports nothing of the lobby."""

from __future__ import annotations


def install_hint(extra: str) -> str:
    return f"make run EXTRAS={extra}, or .venv/bin/pip install -e '.[{extra}]' in the checkout"


__all__ = ["install_hint"]
