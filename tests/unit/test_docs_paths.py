"""What the docs, docstrings and comments point at exists: links, anchors, paths, names in code,
cited sections, what checks each section (docs/development.md "Writing the docs")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from tests.unit.docs_code import KEYS, MAKE_TARGETS
from tests.unit.docs_page import CODE, PAGES, REPO, SRC, missing_paths, prose_lines

from daemon.cli import COMMANDS
from daemon.config.settings import Settings

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TEXTS = [*PAGES, *(p for d in ("src", "tests", "bench") for p in sorted((REPO / d).rglob("*.py")))]
CITATION = re.compile(r"docs/([a-z-]+)\.md`{0,2},? \(?\"([^\"]+)\"", re.M)
ROW = re.compile(r"^\| \[(?P<section>.+?)\]\(#[^)]*\) \| (?P<items>.*) \|$")
#: Dotted module name -> file and its syntax tree, for every module under src/.
MODULES = {
    ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
    for p in SRC.rglob("*.py")
}
TREES = {m: ast.parse(path.read_text(encoding="utf-8")) for m, path in MODULES.items()}
CLASSES = [n for tree in TREES.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
#: Dotted names like ours that are not: Gmail calls and scopes, Graph permissions, IMAP; files.
NOT_CODE = {f"drafts.{c}" for c in ("create", "get", "list", "send", "delete", "error")}
NOT_CODE |= {"messages.get", "messages.send", "gmail.compose", "gmail.metadata", "Mail.Send"}
NOT_CODE |= {"Mail.ReadWrite", "gmail.readonly", "gmail.modify", "RFC822.SIZE", "job.bounced"}
FILE_SUFFIX = re.compile(r"\.(toml|service|sqlite|log|json|md|yml)$")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path != Path(__file__) else ""  # its examples


def headings(path: Path) -> list[str]:
    return [h[1] for line in prose_lines(read(path)) if (h := re.match(r"#{1,6} (.*)", line))]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors: lowercase, punctuation but `-`, `_` dropped, spaces `-`, repeats `-1`."""
    seen: dict[str, int] = {}
    for heading in headings(path) if path.suffix == ".md" else ():
        base = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[base if base not in seen else f"{base}-{seen[base]}"] = 0
        seen[base] = seen.get(base, 0) + 1
    return set(seen)


