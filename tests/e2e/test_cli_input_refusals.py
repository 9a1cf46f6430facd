"""Issue 16 on the command line, as a user types it: bad keys, names given twice in job
JSON, out-of-bounds settings, URLs and listen addresses, and secret or policy files that
are not regular files are each one line naming the field, exit 2, nothing written, and
nothing hangs. A key stored before the key rule is still read and shown escaped
(docs/cli.md "Keys", docs/configuration.md "Configuration")."""

from __future__ import annotations

import csv
import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import config_text
from tests.e2e.test_cli_intake import job, one_error_line

from daemon.config.settings import load_settings
from daemon.from_settings import open_ledger
from ledger.content import JobContent
from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef, Sender

OLD_KEY = "old\x1b[2J\u202eexe.pdf\x07"
SHOWN = "old\\x1b[2J\\u202eexe.pdf\\x07"


def no_store(cli: Any) -> None:
    assert not (cli.root / "ledger.sqlite").exists()


def with_setting(section: str, line: str) -> str:
    text = config_text()
    if f"[{section}]\n" in text:
        return text.replace(f"[{section}]\n", f"[{section}]\n{line}\n")
    return text + f"\n[{section}]\n{line}\n"


def test_a_key_with_controls_bidi_or_invisible_characters_is_refused(cli: Any) -> None:
    for key in ("k\x1b]0;owned\x07", "k\x9b2J", "invoice\u202efdp.exe", "k\u200e", "k\u200b"):
        result = cli.submit(job(key))
        assert result.code == 2, result.stderr
        line = one_error_line(result, "job.key: must not contain", "U+")
        assert "\x1b" not in line and "\u202e" not in line
    no_store(cli)


def test_a_name_given_twice_in_job_json_is_refused_naming_it(cli: Any) -> None:
    text = json.dumps(job("dup"))[:-1] + ', "to": "mallory@example.com"}'
    result = cli.run("submit", "-", stdin=text)
    assert result.code == 2, result.stderr
    one_error_line(result, "job.to: given twice")
    nested = json.dumps(job("dup2", headers={"X-Tag": "a"})).replace(
        '"X-Tag": "a"', '"X-Tag": "a", "X-Tag": "b"'
    )
    result = cli.run("submit", "-", stdin="[" + json.dumps(job("ok")) + "," + nested + "]")
    assert result.code == 2, result.stderr
    one_error_line(result, "job[1].headers.X-Tag: given twice")
    no_store(cli)


