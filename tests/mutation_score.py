"""The score of the last `make mutation` run, and the floor it must not fall below.

Run by `make mutation` after `mutmut run` and `mutmut export-cicd-stats`: prints the killed
share of the mutants mutmut made, and exits 1 below `FLOOR` or while a mutant survives. A
survivor is either a missing test (add one) or equivalent to the original (list its line in
`do_not_mutate_patterns` in pyproject.toml and say why in docs/testing.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

FLOOR = 0.90
STATS = Path("mutants/mutmut-cicd-stats.json")


def main() -> int:
    stats = orjson.loads(STATS.read_bytes())
    total = stats["total"]
    # A mutant that hangs or crashes the tests is caught as surely as one that fails them.
    caught = stats["killed"] + stats["timeout"] + stats["segfault"]
    score = caught / total if total else 0.0
    print(
        f"mutation score: {caught}/{total} mutants caught ({score:.1%}, floor {FLOOR:.0%}); "
        f"{stats['survived']} survived, {stats['no_tests']} without a test "
        f"(list them: .venv/bin/mutmut results)"
    )
    return 0 if score >= FLOOR and stats["survived"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
