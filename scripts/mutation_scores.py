"""The score per module of the last `make mutation` run (mutmut's results in mutants/).

A mutant counts as killed when a test failed (or timed out) on it; one no test reached
counts as a survivor. The score leaves out the mutants listed in
scripts/mutation_equivalent.txt (a mutant that behaves exactly like the original, with
the reason on its line): score = killed / (mutants - equivalent). Survivors and the
equivalent ones are listed by name (`mutmut show NAME` prints the change).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILLED = {1, 3, 36, 24, -24, 152, 255}
SURVIVED = {0, 5, 33}


def equivalent_mutants() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "scripts" / "mutation_equivalent.txt").read_text().splitlines():
        name, _, why = line.partition("#")
        if name.strip():
            found[name.strip()] = why.strip()
    return found


def main() -> int:
    equivalent = equivalent_mutants()
    metas = sorted((ROOT / "mutants" / "src").rglob("*.py.meta"))
    if not metas:
        print("no results in mutants/: run `make mutation` first", file=sys.stderr)
        return 1
    stale = set(equivalent)
    for meta in metas:
        module = str(meta.relative_to(ROOT / "mutants" / "src")).removesuffix(".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        counts: Counter[str] = Counter()
        survivors: list[str] = []
        for name, code in sorted(codes.items()):
            if name in equivalent:
                stale.discard(name)
                counts["equivalent"] += 1
            elif code is None:
                counts["not run"] += 1
            elif code in KILLED:
                counts["killed"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
                survivors.append(f"{name}{' (no test reached it)' if code != 0 else ''}")
            else:
                counts["other"] += 1
                survivors.append(f"{name} (exit code {code})")
        scored = len(codes) - counts["equivalent"] - counts["not run"]
        score = f"{100 * counts['killed'] / scored:.1f}%" if scored else "-"
        print(
            f"{module}: {score} of the non-equivalent mutants killed ({counts['killed']} of "
            f"{scored}; {counts['equivalent']} equivalent, {counts['not run']} not run)"
        )
        for name in survivors:
            print(f"    survived: {name}")
    for name in sorted(stale):
        print(f"listed as equivalent but not among the mutants (code changed?): {name}")
    for name, why in sorted(equivalent.items()):
        if name not in stale:
            print(f"    equivalent: {name}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
