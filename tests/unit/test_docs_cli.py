"""docs/cli.md against the code it describes, both ways (docs/development.md "Writing the
docs"): the command list against the parser `daemon.cli.build_parser` builds (every command,
option, positional argument and choice), the exit code table against `daemon/exit_codes.py`,
the job fields against `parse_job`'s field lists, the limits against the constants that
enforce them, and the JSON shapes the command list shows against what the commands print."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.unit import docs_page
from tests.unit.engine_rig import EngineRig, policy

import daemon.cli.job_commands
from daemon import exit_codes
from daemon.cli import main
from daemon.config.settings import GmailProviderSettings
from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.read_models import event_record, job_status, review_rows
from daemon.service_layer.services import CheckAnswer, Copy, Refusal, TriageItem, check_advice
from ledger import attachments, content, extra_headers, keys
from ledger.application import SubmitResult
from ledger.vocabulary import JobState

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
OPTION = re.compile(r"--[a-z][a-z-]*")
CHOICES = re.compile(r"(--[a-z][a-z-]*)[ =]([a-z][\w-]*(?:\|[a-z][\w-]*)+)")
PATH_WORD = re.compile(r"[a-z][a-z-]*")
GMAIL_FIELDS = GmailProviderSettings.model_fields


def section(heading: str) -> str:
    """The text under `heading` up to the next heading of any level."""
    return docs_page.section(REPO / "docs" / "cli.md", heading, until=6)


# -- the command list ---------------------------------------------------------------------


def documented() -> dict[tuple[str, ...], list[str]]:
    """Each command path of the list in "Command line" with its entry's text: its synopsis
    line, the lines that continue it and the description (an option a description names
    is that command's too). A command listed twice (two forms) has both texts."""
    block = section("## Command line").split("```\n", 1)[1].split("```", 1)[0]
    entries: dict[tuple[str, ...], list[str]] = {}
    current: list[str] = []
    for line in block.splitlines():
        if line.startswith("sendledger"):
            words = line.split()[1:]
            path = tuple(_path_words(words))
            current = entries.setdefault(path, [])
            current.append(line)
        else:
            current.append(line)
    return entries


def _path_words(words: list[str]) -> Iterator[str]:
    for word in words:
        if not PATH_WORD.fullmatch(word):
            return
        yield word


def synopsis(path: tuple[str, ...]) -> str:
    """The command's own lines (options and arguments, no description column)."""
    return " ".join(
        re.split(r"\s{3,}", line.strip())[0]
        for line in documented()[path]
        if line.startswith("sendledger") or re.match(r"\s+\[", line)
    )


def parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every parser by its command path; () is the top level."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        found[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*path, name))

    walk(daemon.cli.build_parser(), ())
    return found


def runnable() -> set[tuple[str, ...]]:
    """The command paths that run something (the top level and the leaves)."""
    return {
        path
        for path, parser in parsers().items()
        if path == () or parser.get_default("func") is not None
    }


def shown_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    # --help is argparse's; a suppressed option (--config after the command) is the top
    # level's, documented there.
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and a.help != argparse.SUPPRESS
    ]


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in shown_actions(parser) for o in a.option_strings if o.startswith("--")}


def test_every_command_is_listed_and_every_listed_command_exists() -> None:
    assert set(documented()) == runnable()


@pytest.mark.parametrize("path", sorted(runnable()), ids=" ".join)
def test_a_commands_options_are_listed_and_exist(path: tuple[str, ...]) -> None:
    on_page = set(OPTION.findall(" ".join(documented()[path]))) - {"--help"}
    assert on_page == options_of(parsers()[path])


@pytest.mark.parametrize("path", sorted(runnable()), ids=" ".join)
def test_positional_arguments_and_required_options_are_shown_as_such(
    path: tuple[str, ...],
) -> None:
    line = synopsis(path)
    for action in shown_actions(parsers()[path]):
        if not action.option_strings:
            name = str(action.metavar or action.dest).upper()
            optional = action.nargs == "?"
            assert re.search(rf"\[{name}\b" if optional else rf"(?<!\[){name}\b", line), name
        elif action.required:
            assert re.search(rf"(?<!\[){action.option_strings[0]}\b", line), action.dest


@pytest.mark.parametrize("path", sorted(runnable()), ids=" ".join)
def test_the_choices_written_are_the_parsers(path: tuple[str, ...]) -> None:
    by_option = {o: a for a in shown_actions(parsers()[path]) for o in a.option_strings}
    for option, written in CHOICES.findall(synopsis(path)):
        assert set(written.split("|")) == set(by_option[option].choices or ()), option


def test_the_checker_reads_the_list_as_written() -> None:
    assert ("review", "resolve") in documented()
    assert synopsis(("review", "resolve")).startswith("sendledger review resolve KEY --as sent|")
    assert {"--older-than", "--key"} <= set(
        OPTION.findall(" ".join(documented()[("admin", "purge")]))
    )


