"""What the docs and the docstrings point at exists (docs/development.md "Writing the docs"):
every relative link reaches a file and, with a `#fragment`, a heading of it (GitHub's
anchors); every docs page is linked from the README and back; every source, test and bench
path named in a page, a docstring or a comment is a file; every module, class, function,
method and setting a page names in code is where it says; a package's docstring names its
own modules; and a citation of a page's section ("docs/architecture.md "Stores"") names a
heading it has. Each checker is shown a stale name it must see."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.unit.docs_page import CODE, PAGES, REPO, prose_lines

from daemon.config.settings import Settings

SRC = REPO / "src"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TEXTS = [*PAGES, *sorted(SRC.rglob("*.py")), *sorted((REPO / "tests").rglob("*.py"))]
TEXTS += sorted((REPO / "bench").rglob("*.py"))


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path != Path(__file__) else ""


# -- links ---------------------------------------------------------------------------------


def anchors(path: Path) -> set[str]:
    """Every heading's GitHub anchor (lowercase, punctuation but `-` and `_` dropped, spaces
    to `-`); a repeated one gets `-1`, `-2`..."""
    seen: dict[str, int] = {}
    for line in prose_lines(read(path)):
        if heading := re.match(r"#{1,6} (.*)", line):
            base = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            seen[base if base not in seen else f"{base}-{seen[base]}"] = 0
            seen[base] = seen.get(base, 0) + 1
    return set(seen)


def links(path: Path) -> list[str]:
    return [
        t for line in prose_lines(read(path)) for t in LINK.findall(re.sub(r"`+[^`]*`+", "", line))
    ]


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, fragment = target.partition("#")
        goal = (path.parent / file_part).resolve() if file_part else path
        if not goal.exists():
            broken.append(f"{path.name}: {target}: no such file")
        elif fragment and (goal.suffix != ".md" or fragment not in anchors(goal)):
            broken.append(f"{path.name}: {target}: no such heading")
    return broken


def test_every_link_reaches_a_file_and_a_heading_and_the_pages_link_to_each_other() -> None:
    assert [b for path in PAGES for b in broken_links(path)] == []
    readme, docs = PAGES[0], PAGES[1:]
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(readme)}
    assert [p.name for p in docs if p.resolve() not in linked] == []
    back = [p.name for p in docs if p.name != "architecture.md" and "../README.md" not in links(p)]
    assert back == []
    lines = read(readme).splitlines()  # the first screen ends with the docs list
    assert max(i for i, line in enumerate(lines) if "](docs/" in line) < 59


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A `code`, heading!\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n[ok](other.md#a-code-heading) [ok](#here) [ok](https://x.test/y)\n"
        "[bad](other.md#nope) [bad](#gone) [bad](missing.md)\n\n```\n[in code](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "page.md: other.md#nope: no such heading",
        "page.md: #gone: no such heading",
        "page.md: missing.md: no such file",
    ]


# -- paths ---------------------------------------------------------------------------------

SOURCE_PATH = re.compile(
    r"(?<![\w/.])(?:src/)?((?:daemon|ledger|policies|testkit|sendledger)/[\w/]+\.py)"
)
REPO_PATH = re.compile(r"(?<![\w/.])((?:tests|bench)/[\w/]+\.py)(?:::(\w+))?")


def missing_paths(text: str) -> list[str]:
    """Named source paths (`src/`-relative), test and bench paths (a test's `::name` too)
    that are not there."""
    gone = [p for p in SOURCE_PATH.findall(text) if not (SRC / p).exists()]
    for path, name in REPO_PATH.findall(text):
        file = REPO / path
        if not file.is_file():
            gone.append(path)
        elif name and not re.search(rf"^\s*(def|class) {name}\b", file.read_text(), re.M):
            gone.append(f"{path}::{name}")
    return gone


def test_every_path_a_page_docstring_or_comment_names_exists() -> None:
    missing = [f"{p.relative_to(REPO)}: {gone}" for p in TEXTS for gone in missing_paths(read(p))]
    assert sorted(set(missing)) == []


def test_the_path_checker_sees_a_stale_name() -> None:
    text = "see `src/daemon/settings.py`, daemon/engine/health.py, tests/unit/test_cli_lazy.py,"
    text += " tests/unit/test_layers.py::test_gone, and tests/unit/test_layers.py"
    assert missing_paths(text) == [
        "daemon/settings.py",
        "daemon/engine/health.py",
        "tests/unit/test_cli_lazy.py",
        "tests/unit/test_layers.py::test_gone",
    ]


# -- names in code ---------------------------------------------------------------------------


@cache
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module under src/."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@cache
def members(path: Path, dotted: str = "", *, attributes: bool = False) -> frozenset[str]:
    """The names a module (or its class `dotted`) defines: functions, classes, assignments,
    imports; `attributes`: a class's instances' attributes too (`self.reason = ...`)."""
    body = tree(path).body
    for part in filter(None, dotted.split(".")):
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == part), [])
    names: set[str] = set()
    if dotted and attributes:
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
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
    return frozenset(names)


@cache
def classes() -> dict[str, list[tuple[Path, str]]]:
    """Every class of src/ by name (nested ones too) -> (file, dotted path in it)."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for path in modules().values():
        todo: list[tuple[list[ast.stmt], str]] = [(tree(path).body, "")]
        while todo:
            body, prefix = todo.pop()
            for node in body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append((path, prefix + node.name))
                    todo.append((node.body, f"{prefix}{node.name}."))
    return found


def defined(module: str, dotted: str) -> bool:
    *owner, name = dotted.split(".")
    return name in members(modules()[module], ".".join(owner))


#: Dotted names in the pages that are not our code although they look like it: Gmail API
#: calls and scopes, Graph permissions; and file names (`sendledger.toml`).
NOT_CODE = {"drafts.create", "drafts.get", "drafts.list", "drafts.send", "drafts.delete"}
NOT_CODE |= {"drafts.error", "messages.get", "messages.send", "gmail.compose", "gmail.metadata"}
NOT_CODE |= {"Mail.Send", "Mail.ReadWrite"}
NOT_CODE |= {"gmail.readonly", "gmail.modify", "RFC822.SIZE", "job.bounced"}  # scopes, IMAP, a name
FILE_SUFFIX = re.compile(r"\.(toml|service|sqlite|log|json|md|yml)$")


def problem(span: str, *, ours_only: bool = False) -> str | None:
    """What is wrong with one code span of a page, or None; `ours_only`: a class that is
    not ours is not checked (a docstring names the standard library's and the libraries')."""
    span = span.removeprefix("src/").removesuffix("()")
    if span in NOT_CODE or FILE_SUFFIX.search(span):
        return None
    by_path = lambda path: [m for m, p in modules().items() if p.as_posix().endswith("/" + path)]  # noqa: E731
    if located := re.fullmatch(r"([\w/]+\.py): ?([\w.]+)", span):
        found = by_path(located.group(1))
        if len(found) != 1:
            return f"{located.group(1)} names {len(found)} modules"
        return None if defined(found[0], located.group(2)) else f"not in {found[0]}"
    if re.fullmatch(r"[\w/]+\.py", span):
        if re.match(r"(tests|bench|scripts)/", span):
            return None if (REPO / span).is_file() else "no such file"
        return None if len(by_path(span)) == 1 else "names no one module"
    if member := re.fullmatch(r"([A-Z]\w*)\.(\w+)", span):
        cls, name = member.groups()
        if cls == "Resolution":  # Resolution.SENT: an enum's member
            return None
        if cls not in classes():
            return None if ours_only else f"no class {cls} in src"
        ok = any(name in members(p, d, attributes=True) for p, d in classes()[cls])
        return None if ok else f"{cls} has no {name}"
    if dotted := re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)*)\.(\w+)", span):
        head, name = dotted.groups()
        section = Settings.model_fields.get(head)
        if head in ("providers", "webhooks"):  # `providers.support`: a NAME of the config
            return None
        if section is not None and head != "policies":
            fields = getattr(section.annotation, "model_fields", {})
            return None if name in fields else f"no setting {span}"
        candidates = [m for m in modules() if m == head or m.endswith("." + head)]
        if not candidates:
            return None  # not ours (http.client, os.environ, checks.circuits)
        ok = any(defined(m, name) or f"{m}.{name}" in modules() for m in candidates)
        return None if ok else f"nothing named {name} in {candidates}"
    return None


