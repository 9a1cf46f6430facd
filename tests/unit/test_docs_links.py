"""The README and the docs/ pages hold together (README "Documentation"): every relative link
reaches a file that exists and, with a `#fragment`, a heading of that file (GitHub's anchor
rules); every docs/ page is linked from the README; the README's first screen, up to the end of
its docs list, is under 60 lines; and no example port is used for two different things (the
API's `listen` and the emulators' or relays' `--port`), so the examples can run side by side."""

import re
from pathlib import Path

from daemon.cli.init_command import FIRST_KEY, config_text, installation, planned_files
from ledger.addresses import parse_mailbox

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (code shows links and headings, it has none)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but `-` and `_` removed, spaces
    to `-` (markup such as backticks is punctuation too)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets `-1`, `-2`... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return [
        target
        for line in prose_lines(path.read_text(encoding="utf-8"))
        for target in LINK.findall(CODE_SPAN.sub("", line))
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


def test_every_relative_link_reaches_a_file_and_a_heading() -> None:
    broken = [b for page in [README, *PAGES] for b in broken_links(page)]
    assert broken == []


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A `code`, heading!\n", encoding="utf-8")
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


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(README)}
    assert PAGES
    assert [p.name for p in PAGES if p.resolve() not in linked] == []


def test_every_docs_page_links_back_to_the_readme() -> None:
    assert [
        p.name for p in PAGES if p.name != "architecture.md" and "../README.md" not in links(p)
    ] == []


def test_the_first_screen_ends_with_the_docs_list_within_60_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    last_page_link = max(i for i, line in enumerate(lines) if "](docs/" in line)
    assert last_page_link + 1 < 60
    assert lines[2:6] == [
        "```sh",
        lines[3],
        lines[4],
        "```",
    ]
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ")


def ports(pattern: str) -> set[int]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in [README, *PAGES])
    return {int(p) for p in re.findall(pattern, text)}


def test_example_ports_do_not_clash() -> None:
    init_config = config_text("gmail", parse_mailbox("you@example.com"))
    api = ports(r"listen[`\s|=\"]+[^0-9\n]*127\.0\.0\.1:(\d+)") | {
        int(p) for p in re.findall(r'listen = "[^":]+:(\d+)"', init_config)
    }
    emulators = ports(r"sendledger emulator \w+ --port (\d+)")
    relays = ports(r"sendledger relay [^\n]*?--port (\d+)")
    assert api and emulators and relays
    assert api.isdisjoint(emulators | relays)
    assert emulators.isdisjoint(relays)


def edited_keys(config: str) -> list[str]:
    """The key set on the first line that is not a comment after each `# EDIT` comment."""
    keys, marked = [], False
    for line in config.splitlines():
        if line.startswith("# EDIT"):
            marked = True
        elif marked and not line.startswith("#"):
            keys.append(line.split("=")[0].strip())
            marked = False
    return keys


def test_the_quick_start_matches_what_init_writes_and_prints() -> None:
    """The README's quick start names the files `init` writes, the keys its config marks EDIT,
    and the key of the job it writes (tests/e2e/test_init.py runs that job to `confirmed`)."""
    text = README.read_text(encoding="utf-8")
    block = text.split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    config = config_text("gmail", parse_mailbox("you@example.com"))
    edited = edited_keys(config)
    assert edited == ["credentials_file", "user"]
    assert "the two values marked EDIT: credentials_file and user" in block
    [credentials] = re.findall(r'credentials_file = "([^"]+)"', config)
    assert f"chmod 600 mail/{credentials}" in block
    assert 'user = "you@example.com"' in config
    assert "submit mail/first-job.json" in block and f"status {FIRST_KEY} " in block
    assert [w for w in re.findall(r"sendledger (?:--config \S+ )?(\w+)", block)] == [
        "init",
        "run",
        "submit",
        "status",
    ]


def test_the_systemd_steps_name_what_init_writes(tmp_path: Path) -> None:
    """docs/operations.md "Running under systemd": `init` writes the config, the policies, the
    API token file (0600) and the unit; the steps add only the provider's credentials file, the
    one the config names, with `install -m 600`."""
    section = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = section.split("## Running under systemd", 1)[1].split("\n## ", 1)[0]
    mailbox = parse_mailbox("you@example.com")
    written = {p.path: p for p in planned_files("gmail", mailbox, installation(tmp_path))}
    assert {"sendledger.toml", "api-tokens", "sendledger.service"} <= set(written)
    assert any(path.startswith("policies/") for path in written)
    assert written["api-tokens"].mode == 0o600
    assert "# config, policies/, api-tokens (0600), sendledger.service" in section
    [credentials] = re.findall(r'credentials_file = "([^"]+)"', written["sendledger.toml"].text)
    assert credentials not in written
    assert f"sudo install -m 600 {credentials} /var/lib/sendledger/" in section


SOURCE_PATH = re.compile(
    r"(?<![\w/.])(?:src/)?((?:daemon|ledger|policies|testkit|sendledger)/[\w/]+\.py)"
)


REPO_PATH = re.compile(r"(?<![\w/.])((?:tests|bench)/[\w/]+\.py)")


def cited_paths(text: str) -> set[str]:
    """Source paths as `src/`-relative, test and bench paths as repo-relative."""
    return set(SOURCE_PATH.findall(text)) | set(REPO_PATH.findall(text))


def exists(cited: str) -> bool:
    return (REPO / "src" / cited).exists() or (REPO / cited).exists()


def test_every_source_file_a_document_or_docstring_names_exists() -> None:
    # A module moved or renamed leaves its old name behind in prose; a reader then looks
    # for a file that is not there.
    texts = [README, *PAGES, *sorted((REPO / "src").rglob("*.py"))]
    texts += sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "bench").rglob("*.py"))
    missing = sorted(
        f"{path.relative_to(REPO)}: {cited}"
        for path in texts
        if path != Path(__file__).resolve()
        for cited in cited_paths(path.read_text(encoding="utf-8"))
        if not exists(cited)
    )
    assert missing == []


def test_the_path_checker_sees_a_stale_name() -> None:
    text = "see `src/daemon/settings.py`, daemon/engine/wave.py and tests/unit/test_cli_lazy.py"
    assert cited_paths(text) == {
        "daemon/settings.py",
        "daemon/engine/wave.py",
        "tests/unit/test_cli_lazy.py",
    }
    assert not any(exists(cited) for cited in cited_paths(text))
