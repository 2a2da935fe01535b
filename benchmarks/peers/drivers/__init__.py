"""One script per system under test, each run by its own interpreter (a peer's venv python for
SPADE and AutoGen), printing one JSON line of results; `pattern` is their stdlib-only core."""
