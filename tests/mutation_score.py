"""The score of the last `make mutation` run, per package, and the floor none may fall below.

Run by `make mutation` after `mutmut run`: prints the caught share of the mutants the run
checked, in all and for each package mutated (`protocol`, `lobby.core`, the SDK's pure
modules), from the run's `.meta` files, and exits 1 if any is below `FLOOR` or while a mutant
survives. A run over some modules only (`make mutation MUTANTS=...`) leaves the others' mutants
"not checked": they are counted apart, not as missed. A survivor is either a missing test (add
one) or equivalent to the original (list its line in `do_not_mutate_patterns` in pyproject.toml
and say why in docs/testing.md)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
from mutmut.stats import status_by_exit_code

FLOOR = 0.90
MUTANTS = Path("mutants")
# A mutant that hangs or crashes the tests is caught as surely as one that fails them.
CAUGHT = ("killed", "timeout", "segfault")


def package_of(meta: Path) -> str:
    """`protocol`, `lobby.core`, `agent_sdk`: the package a mutated module's results are in."""
    parts = meta.relative_to(MUTANTS).parts[:-1]
    return ".".join(parts)


def module_of(meta: Path) -> str:
    """`lobby.core.commerce.sealed`: the mutated module a `.meta` file holds the results of."""
    return ".".join(meta.relative_to(MUTANTS).with_suffix("").with_suffix("").parts)


def counted(name_of: Callable[[Path], str]) -> dict[str, Counter[str]]:
    """The mutants, counted by mutmut's status, grouped by `name_of` their `.meta` file."""
    counts: dict[str, Counter[str]] = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        exit_codes = orjson.loads(meta.read_bytes()).get("exit_code_by_key", {})
        statuses = counts.setdefault(name_of(meta), Counter())
        statuses.update(status_by_exit_code[code] for code in exit_codes.values())
    return counts


def line(name: str, statuses: Counter[str]) -> tuple[str, bool]:
    """One package's score over the mutants this run checked, and whether it passes."""
    unchecked = statuses["not checked"]
    total = sum(statuses.values()) - unchecked
    caught = sum(statuses[status] for status in CAUGHT)
    survived, no_tests = statuses["survived"], statuses["no tests"]
    score = caught / total if total else 0.0
    text = (
        f"{name}: {caught}/{total} mutants caught ({score:.1%}, floor {FLOOR:.0%}); "
        f"{survived} survived, {no_tests} without a test"
    )
    if unchecked:  # a run over some modules (`make mutation MUTANTS=...`), or one cut short
        text += f"; {unchecked} not checked by this run"
    return text, score >= FLOOR and survived == 0


def main(argv: list[str]) -> int:
    """`--by-module` adds a line per module the run checked (to see where survivors are)."""
    packages = {name: statuses for name, statuses in counted(package_of).items() if statuses}
    everything: Counter[str] = sum(packages.values(), Counter())
    text, ok = line("mutation score", everything)
    print(f"{text} (list them: .venv/bin/mutmut results)")
    for package, statuses in packages.items():
        if sum(statuses.values()) == statuses["not checked"]:
            continue
        text, package_ok = line(f"  {package}", statuses)
        print(text)
        ok = ok and package_ok
    if "--by-module" in argv:
        for module, statuses in counted(module_of).items():
            if sum(statuses.values()) > statuses["not checked"]:
                print(line(f"    {module}", statuses)[0])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
