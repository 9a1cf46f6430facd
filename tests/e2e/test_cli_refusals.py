"""Issue 8, intake and the command line, as a user types it: each refusal is one line
naming what to fix, with the documented exit code, and nothing half-written."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.test_cli_intake import job, one_error_line

from ledger.event_format import EVENT_FORMAT
from testkit.credentials import write_service_account


def test_a_batch_with_a_conflict_part_way_writes_nothing(cli: Any) -> None:
    assert cli.submit(job("stored")).code == 0
    batch = [job("new-1"), job("stored", body="other"), job("new-2")]
    result = cli.run("submit", "--json", "-", stdin=json.dumps(batch))
    assert result.code == 3
    one_error_line(result, "stored", "other content")
    assert cli.run("status", "new-1").code == 4
    assert cli.run("status", "new-2").code == 4


def test_the_same_key_twice_in_a_batch_with_other_content_is_a_conflict(cli: Any) -> None:
    batch = [job("twice"), job("twice", subject="changed")]
    result = cli.run("submit", "--json", "-", stdin=json.dumps(batch))
    assert result.code == 3
    one_error_line(result, "twice")
    assert not (cli.root / "ledger.sqlite").exists() or cli.run("status", "twice").code == 4
    same = cli.run("submit", "--json", "-", stdin=json.dumps([job("twice"), job("twice")]))
    assert same.code == 0, same.stderr
    assert [r["created"] for r in same.json()] == [True, False]


def test_output_shape_follows_input_shape(cli: Any) -> None:
    listed = cli.run("submit", "--json", "-", stdin=json.dumps([job("one")]))
    assert listed.code == 0, listed.stderr
    assert isinstance(listed.json(), list) and len(listed.json()) == 1
    single = cli.submit(job("two"))
    assert isinstance(single.json(), dict)


def test_limits_of_the_provider_are_checked_at_intake(cli: Any) -> None:
    env = {
        "SENDLEDGER_PROVIDERS__SUPPORT__MAX_MESSAGE_BYTES": "2000",
        "SENDLEDGER_PROVIDERS__SUPPORT__MAX_RECIPIENTS": "3",
    }
    big = cli.submit(job("big", body="x" * 3000), env=env)
    assert big.code == 2
    one_error_line(big, "job.body", "providers.support.max_message_bytes")
    # Attachments count once base64-encoded: 1800 bytes are about 2400 on the wire.
    pdf = {"filename": "a.pdf", "content_type": "application/pdf", "content_base64": "A" * 2400}
    attached = cli.submit(job("attached", attachments=[pdf]), env=env)
    assert attached.code == 2
    one_error_line(attached, "job.attachments", "providers.support.max_message_bytes")
    many = [f"r{i}@example.com" for i in range(4)]
    crowd = cli.submit(job("crowd", to=many), env=env)
    assert crowd.code == 2
    one_error_line(crowd, "job.to", "providers.support.max_recipients")
    # The defaults are Gmail's: 500 recipients per message.
    crowd = cli.submit(job("crowd", to=[f"r{i}@example.com" for i in range(501)]))
    assert crowd.code == 2
    one_error_line(crowd, "max_recipients (500)")


def test_what_cannot_be_built_is_refused_at_policy_check_and_intake(cli: Any) -> None:
    (cli.policies / "receipts.toml").write_text(
        'provider = "support"\nfrom = "Sup\\u000bport <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\n',
        encoding="utf-8",
    )
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    check = cli.run("policy", "check")
    assert check.code == 2
    one_error_line(check, "receipts.toml:from:", "control character")
    assert cli.submit(job()).code == 2


def test_config_and_environment_errors_are_exit_2_naming_the_source(cli: Any) -> None:
    cli.config.write_bytes(b"\xff\xfe[store]\n")
    bad = cli.run("status", "x")
    assert bad.code == 2
    one_error_line(bad, str(cli.config), "UTF-8")
    cli.write_config()
    for name, value, needle in [
        ("SENDLEDGER_STOR__URL", "sqlite:///x.sqlite", "SENDLEDGER_STOR__URL"),
        ("SENDLEDGER_STORE_URL", "sqlite:///x.sqlite", "SENDLEDGER_STORE_URL"),
        ("SENDLEDGER_PROVIDERS", "{not json", "SENDLEDGER_PROVIDERS"),
        ("SENDLEDGER_DAEMON__TICK", "soon", "SENDLEDGER_DAEMON__TICK"),
    ]:
        result = cli.run("status", "x", env={name: value})
        assert result.code == 2, (name, result.stderr)
        line = one_error_line(result, needle)
        assert str(cli.config) not in line


def test_a_policies_folder_without_a_policy_file_is_refused_before_a_job_is_touched(
    cli: Any,
) -> None:
    # A folder with no *.toml was an empty set: `policy check` said "no policies in DIR",
    # exit 0, and the daemon started and sent every job to review (no-policy).
    assert cli.submit(job("waiting")).code == 0
    (cli.policies / "receipts.toml").rename(cli.policies / "receipts.tml")
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    for command in (["policy", "check"], ["run", "--once"], ["run"]):
        result = cli.run(*command)
        assert result.code == 2, (command, result.stderr)
        one_error_line(result, f"{cli.policies}:-: no policy file (CHANNEL.toml)", "receipts.tml")
    status = cli.run("status", "--json", "waiting")
    assert status.json()["state"] == "requested", status.stdout


def test_version_says_the_release_and_the_event_format_it_reads(cli: Any) -> None:
    # `--version` was "unrecognized arguments", while a store refused for its format says
    # "upgrade sendledger on this host": which release is here was pip's to say.
    result = cli.run("--version", config=False)
    assert result.code == 0, result.stderr
    release = importlib.metadata.version("sendledger")
    assert result.stdout == (
        f"sendledger {release} (reads and writes event format {EVENT_FORMAT})\n"
    )
    assert result.stderr == ""
    # The Upgrading page quotes the format: it follows a raised EVENT_FORMAT, not a "1"
    # typed once.
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text("utf-8")
    assert f"`(reads and writes event format {EVENT_FORMAT})` for this one" in page


BOM = "\ufeff"


def test_a_file_saved_with_a_byte_order_mark_is_told_so(cli: Any) -> None:
    # A Windows editor's mark before the first line: the config was "not valid TOML:
    # Invalid statement (at line 1, column 1)", a line that looks right; a policy the same
    # as a TOML syntax error; a job Python's "Unexpected UTF-8 BOM (decode using
    # utf-8-sig)". Secret files already said it in these words.
    said = "starts with a byte order mark: save it as UTF-8 without one"
    job_file = cli.root / "job.json"
    job_file.write_text(BOM + json.dumps(job("bom")), encoding="utf-8")
    submitted = cli.run("submit", str(job_file))
    assert submitted.code == 2
    one_error_line(submitted, f"job: {job_file}: {said}")
    policy = cli.policies / "receipts.toml"
    policy.write_text(BOM + policy.read_text(encoding="utf-8"), encoding="utf-8")
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    checked = cli.run("policy", "check")
    assert checked.code == 2
    one_error_line(checked, f"{policy}:-: {said}")
    cli.config.write_text(BOM + cli.config.read_text(encoding="utf-8"), encoding="utf-8")
    for command in (["status", "bom"], ["policy", "check"]):
        result = cli.run(*command)
        assert result.code == 2, result.stderr
        one_error_line(result, f"{cli.config}: {said}")


def test_config_is_accepted_after_the_command(cli: Any) -> None:
    assert cli.submit(job("after")).code == 0
    result = cli.run("status", "--json", "after", "--config", str(cli.config), config=False)
    assert result.code == 0, result.stderr
    assert result.json()["key"] == "after"


def test_read_only_commands_create_no_store(cli: Any) -> None:
    for argv in (
        ["status", "x"],
        ["history", "x"],
        ["review", "list"],
        ["review", "show", "x"],
        ["audit"],
        ["admin", "rebuild-index"],
    ):
        result = cli.run(*argv)
        assert result.code == 2, (argv, result.stderr)
        one_error_line(result, "no store at", str(cli.root / "ledger.sqlite"))
    assert not (cli.root / "ledger.sqlite").exists()


def test_out_of_range_times_and_bad_demo_options_are_exit_2(cli: Any) -> None:
    assert cli.submit(job()).code == 0
    for value in ("100000000d", "0001-01-01T00:00+14:00"):
        result = cli.run("audit", "--since", value)
        assert result.code == 2, result.stderr
        one_error_line(result, "--since")
    for lag in ("soon", "99999d"):
        result = cli.run("demo", "--lag", lag, config=False)
        assert result.code == 2, result.stderr
        one_error_line(result, "--lag")


@pytest.mark.postgres
def test_read_only_commands_create_no_tables_in_postgresql(cli: Any, pg_url: str) -> None:
    import psycopg

    cli.write_config(pg_url)
    for argv in (["status", "x"], ["review", "list"], ["audit"]):
        result = cli.run(*argv)
        assert result.code == 2, (argv, result.stderr)
        one_error_line(result, "no store at postgresql://")
    schema = pg_url.rsplit("schema=", 1)[1]
    with psycopg.connect(pg_url.split("?")[0]) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchone()
    assert tables == (0,)
    assert cli.submit(job()).code == 0  # a writing command creates the store
    assert cli.run("status", "order-1001").code == 0