def test_a_key_stored_before_the_rule_is_read_and_shown_escaped(cli: Any) -> None:
    assert cli.submit(job('=HYPERLINK("http://evil.example","x")')).code == 0
    settings = load_settings(cli.config)
    sender = Sender("support@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    with open_ledger(settings) as ledger:
        content = JobContent(
            channel="receipts", key=OLD_KEY, to=("b@example.com",), subject="s", body="b"
        )
        ledger.submit(content, sender)
    for argv in (["status", OLD_KEY], ["history", OLD_KEY], ["audit"]):
        result = cli.run(*argv)
        assert result.code == 0, (argv, result.stderr)
        assert SHOWN in result.stdout, result.stdout
        for char in "\x1b\u202e\x07":
            assert char not in result.stdout
    as_json = cli.run("status", "--json", OLD_KEY)
    assert as_json.code == 0
    assert as_json.json()["key"] == OLD_KEY
    assert all(char not in as_json.stdout for char in "\x1b\u202e\x07")
    unknown = cli.run("status", "nope\x1b[2J\u202e")
    assert unknown.code == 4
    assert "\x1b" not in unknown.stderr and "\u202e" not in unknown.stderr
    # CSV: a formula key is neutralized, the old key is escaped, the rest is exact.
    table = cli.run("audit", "--format", "csv")
    assert table.code == 0, table.stderr
    keys = sorted(row["key"] for row in csv.DictReader(io.StringIO(table.stdout)))
    assert keys == ['\'=HYPERLINK("http://evil.example","x")', SHOWN]
    # In review, the old key is listed, shown and resolved like any other.
    review = Review(PolicyRef("receipts", "f" * 16), EscalationReason.UNKNOWN_OUTCOME)
    with open_ledger(settings) as ledger:
        ledger.update(OLD_KEY, lambda j: j.escalate(review, detail="t", at=datetime.now(UTC)))
    for argv in (
        ["review", "list"],
        ["review", "show", OLD_KEY],
        ["review", "resolve", OLD_KEY, "--as", "abandon", "--note", "looked\x1b twice"],
    ):
        result = cli.run(*argv)
        assert result.code == 0, (argv, result.stderr)
        assert SHOWN in result.stdout, result.stdout
        assert all(char not in result.stdout for char in "\x1b\u202e\x07")
    assert cli.run("status", "--json", OLD_KEY).json()["state"] == "abandoned"


BAD_SETTINGS = [
    ("daemon", "tick = 1e300", "daemon.tick"),
    ("daemon", "tick = 0", "daemon.tick"),
    ("daemon", "deadline_grace = 1e300", "daemon.deadline_grace"),
    ("providers.support", "timeout = 1e300", "providers.support.timeout"),
    ("retention", 'purge_after = "99999999999999d"', "retention.purge_after"),
    ("retention", "every = 1e300", "retention.every"),
    ("providers.support", 'api_endpoint = "file:///etc/passwd"', "providers.support.api_endpoint"),
    ("providers.support", 'token_uri = "file:///etc/passwd"', "providers.support.token_uri"),
    ("providers.support", 'max_message_bytes = "99999GB"', "providers.support.max_message_bytes"),
    ("providers.support", "max_recipients = 1000000000", "providers.support.max_recipients"),
    ("api", 'listen = "::1:8025"', "api.listen"),
    ("api", 'listen = "localhost:99999"', "api.listen"),
    ("api", 'max_body = "1' + "0" * 400 + '"', "api.max_body"),
]


@pytest.mark.parametrize(("section", "line", "where"), BAD_SETTINGS)
def test_a_setting_out_of_bounds_is_refused_at_load_naming_it(
    cli: Any, section: str, line: str, where: str
) -> None:
    cli.config.write_text(with_setting(section, line), encoding="utf-8")
    for argv in (["submit", "-"], ["run", "--once"]):
        result = cli.run(*argv, stdin=json.dumps(job()))
        assert result.code == 2, (argv, result.stderr)
        one_error_line(result, f": {where}: ")
    no_store(cli)


def make_special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to(path.parent / "gone")
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "dangling", "directory"])
def test_secret_files_must_be_regular_files_and_a_fifo_never_hangs(cli: Any, kind: str) -> None:
    secret = cli.root / "secret"
    make_special(secret, kind)
    shown = {"fifo": "named pipe", "dangling": "symbolic link to nothing", "directory": "directory"}
    cases = [
        ("store", 'encryption_key_file = "secret"', ["submit", "-"], "store.encryption_key_file"),
        ("api", 'token_file = "secret"\nlisten = "127.0.0.1:1"', ["api"], "api.token_file"),
    ]
    for section, line, argv, where in cases:
        cli.config.write_text(with_setting(section, line), encoding="utf-8")
        result = cli.run(*argv, stdin=json.dumps(job()))  # the runner times out at 60 s
        assert result.code == 2, (argv, result.stderr)
        one_error_line(result, where, shown[kind])
        no_store(cli)
    # The provider secrets are read when the daemon builds its providers.
    cli.config.write_text(
        config_text().replace('credentials_file = "x.json"', 'credentials_file = "secret"'),
        encoding="utf-8",
    )
    result = cli.run("run", "--once")
    assert result.code == (1 if kind == "dangling" else 2), result.stderr  # may come later
    one_error_line(result, "providers.support.credentials_file", shown[kind])
    smtp = (
        config_text().split("[providers.support]")[0]
        + '[providers.support]\nkind = "smtp-imap"\nsmtp_host = "127.0.0.1"\n'
        'imap_host = "127.0.0.1"\nusername = "u@example.com"\npassword_file = "secret"\n'
    )
    cli.config.write_text(smtp, encoding="utf-8")
    result = cli.run("run", "--once")
    assert result.code == (1 if kind == "dangling" else 2), result.stderr  # may come later
    one_error_line(result, "providers.support.password_file", shown[kind])