# -- exit codes ---------------------------------------------------------------------------


def exit_table() -> dict[int, str]:
    rows = re.findall(r"^\| `(\d+)` \| (.+) \|$", section("### Exit codes"), re.M)
    return {int(code): meaning for code, meaning in rows}


def test_the_exit_code_table_is_the_codes_the_cli_uses() -> None:
    constants = {v for k, v in vars(exit_codes).items() if k.startswith("EXIT_")}
    assert set(exit_table()) == constants | {130}
    # Each refusal of the service layer lands on the row that names it.
    table = exit_table()
    assert {kind: table[code].split(":")[0] for kind, code in exit_codes.REFUSAL_CODES.items()} == {
        Refusal.BAD_INPUT: "bad input",
        Refusal.NOT_FOUND: "unknown job",
        Refusal.CONFLICT: "conflict",
        Refusal.UNAVAILABLE: "unexpected failure, or a mailbox search that could not be made "
        "(`review check`, a resend)",
    }


def test_an_interrupted_command_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(daemon.cli.job_commands, "cmd_status", interrupted)
    assert main(["status", "any-key"]) == 130


# -- job fields and limits ------------------------------------------------------------------


def test_the_job_fields_are_parse_jobs() -> None:
    text = section("### Message fields")
    required = re.search(r"Required: ((?:`\w+`(?:,\s)?)+)\.", text)
    optional = re.search(r"Optional: ((?:`\w+`,\s)+)and:", text)
    assert required and optional
    table = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert re.findall(r"`(\w+)`", required.group(1)) == list(content.REQUIRED_FIELDS)
    written = re.findall(r"`(\w+)`", optional.group(1)) + table
    assert sorted(written) == sorted(content.OPTIONAL_FIELDS)


