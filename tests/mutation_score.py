"""The score of the last `make mutation` run, per package, and the floor none may fall below.

Run by `make mutation` after `mutmut run` and `mutmut export-cicd-stats`: prints the caught
share of the mutants mutmut made, in all and for each package mutated (`protocol`,
`lobby.core`, the SDK's pure modules), and exits 1 if any is below `FLOOR` or while a mutant
survives. A survivor is either a missing test (add one) or equivalent to the original (list its
line in `do_not_mutate_patterns` in pyproject.toml and say why in docs/testing.md)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import orjson
from mutmut.stats import status_by_exit_code

FLOOR = 0.90
MUTANTS = Path("mutants")
STATS = MUTANTS / "mutmut-cicd-stats.json"
# A mutant that hangs or crashes the tests is caught as surely as one that fails them.
CAUGHT = ("killed", "timeout", "segfault")


def package_of(meta: Path) -> str:
    """`protocol`, `lobby.core`, `agent_sdk`: the package a mutated module's results are in."""
    parts = meta.relative_to(MUTANTS).parts[:-1]
    return ".".join(parts)


def by_package() -> dict[str, Counter[str]]:
    """Each package's mutants, counted by mutmut's status, from the run's `.meta` files."""
    counts: dict[str, Counter[str]] = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        exit_codes = orjson.loads(meta.read_bytes()).get("exit_code_by_key", {})
        statuses = counts.setdefault(package_of(meta), Counter())
        statuses.update(status_by_exit_code[code] for code in exit_codes.values())
    return counts


def line(name: str, caught: int, total: int, survived: int, no_tests: int) -> tuple[str, bool]:
    score = caught / total if total else 0.0
    text = (
        f"{name}: {caught}/{total} mutants caught ({score:.1%}, floor {FLOOR:.0%}); "
        f"{survived} survived, {no_tests} without a test"
    )
    return text, score >= FLOOR and survived == 0


def main() -> int:
    stats = orjson.loads(STATS.read_bytes())
    caught = sum(stats[status] for status in CAUGHT)
    text, ok = line("mutation score", caught, stats["total"], stats["survived"], stats["no_tests"])
    print(f"{text} (list them: .venv/bin/mutmut results)")
    for package, statuses in by_package().items():
        total = sum(statuses.values())
        if not total:
            continue
        text, package_ok = line(
            f"  {package}",
            sum(statuses[status] for status in CAUGHT),
            total,
            statuses["survived"],
            statuses["no tests"],
        )
        print(text)
        ok = ok and package_ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