@pytest.mark.parametrize("kind", ["fifo", "dangling", "directory"])
def test_a_policy_entry_that_is_not_a_regular_file_is_refused_naming_it(
    cli: Any, kind: str
) -> None:
    entry = cli.policies / "payouts.toml"
    make_special(entry, kind)
    check = cli.run("policy", "check")
    assert check.code == 2, check.stderr
    assert str(entry) in check.stderr and "cannot read" in check.stderr
    # That channel refuses new jobs; the others keep accepting (docs/review.md "Review").
    result = cli.submit(job(channel="payouts"))
    assert result.code == 2, result.stderr
    one_error_line(result, "payouts.toml", "cannot read")
    no_store(cli)
    assert cli.submit(job()).code == 0


def test_arguments_that_are_not_utf8_are_exit_2_naming_them(cli: Any) -> None:
    assert cli.submit(job("k")).code == 0
    for argv, name in (
        (["status", "\udcff"], "key"),
        (["history", "k\udcff"], "key"),
        (["review", "resolve", "k", "--as", "sent", "--note", "\udcfe"], "note"),
        (["review", "resolve", "k", "--as", "sent", "--by", "\udcfe"], "by"),
        (["admin", "purge", "--key", "k", "--key", "\udcff"], "key"),
        (["audit", "--channel", "\udcff"], "channel"),
    ):
        result = cli.run(*argv)  # the bytes 0xff / 0xfe, as a shell passes them
        assert result.code == 2, (argv, result.stderr)
        one_error_line(result, f"{name}: not UTF-8 text (byte 0x")
    assert cli.run("status", "--json", "k").json()["state"] == "requested"


def test_api_refuses_a_listen_address_that_does_not_parse(cli: Any) -> None:
    result = cli.run("api", "--listen", "::1:8025")
    assert result.code == 2, result.stderr
    one_error_line(result, "--listen", "HOST:PORT")
    no_store(cli)


def test_durations_on_the_command_line_have_bounds_too(cli: Any) -> None:
    assert cli.submit(job()).code == 0
    for argv, option in (
        (["admin", "purge", "--older-than", "999999d", "--dry-run"], "--older-than"),
        (["admin", "purge", "--older-than", "99999999999999d", "--dry-run"], "--older-than"),
        (["probe", "--provider", "support", "--to", "a@example.com", "--interval", "2d"],
         "--interval"),
        (["emulator", "gmail", "--port", "0", "--lag", "99999999d"], "--lag"),
    ):  # fmt: skip
        result = cli.run(*argv)
        assert result.code == 2, (argv, result.stderr)
        one_error_line(result, option, "expected")


@pytest.mark.parametrize("kind", ["fifo", "dangling", "directory"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_hanging(
    cli: Any, kind: str
) -> None:
    cli.config.unlink(missing_ok=True)
    make_special(cli.config, kind)
    result = cli.submit(job())
    assert result.code == 2, result.stderr
    one_error_line(result, str(cli.config), "cannot read")
    no_store(cli)


def test_a_config_folder_named_for_its_file_says_which_file(cli: Any) -> None:
    # `--config mail` for the folder `sendledger init mail` wrote.
    result = cli.run("status", "k1", config=False, env={"SENDLEDGER_CONFIG": str(cli.root)})
    assert (result.code, result.stdout) == (2, "")
    assert result.error_lines == [
        f"sendledger: {cli.root}: cannot read: a directory, not a regular file; give the "
        f"config file in it: --config {cli.config}"
    ]
    # A folder with no config in it: said as before, nothing more.
    bare = cli.run("status", "k1", config=False, env={"SENDLEDGER_CONFIG": str(cli.policies)})
    assert bare.error_lines == [
        f"sendledger: {cli.policies}: cannot read: a directory, not a regular file"
    ]
