"""How easy the source is to follow: the figures of issue 27 ("A house a newcomer can
change"), measured the same way on any tree, so a change can show them before and after.

    .venv/bin/python scripts/house_metrics.py [--root TREE] [--json] [-v]

`--root` measures another checkout (its `src/` and `tests/` are put first on the path;
the venv's packages serve it). Nothing here is timed, and every figure is the same from
one run to the next.

Paths: files crossed and jumps
    Three paths are run at the unit tier (tests/unit/engine_rig.py: the memory store, the
    fake provider, the injected clock), each once untraced first, so lazy imports and
    caches are warm, then again on a new job under `sys.setprofile` and
    `threading.setprofile` (the engine's workers are threads):

      tick      one job from `Engine.tick` to Confirmed (the tick waits for its workers);
      submit    `Services.submit` of one job (the service every door calls) to Requested;
      search    an ambiguous send (a dropped response: Unknown) through its search: the
                tick once the search is due, to Confirmed.

    Every Python call whose code lives in one of our source files (src/ledger, policies,
    daemon, sendledger, testkit) is one step; its caller is the nearest frame below it
    whose code is ours (a library in between, eventsourcing calling an event's `apply`,
    is seen through). *Files crossed*: the distinct source files of those steps.
    *Jumps*: the distinct (caller file, callee file) pairs with the two files different,
    so a call made in a loop is one jump, and a file that calls back into its caller
    (services -> intake -> services) is two. *Two-way*: the pairs of files that call
    each other. A distinct pair, not every call, is counted: what a reader has to follow,
    not how often a loop runs, and it does not move with thread timing. `--json` lists
    each path's files, jumps and two-way pairs.

Imports
    From the source, not by running it. Edges: `import a.b` is an edge to `a.b`;
    `from a import b` an edge to `a` and, when `a.b` is a module, to `a.b` too (the
    package `a` runs first: a submodule that asks its package for a sibling depends on
    everything the package imports). Only our modules are nodes.

      cycles       strongly connected groups of modules, counting every import
                   statement: at module level, inside a function, under TYPE_CHECKING
                   (an import moved into a function hides a cycle, it does not break it);
      chain        the longest chain of modules each importing the next while it is
                   imported (module-level imports, not TYPE_CHECKING): ours only, the
                   figure the issue gives;
      runtime      the nesting `python -X importtime` shows when the daemon's entry
                   modules are imported (ENTRY_MODULES, one process each): the deepest,
                   and the one holding the most of our modules, with every module in it
                   counted as ours, third-party or the standard library.

Exceptions
    Every class deriving from BaseException defined in ledger, policies, daemon and
    sendledger (the client), imported; those not deriving from the base: ledger's
    `SendledgerError`, or for the client (standard library only) its own `ClientError`.
    The test kit imports nothing of ours and keeps its own: counted apart.

Functions over 50 lines
    Every `def` in src/ (methods and nested functions too), from its `def` line to its
    last line; the share over 50.

Docs tests
    The files tests/unit/test_docs_*.py and their lines; the lines of docs they guard
    (docs/*.md and README.md).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any

OURS = ("ledger", "policies", "daemon", "sendledger", "testkit")
BASES = ("ledger.exceptions.SendledgerError", "sendledger.client.ClientError")
#: What `sendledger run` imports: the command, the daemon's service and its HTTP API.
ENTRY_MODULES = ("daemon.cli.service", "daemon.runtime", "daemon.api.app")


# -- paths ---------------------------------------------------------------------------


@dataclass
class Tracer:
    src: str
    active: bool = False
    steps: set[tuple[str | None, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ours(self, frame: FrameType | None) -> FrameType | None:
        while frame is not None and not frame.f_code.co_filename.startswith(self.src):
            frame = frame.f_back
        return frame

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        if not self.active or event != "call":
            return
        callee = frame.f_code.co_filename
        if not callee.startswith(self.src):
            return
        caller = self.ours(frame.f_back)
        step = (caller.f_code.co_filename[len(self.src) :] if caller else None,
                callee[len(self.src) :])  # fmt: skip
        with self.lock:
            self.steps.add(step)

    def run(self, action: Callable[[], object]) -> dict[str, Any]:
        self.steps = set()
        self.active = True
        try:
            action()
        finally:
            self.active = False
        files = {callee for _, callee in self.steps} | {c for c, _ in self.steps if c}
        jumps = {(a, b) for a, b in self.steps if a and a != b}
        two_way = sorted({tuple(sorted(j)) for j in jumps if (j[1], j[0]) in jumps})
        return {
            "files": len(files),
            "jumps": len(jumps),
            "two_way": len(two_way),
            "file_list": sorted(files),
            "jump_list": sorted(" -> ".join(j) for j in jumps),
            "two_way_pairs": [" <-> ".join(p) for p in two_way],
        }


def measure_paths(root: Path) -> dict[str, dict[str, Any]]:
    from contextlib import nullcontext

    tracer = Tracer(str(root / "src") + os.sep)
    # Before any thread starts, so every worker thread the engine makes is profiled.
    threading.setprofile(tracer.profile)
    sys.setprofile(tracer.profile)
    try:
        return _run_paths(tracer, nullcontext)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def _run_paths(tracer: Tracer, nullcontext: Any) -> dict[str, dict[str, Any]]:
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import Scripted
    from daemon.service_layer.services import ChannelPolicies, Services

    rig = EngineRig(policy("receipts"), policy("ambiguous", search_after="60s"))
    services = Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies, {}),
        providers=lambda name: nullcontext(rig.provider),
    )

    def state(key: str) -> str:
        return str(rig.job(key).state.value)

    def job(key: str) -> dict[str, str]:
        return {"channel": "receipts", "key": key, "to": "customer@example.net",
                "subject": f"Receipt {key}", "body": "Thank you.\n"}  # fmt: skip

    found: dict[str, dict[str, Any]] = {}
    try:
        rig.submit("receipts", "warm-tick")
        rig.tick()
        rig.submit("receipts", "tick")
        found["tick"] = tracer.run(rig.tick)
        assert state("tick") == "confirmed", state("tick")
        services.submit(job("warm-submit"), by="metrics")
        found["submit"] = tracer.run(lambda: services.submit(job("submit"), by="metrics"))
        assert state("submit") == "requested", state("submit")
        rig.tick()  # the submitted jobs are sent: the next scripted outcome is the search's
        for key in ("warm-search", "search"):
            rig.submit("ambiguous", key)
            rig.provider.script(Scripted.dropped_response())
            rig.tick()
            assert state(key) == "unknown", (key, state(key))
            rig.clock.advance(61)  # past search_after
            found[key] = tracer.run(rig.tick)
            assert state(key) == "confirmed", (key, state(key))
        del found["warm-search"]
    finally:
        rig.close()
    return found


# -- imports -------------------------------------------------------------------------


def our_modules(src: Path) -> dict[str, Path]:
    found = {}
    for package in OURS:
        for path in sorted((src / package).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def import_edges(src: Path, *, every: bool) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports. `every`: also inside functions and under
    TYPE_CHECKING; else only what runs while the module is imported."""
    modules = our_modules(src)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node, runs_at_import in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not (every or runs_at_import):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            if base in modules:
                found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules)
        found.discard(name)
        graph[name] = found
    return graph


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    def walk(node: ast.AST, at_import: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, at_import
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for item in child.body:
                    yield from walk(ast.Module(body=[item], type_ignores=[]), False)
                for item in child.orelse:
                    yield from walk(ast.Module(body=[item], type_ignores=[]), at_import)
            else:
                yield from walk(child, at_import)

    yield from walk(tree, True)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    # Deep enough for any import graph, and put back after: the limit is the process's
    # (tests/unit/test_layers.py calls this in the test session, where another test reads
    # the limit as the JSON decoder's nesting depth that docs/http-api.md quotes).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(10_000, limit))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(groups)


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of distinct modules, each importing the next. Exact: past a
    module outside every cycle, the rest of a chain cannot meet what came before it, so
    only the modules visited inside the current cycle are remembered."""
    group_of = {m: i for i, group in enumerate(cycles(graph)) for m in group}

    @cache
    def longest(v: str, inside: frozenset[str]) -> tuple[str, ...]:
        best: tuple[str, ...] = (v,)
        for w in sorted(graph[v]):
            same = v in group_of and group_of.get(w) == group_of[v]
            if same and w in inside:
                continue
            rest = longest(w, inside | {w} if same else frozenset({w}))
            if len(rest) + 1 > len(best):
                best = (v, *rest)
        return best

    chains: list[tuple[str, ...]] = [longest(v, frozenset({v})) for v in sorted(graph)]
    best: tuple[str, ...] = max(chains, key=len)
    return list(best)


def runtime_chain(root: Path) -> dict[str, Any]:
    """The deepest nesting of imports `-X importtime` shows for ENTRY_MODULES, and the
    nesting that holds the most of our modules."""
    deepest: list[str] = []
    most_ours: list[str] = []
    for module in ENTRY_MODULES:
        env = {**os.environ, "PYTHONPATH": str(root / "src")}
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", f"import {module}"],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        rows = []
        for line in done.stderr.splitlines():
            if line.startswith("import time:") and "cumulative" not in line:
                name = line.split("|")[-1]
                rows.append(((len(name) - len(name.lstrip())) // 2, name.strip()))
        path: list[str] = []
        for depth, name in reversed(rows):  # importtime prints children first
            path = [*path[:depth], name]
            if len(path) > len(deepest):
                deepest = list(path)
            if _count(path)["ours"] > _count(most_ours)["ours"]:
                most_ours = list(path)
    return {
        "deepest": {"modules": len(deepest), **_count(deepest), "chain": deepest},
        "most_ours": {"modules": len(most_ours), **_count(most_ours), "chain": most_ours},
    }


def _count(chain: list[str]) -> dict[str, int]:
    kinds = [_kind(name) for name in chain]
    return {key: kinds.count(kind) for key, kind in
            (("ours", "ours"), ("third_party", "third-party"), ("stdlib", "stdlib"))}  # fmt: skip


def _kind(module: str) -> str:
    top = module.split(".")[0]
    if top in OURS:
        return "ours"
    return "stdlib" if top in sys.stdlib_module_names or top.startswith("_") else "third-party"


# -- exceptions, functions, docs tests -------------------------------------------------


def exceptions(src: Path) -> dict[str, Any]:
    bases = []
    for qualified in BASES:
        holder, _, base = qualified.rpartition(".")
        try:
            bases.append(getattr(importlib.import_module(holder), base))
        except (ImportError, AttributeError):
            continue
    ours: list[type[BaseException]] = []
    testkit: list[str] = []
    for name in our_modules(src):
        if name.endswith("__main__"):
            continue
        for cls in _classes(importlib.import_module(name)):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                if name.split(".")[0] == "testkit":
                    testkit.append(f"{name}.{cls.__qualname__}")
                else:
                    ours.append(cls)
    without = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in ours if not issubclass(c, tuple(bases))
    )
    return {"classes": len(ours), "without_base": len(without), "without_list": without,
            "testkit": len(testkit)}  # fmt: skip


def _classes(holder: object) -> Iterator[type]:
    for value in vars(holder).values():
        if inspect.isclass(value):
            yield value
            if value.__module__ == getattr(holder, "__name__", value.__module__):
                yield from _classes(value)


def long_functions(src: Path) -> dict[str, Any]:
    total = over = 0
    for path in our_modules(src).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                total += 1
                over += (node.end_lineno or node.lineno) - node.lineno + 1 > 50
    return {"functions": total, "over_50": over, "share": round(100 * over / total, 2)}


def docs_tests(root: Path) -> dict[str, int]:
    def lines(path: Path) -> int:
        return len(path.read_text(encoding="utf-8").splitlines())

    tests = sorted((root / "tests" / "unit").glob("test_docs_*.py"))
    docs = [*sorted((root / "docs").glob("*.md")), root / "README.md"]
    return {"files": len(tests), "lines": sum(map(lines, tests)),
            "docs_lines": sum(map(lines, docs))}  # fmt: skip


# -- the report ----------------------------------------------------------------------


def measure(root: Path) -> dict[str, Any]:
    src = root / "src"
    every = import_edges(src, every=True)
    at_import = import_edges(src, every=False)
    chain = longest_chain(at_import)
    return {
        "paths": measure_paths(root),
        "import_cycles": cycles(every),
        "longest_chain": {"modules": len(chain), "chain": chain},
        "runtime_chain": runtime_chain(root),
        "exceptions": exceptions(src),
        "functions": long_functions(src),
        "docs_tests": docs_tests(root),
    }


def show(found: dict[str, Any], verbose: bool) -> None:
    print("path      files  jumps  two-way")
    for name, path in found["paths"].items():
        print(f"{name:<9} {path['files']:>5}  {path['jumps']:>5}  {path['two_way']:>7}")
        if verbose:
            print("          files:", ", ".join(path["file_list"]))
            for pair in path["two_way_pairs"]:
                print("          two-way:", pair)
    groups = found["import_cycles"]
    print(f"import cycles: {len(groups)}")
    for group in groups:
        print("  " + ", ".join(group))
    chain = found["longest_chain"]
    print(f"longest import chain (our modules): {chain['modules']}")
    print("  " + " -> ".join(chain["chain"]))
    for what, about in (("deepest", "deepest"), ("most_ours", "with the most of ours")):
        run = found["runtime_chain"][what]
        print(
            f"import nesting at run time, {about}: {run['modules']} modules: {run['ours']} "
            f"ours, {run['third_party']} third-party, {run['stdlib']} standard library"
        )
        print("  " + " -> ".join(run["chain"]))
    exc = found["exceptions"]
    print(
        f"exception classes: {exc['classes']} in ledger, policies, daemon, sendledger; "
        f"without the base: {exc['without_base']} (test kit, its own: {exc['testkit']})"
    )
    if verbose:
        for name in exc["without_list"]:
            print("  " + name)
    fn = found["functions"]
    print(f"functions over 50 lines: {fn['over_50']} of {fn['functions']} ({fn['share']}%)")
    docs = found["docs_tests"]
    print(
        f"docs tests: {docs['files']} files, {docs['lines']} lines, "
        f"guarding {docs['docs_lines']} lines of docs"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="the lists too")
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path[:0] = [str(root / "src"), str(root)]
    found = measure(root)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        show(found, args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