def links(path: Path) -> list[str]:
    """The targets of a page's links but for other sites' (https:, mailto:: not ours)."""
    found = [LINK.findall(re.sub(r"`+[^`]*`+", "", line)) for line in prose_lines(read(path))]
    return [t for ts in found for t in ts if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_link_reaches_a_file_and_a_heading_and_the_pages_link_to_each_other() -> None:
    broken = []
    for path, target in [(p, t) for p in PAGES for t in links(p)]:
        file_part, _, fragment = target.partition("#")
        goal = (path.parent / file_part).resolve() if file_part else path
        if not goal.exists() or (fragment and fragment not in anchors(goal)):
            broken.append(f"{path.name}: {target}")
    assert broken == []
    docs, linked = PAGES[1:], {(REPO / t.partition("#")[0]).resolve() for t in links(PAGES[0])}
    assert [p.name for p in docs if p.resolve() not in linked] == []
    back = [p.name for p in docs if p.name != "architecture.md" and "../README.md" not in links(p)]
    assert back == []


def problem_with(item: str) -> str | None:
    """What is wrong with an item of "What checks this page": a path, `make T`, `sendledger C`."""
    if re.match(r"(tests|bench)/\S+\.py", item):
        return "; ".join(missing_paths(item)) or None
    command = item.split()[:2]
    known = {"make": MAKE_TARGETS, "sendledger": COMMANDS}.get(command[0], ())
    ok = command[1:] and command[1] in known
    return None if ok else "not a test or bench path, a `make TARGET` or a `sendledger COMMAND`"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_section_names_what_checks_it(path: Path) -> None:
    """Each `##`-`####` section with prose has a row in "What checks this page" naming only
    things that exist (and no `Checked by:` line); each invariant, numbered in order, its tests."""
    found: dict[str, list[str]] = {}
    prose: list[str] = []
    for line in prose_lines(read(path)):
        if heading := re.match(r"(#{1,6}) (.*)", line):
            prose = found.setdefault(heading[2], []) if 2 <= len(heading[1]) <= 4 else []
        elif line.strip():
            prose.append(line)
    rows = [row for line in found.pop("What checks this page", []) if (row := ROW.match(line))]
    named = {row["section"].replace("\\|", "|"): CODE.findall(row["items"]) for row in rows}
    out = [f"a row for no section '{s}'" for s in set(named) - set(found)]
    for title, lines in found.items():
        if any(line.startswith("Checked by:") for line in lines):
            out.append(f"'{title}': a `Checked by:` line in the prose")
        if lines and not named.get(title):
            out.append(f"'{title}': no row in 'What checks this page', or empty")
        out += [f"'{title}': {i}: {p}" for i in named.get(title, []) if (p := problem_with(i))]
    invariants = "\n".join(found.get("Invariants", []))  # architecture.md's: each names its tests
    listed = re.findall(r"^(\d+)\. \*\*(.*?)(?=^\d+\. |\Z)", invariants, re.M | re.S)
    for i, (n, body) in enumerate(listed, 1):
        if n != str(i) or not re.search(r"`tests/[\w/]*", body):
            out.append(f"invariant {n}: not number {i}, or it names no test")
    assert out == []


def members(body: list[ast.stmt], dotted: str = "", *, attributes: bool = False) -> set[str]:
    """The names a module's body (or its class `dotted`) defines; `attributes`: `self.x` too."""
    for part in filter(None, dotted.split(".")):
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == part), [])
    names: set[str] = set()
    for node in ast.walk(ast.Module(body=body, type_ignores=[])) if attributes else ():
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "self":
            names.add(node.attr)
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def problem(span: str, *, ours_only: bool = False) -> str | None:
    """What is wrong with one code span, or None; `ours_only`: skip classes not ours."""
    span = span.removeprefix("src/").removesuffix("()")
    if span in NOT_CODE or FILE_SUFFIX.search(span):
        return None

    def by_path(path: str) -> list[str]:
        return [m for m, p in MODULES.items() if p.as_posix().endswith("/" + path)]

    if located := re.fullmatch(r"([\w/]+\.py): ?([\w.]+)", span):
        found = by_path(located.group(1))
        if len(found) != 1:
            return f"{located.group(1)} names {len(found)} modules"
        owner, _, name = located.group(2).rpartition(".")
        return None if name in members(TREES[found[0]].body, owner) else f"not in {found[0]}"
    if re.fullmatch(r"[\w/]+\.py", span):
        if re.match(r"(tests|bench|scripts)/", span):
            return None if (REPO / span).is_file() else "no such file"
        return None if len(by_path(span)) == 1 else "names no one module"
    if re.fullmatch(r"(providers|webhooks)\.NAME\.\w+", span):
        return None if span in {key for _, key in KEYS} else f"no setting {span}"
    if member := re.fullmatch(r"([A-Z]\w*)\.(\w+)", span):
        cls, name = member.groups()
        bodies = [c.body for c in CLASSES if c.name == cls]
        if cls == "Resolution" or not bodies:  # Resolution.SENT: an enum's member
            return None if ours_only or cls == "Resolution" else f"no class {cls} in src"
        ok = any(name in members(body, attributes=True) for body in bodies)
        return None if ok else f"{cls} has no {name}"
    if dotted := re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)*)\.(\w+)", span):
        head, name = dotted.groups()
        if head in ("providers", "webhooks"):  # `providers.support`: a NAME of the config
            return None
        if (section := Settings.model_fields.get(head)) and head != "policies":
            fields = getattr(section.annotation, "model_fields", {})
            return None if name in fields else f"no setting {span}"
        candidates = [m for m in MODULES if m == head or m.endswith("." + head)]
        ok = any(name in members(TREES[m].body) or f"{m}.{name}" in MODULES for m in candidates)
        return None if ok or not candidates else f"nothing named {name} in {candidates}"
    return None


def test_every_path_section_module_and_name_a_page_docstring_or_comment_names_exists() -> None:
    """A citation names a heading's first words and may wrap onto a comment's next line; a
    package's docstring names only its own: a bare name (``health``) is one of its modules, or
    a name they or their classes define."""
    wrong = [f"{p.relative_to(REPO)}: {gone}" for p in TEXTS for gone in missing_paths(read(p))]
    for path in TEXTS:
        for name, cited in CITATION.findall(read(path)):
            cited = re.sub(r"\s*\n\s*(#:?)?\s*|\s+", " ", cited)
            page = REPO / "docs" / f"{name}.md"
            titles = headings(page) if page.exists() else []
            if not any(re.match(rf"{re.escape(cited)}\b", h) for h in titles):
                wrong.append(f'{path.relative_to(REPO)}: {name}.md "{cited}"')
    spans = [(p.name, span) for p in PAGES for span in CODE.findall(read(p))]
    wrong += sorted({f"{name}: `{s}`: {why}" for name, s in spans if (why := problem(s))})
    tops = {m.split(".")[0] for m in MODULES}
    for package, path in MODULES.items():
        for node in ast.walk(TREES[package]):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                for span in re.findall(r"`{1,2}([^`\n]+)`{1,2}", ast.get_docstring(node) or ""):
                    if why := problem(span, ours_only=True):
                        wrong.append(f"{path.relative_to(REPO)}: `{span}`: {why}")
        if path.name != "__init__.py" or not (doc := ast.get_docstring(TREES[package])):
            continue
        inside = [m for m in MODULES if m.startswith(package + ".")]
        known = {m.rpartition(".")[2] for m in inside} | members(TREES[package].body)
        for body in (TREES[m].body for m in inside):
            classes = [c.body for c in body if isinstance(c, ast.ClassDef)]
            known |= members(body).union(*map(members, classes))
        for name in re.findall(r"`{1,2}([a-z_]\w*[a-z0-9])`{1,2}", doc):  # `whsec_`: a prefix
            if name not in known and name.split(".")[0] not in tops:
                wrong.append(f"{path.relative_to(REPO)}: {name}")
    assert wrong == []