def test_every_module_and_name_a_page_shows_in_code_is_where_it_says() -> None:
    wrong = {
        f"{p.name}: `{s}`: {why}"
        for p in PAGES
        for s in CODE.findall(read(p))
        if (why := problem(s))
    }
    assert sorted(wrong) == []


def test_every_name_a_docstring_shows_in_code_is_where_it_says() -> None:
    wrong = []
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                for span in re.findall(r"`{1,2}([^`\n]+)`{1,2}", ast.get_docstring(node) or ""):
                    if why := problem(span, ours_only=True):
                        wrong.append(f"{path.relative_to(REPO)}: `{span}`: {why}")
    assert wrong == []


def test_every_module_a_package_s_docstring_names_is_one_of_its_own() -> None:
    """`daemon/engine/__init__.py` naming ``health`` after it became readback.py: a bare
    name in a package's docstring is its module, or a name its modules define."""
    wrong = []
    for package, path in modules().items():
        if path.name != "__init__.py" or not (doc := ast.get_docstring(ast.parse(read(path)))):
            continue
        known = {m.rpartition(".")[2] for m in modules() if m.startswith(package + ".")}
        known |= {
            name for m in modules() if m.startswith(package) for name in members(modules()[m])
        }
        for sub in (m for m in modules() if m.startswith(package + ".")):
            known |= {
                n
                for c in members(modules()[sub])
                if c[0].isupper()
                for n in members(modules()[sub], c)
            }
        for name in re.findall(r"`{1,2}([a-z_]\w*[a-z0-9])`{1,2}", doc):  # `whsec_`: a prefix
            if name not in known and name.split(".")[0] not in {m.split(".")[0] for m in modules()}:
                wrong.append(f"{path.relative_to(REPO)}: {name}")
    assert wrong == []