LIMITS = {
    "subject": [content.MAX_SUBJECT],
    "one extra header value": [content.MAX_HEADER_VALUE],
    "extra headers": [content.MAX_EXTRA_HEADERS],
    "extra header name": [extra_headers.MAX_HEADER_NAME],
    "an address as typed, display name included": [content.MAX_ADDRESS_TEXT],
    "references": [content.MAX_REFERENCES, extra_headers.MAX_MESSAGE_ID],
    "attachment file name": [attachments.MAX_FILENAME],
    "the whole message": [GMAIL_FIELDS["max_message_bytes"].default // 1_000_000],
}


def numbers(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def test_the_limits_table_is_the_constants() -> None:
    rows = re.findall(r"^\| ([^|`]+?) \| ([^|]+) \| ", section("#### Limits"), re.M)
    assert {what: numbers(most) for what, most in rows if what != "What"} == LIMITS


def test_the_limits_in_the_prose_are_the_constants() -> None:
    fields = section("### Message fields")
    assert (
        f"at most {content.MAX_EXTRA_HEADERS}, each value at most "
        f"{content.MAX_HEADER_VALUE:,} characters, names at most "
        f"{extra_headers.MAX_HEADER_NAME}" in fields
    )
    assert f"at most {content.MAX_REFERENCES} message ids" in fields
    assert f"`-`, `_`; at most {content.MAX_THREAD_ID_LENGTH})" in fields
    assert f"more than {extra_headers.MAX_WORD} characters without a space" in fields
    assert f"longer than {extra_headers.MAX_MESSAGE_ID} characters" in fields
    assert f"longer than {attachments.MAX_FILENAME} characters" in fields
    validation = section("### Message fields and validation")
    assert (
        f"Gmail's defaults\n  {GMAIL_FIELDS['max_message_bytes'].default // 1_000_000} MB and "
        in validation
    )
    assert f"and {GMAIL_FIELDS['max_recipients'].default}" in validation
    key_rules = " ".join(section("### Keys").split())
    assert f"at most {content.MAX_KEY_LENGTH} characters" in key_rules
    assert f"at most {keys.MAX_NAME_LENGTH} characters" in key_rules
    assert f"more than {keys.MAX_NOTE_LENGTH} characters" in key_rules


# -- the JSON the command list shows -----------------------------------------------------


def shown_fields(path: tuple[str, ...], after: str = "") -> list[str]:
    """The quoted names of the first `{...}` of a command's entry (after `after`)."""
    text = " ".join(line.strip() for line in documented()[path])
    text = text.split(after, 1)[1] if after else text
    start = end = text.index("{")
    depth = 0
    while True:
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return re.findall(r'"(\w+)"', text[start : end + 1])
        end += 1


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("receipts", on_unknown="review"))
    yield rig
    rig.close()


def test_submit_prints_the_fields_shown() -> None:
    result = SubmitResult(key="k", message_id="<m@x>", state="requested", created=True)
    assert shown_fields(("submit",)) == list(result.as_dict())


def test_status_prints_the_fields_shown(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    status = job_status(rig.job("k1"))
    shown = shown_fields(("status",))
    assert [f for f in shown if f not in ("reason", "send_at")] == list(status)
    assert shown_fields(("status",), after='"purged":') == ["at", "by"]
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    assert "reason" in job_status(rig.job("k1"))
    assert shown.index("reason") == list(job_status(rig.job("k1"))).index("reason")


def test_history_and_review_list_print_the_fields_shown(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    assert list(event_record(rig.ledger.history("k1")[0]))[:3] == shown_fields(
        ("history",), after="oldest first:"
    )
    [row] = review_rows(rig.ledger)
    assert list(row) == [f for f in shown_fields(("review", "list")) if f not in ("send_at",)]


def test_review_check_and_triage_print_the_fields_shown() -> None:
    answer = CheckAnswer(
        "k", "review", "<m@x>", "rfc822msgid:m@x", [Copy("p", "d", "t", "s")], True
    )
    body: dict[str, Any] = answer.as_dict()
    shown = shown_fields(("review", "check"))
    assert [f for f in shown if f not in ("provider_id", "date", "to", "subject")] == list(body)
    assert shown[shown.index("copies") + 1 :][:4] == list(body["copies"][0])
    item = TriageItem("k", "c", None, 0, [], "left", "none found: left in review")
    assert shown_fields(("review", "triage"), after="--json:") == list(item.as_dict())


def test_check_advises_a_resolve_only_in_review() -> None:
    for copies in (0, 1, 2):
        assert "review resolve" in check_advice("k", "review", copies)
    for state in ("requested", "unknown", "confirmed", "abandoned", "cancelled"):
        assert "resolve" not in check_advice("k", state, 1).replace("nothing to resolve", "")


def test_the_headers_named_are_the_owned_and_allowed_ones() -> None:
    text = " ".join(section("### Message fields").split())
    owned = re.search(r"\(`headers\.Message-ID: [^`]+`; also (.+?): use the job's own", text)
    assert owned is not None
    names = re.findall(r"`([\w-]+)`", owned.group(1))
    assert "any `Content-*`" in owned.group(1)
    assert {"message-id", *(n.lower() for n in names)} == extra_headers.OWNED_HEADERS
    allowed = re.search(r"\| `headers` \| `\{\"Name\": \"value\"\}`: (.+?) \(at most", text)
    assert allowed is not None
    assert re.findall(r"`([\w-]+)`", allowed.group(1)) == list(
        extra_headers.ALLOWED_HEADERS.values()
    )
    assert "and any `X-*`" in allowed.group(1)


def test_every_name_recorded_as_who_acted_follows_the_key_rule(rig: EngineRig) -> None:
    from daemon.service_layer.services import ChannelPolicies, ServiceError, Services

    rig.submit("receipts", "k1")
    s = Services(rig.ledger, lambda: ChannelPolicies(rig.policies), providers=None)
    for bad in ("ops\x1b[31m", "o" * (keys.MAX_NAME_LENGTH + 1)):
        with pytest.raises(ServiceError) as refused:
            s.cancel("k1", note="", by=bad)
        assert refused.value.kind is Refusal.BAD_INPUT and refused.value.message.startswith(
            "job.by:"
        )
    with pytest.raises(ServiceError) as refused:
        s.cancel("k1", note="x" * (keys.MAX_NOTE_LENGTH + 1), by="ops")
    assert refused.value.message.startswith("job.note:")
    assert rig.job("k1").state is JobState.REQUESTED


def test_the_net_under_every_line_escapes_all_but_line_breaks_and_tabs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import sys

    from daemon.cli import output

    raw = io.StringIO()
    monkeypatch.setattr(sys, "stdout", raw)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # both are wrapped; both put back
    output.guard_streams()
    print("k\x1b[31m\u202e\u2028\x9b\x7f\tend")
    assert raw.getvalue() == "k\\x1b[31m\\u202e\\u2028\\x9b\\x7f\tend\n"


def test_the_specials_a_display_name_must_quote_are_the_validators() -> None:
    from ledger import addresses

    text = " ".join(section("### Message fields and validation").split())
    listed = re.search(r"a display name with any of (.+?) must be in double quotes", text)
    assert listed is not None
    assert set(re.findall(r"`(.)`", listed.group(1))) == addresses._SPECIALS
    for special in addresses._SPECIALS - {'"', "\\"}:
        with pytest.raises(addresses.AddressError):
            addresses.parse_mailbox(f"A{special}B <a@example.com>")
        assert addresses.parse_mailbox(f'"A{special}B" <a@example.com>').display_name


def test_the_help_names_the_codes_of_the_table() -> None:
    epilog = daemon.cli.build_parser().epilog or ""
    assert {int(code) for code in re.findall(r"\b(\d+) [a-z]", epilog)} == set(exit_table())