def test_the_name_checker_sees_stale_names() -> None:
    assert problem("daemon/providers/message.py: render_checked") is None
    assert problem("daemon/engine/dispatch.py: render_wave") == "not in daemon.engine.dispatch"
    assert problem("SendJob.Requested") is None
    assert problem("SendJob.resend_now") == "SendJob has no resend_now"
    assert problem("policies.decisions.before_attempt") is None
    assert problem("policies.decisions.before_any") is not None
    assert problem("daemon.send_concurrency") == "no setting daemon.send_concurrency"
    assert problem("engine/wave.py") == "names no one module"


# -- citations of a page's section ------------------------------------------------------------

CITATION = re.compile(r"docs/([a-z-]+)\.md`{0,2},? \(?\"([^\"]+)\"", re.M)


def stale_citations(text: str) -> list[str]:
    """Citations by section that name no heading of the page (a heading's first words, up
    to a word's end, are enough); a citation may wrap onto a comment's next line."""
    stale = []
    for name, cited in CITATION.findall(text):
        cited = re.sub(r"\s*\n\s*(#:?)?\s*|\s+", " ", cited)
        page = REPO / "docs" / f"{name}.md"
        if not page.exists():
            stale.append(f'{name}.md "{cited}"')
            continue
        headings = re.findall(r"^#{1,6} (.+)$", "\n".join(prose_lines(read(page))), re.M)
        if not any(re.match(rf"{re.escape(cited)}\b", h) for h in headings):
            stale.append(f'{name}.md "{cited}"')
    return stale


def test_every_citation_names_a_section_of_its_page() -> None:
    stale = [f"{p.relative_to(REPO)}: {c}" for p in TEXTS for c in stale_citations(read(p))]
    assert stale == []


def test_the_citation_checker_sees_a_section_that_is_gone() -> None:
    text = 'see docs/architecture.md "Doors" and docs/architecture.md, "Layers" and\n'
    text += 'docs/cli.md "Exit codes", docs/development.md "Dev", docs/gone.md "Any"'
    assert stale_citations(text) == [
        'architecture.md "Doors"',
        'development.md "Dev"',
        'gone.md "Any"',
    ]
