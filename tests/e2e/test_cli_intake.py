"""`sendledger submit|status|history|policy check|admin rebuild-index` as processes.

Exit codes: 0 ok; 2 bad input (job, config, policy); 3 conflict; 4 unknown job. Every
error is exactly one line on stderr.
"""

from __future__ import annotations

import getpass
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ledger.message_id import message_id_for
from testkit.credentials import write_service_account

MESSAGE_ID = message_id_for("order-1001", "mail.example.com")


def job(key: str = "order-1001", **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "channel": "receipts",
        "key": key,
        "to": "Alice <alice@example.com>",
        "subject": "Your receipt",
        "body": "Thanks for your order.",
    }
    data.update(overrides)
    return data


def one_error_line(result: Any, *needles: str) -> str:
    """The run failed with exactly one stderr line, containing every needle."""
    lines = result.error_lines
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])


# -- submit ----------------------------------------------------------------------------


def test_submit_is_idempotent_and_refuses_other_content(cli: Any) -> None:
    first = cli.submit(job())
    assert first.code == 0, first.stderr
    assert first.stderr == ""
    assert first.json() == {
        "key": "order-1001",
        "message_id": MESSAGE_ID,
        "state": "requested",
        "created": True,
    }
    # The relative store URL lives beside the config file.
    assert (cli.root / "ledger.sqlite").is_file()

    again = cli.submit(job())
    assert again.code == 0, again.stderr
    assert again.json() == {**first.json(), "created": False}

    other = cli.submit(job(body="Another body"))
    assert other.code == 3
    assert other.stdout == ""
    one_error_line(other, "order-1001", "other content")

    status = cli.run("status", "--json", "order-1001")
    assert status.code == 0, status.stderr
    data = status.json()
    assert data["state"] == "requested"
    assert data["version"] == 1
    assert data["submitted_by"] == getpass.getuser()  # who ran `submit`
    history = cli.run("history", "--json", "order-1001")
    assert [e["type"] for e in history.json()] == ["Requested"]
    assert history.json()[0]["body"] == "Thanks for your order."


def test_submit_from_a_file_and_plain_output(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job("from-file")), encoding="utf-8")
    result = cli.run("submit", str(path))
    assert result.code == 0, result.stderr
    assert result.stdout.split()[:2] == ["created", "from-file"]
    assert message_id_for("from-file", "mail.example.com") in result.stdout


@pytest.mark.parametrize(
    ("payload", "needles"),
    [
        pytest.param(job(channel="newsletters"), ["channel", "newsletters"], id="unknown-channel"),
        pytest.param(job(subject="Hi\r\nBcc: eve@example.com"), ["subject", "CR"], id="crlf"),
        pytest.param(job(subject="Hi\nthere"), ["subject"], id="lf"),
        pytest.param(job(to="not an address"), ["to"], id="bad-address"),
        pytest.param(job(to=["ok@example.com", "bad@"]), ["to[1]"], id="bad-address-in-list"),
        pytest.param({"channel": "receipts", "key": "k"}, ["to", "required"], id="missing"),
        pytest.param(job(color="red"), ["color", "unknown field"], id="unknown-field"),
        pytest.param(
            job(headers={"Message-ID": "<x@example.com>"}),
            ["headers.Message-ID", "written by sendledger"],
            id="owned-header",
        ),
        pytest.param(
            job(
                attachments=[
                    {
                        "filename": "a.pdf",
                        "content_type": "application/pdf",
                        "content_base64": "not base64!",
                    }
                ]
            ),
            ["attachments[0].content_base64", "decode"],
            id="bad-base64",
        ),
        pytest.param(job(send_at="tomorrow 9am"), ["send_at", "ISO 8601"], id="send-at"),
    ],
)
def test_submit_refuses_bad_jobs(cli: Any, payload: dict[str, Any], needles: list[str]) -> None:
    result = cli.submit(payload)
    assert result.code == 2
    assert result.stdout == ""
    one_error_line(result, *needles)


def test_submit_refuses_invalid_json(cli: Any) -> None:
    result = cli.run("submit", "--json", "-", stdin='{"channel": "receipts", "key": ')
    assert result.code == 2
    one_error_line(result, "not valid JSON", "at line 1, column 32")
    # `submit` with no FILE and nothing piped in: said so, with what to give.
    for argv, where in ((["submit"], "stdin"), (["submit", "-"], "stdin")):
        empty = cli.run(*argv, stdin="  \n")
        assert (empty.code, empty.stdout) == (2, "")
        assert empty.error_lines == [
            f"sendledger: job: {where} is empty: give a job JSON file, or pipe the JSON in"
        ]
    (cli.root / "blank.json").write_text("", encoding="utf-8")
    blank = cli.run("submit", str(cli.root / "blank.json"))
    one_error_line(blank, f"job: {cli.root / 'blank.json'} is empty")


def test_a_bad_job_in_a_batch_writes_nothing(cli: Any) -> None:
    batch = [job("batch-1"), job("batch-2", to="nope")]
    result = cli.run("submit", "--json", "-", stdin=json.dumps(batch))
    assert result.code == 2
    one_error_line(result, "job[1].to")
    # Nothing written, not even an empty store.
    assert cli.run("status", "batch-1").code == 2
    assert not (cli.root / "ledger.sqlite").exists()


def test_batch_errors_name_the_job_as_http_does(cli: Any) -> None:
    # `job[1].channel: ...` (docs/http-api.md "HTTP API", "Errors and statuses"), and how many more.
    batch = [job("b-1"), job("b-2", channel="nope"), job("b-3", channel="nope2")]
    result = cli.run("submit", "-", stdin=json.dumps(batch))
    assert result.code == 2
    line = one_error_line(result, "job[1].channel: no policy file for channel 'nope'")
    assert line.endswith("(and 1 more)")


# -- status / history ------------------------------------------------------------------


def test_status_and_history(cli: Any) -> None:
    assert cli.submit(job()).code == 0
    status = cli.run("status", "--json", "order-1001")
    assert status.code == 0, status.stderr
    data = status.json()
    assert {k: data[k] for k in ("key", "channel", "state", "message_id", "attempts")} == {
        "key": "order-1001",
        "channel": "receipts",
        "state": "requested",
        "message_id": MESSAGE_ID,
        "attempts": 0,
    }
    assert "reason" not in data

    history = cli.run("history", "--json", "order-1001")
    assert history.code == 0, history.stderr
    events = history.json()
    assert isinstance(events, list)
    assert [(e["type"], e["version"]) for e in events] == [("Requested", 1)]
    assert events[0]["at"].endswith("Z")
    assert events[0]["message_id"] == MESSAGE_ID
    assert events[0]["policy"] == "receipts"

    plain = cli.run("status", "order-1001")
    assert plain.code == 0
    assert "requested" in plain.stdout


def test_history_shows_the_names_in_a_list_as_typed(cli: Any) -> None:
    # A list (to, cc) was written as ASCII-only JSON, then made printable: 李雷 was shown
    # as \\u674e\\u96f7 on the terminal and the review page, where the subject beside it
    # read as typed.
    to = ["李雷 <lilei@example.com>", "Zoë <zoe@example.com>"]
    assert cli.submit(job(to=to, cc=["Ærø <aero@example.com>"])).code == 0
    result = cli.run("history", "order-1001")
    assert result.code == 0, result.stderr
    assert 'to=["李雷 <lilei@example.com>", "Zoë <zoe@example.com>"]' in result.stdout
    assert 'cc=["Ærø <aero@example.com>"]' in result.stdout
    assert "\\u" not in result.stdout


def test_unknown_job_is_exit_4(cli: Any) -> None:
    assert cli.submit(job()).code == 0
    for command in ("status", "history"):
        result = cli.run(command, "--json", "no-such-key")
        assert result.code == 4, (command, result.stderr)
        assert result.stdout == ""
        one_error_line(result, "no-such-key")


def test_status_answers_many_keys_in_one_process(cli: Any) -> None:
    keys = [f"many-{n}" for n in range(60)]  # more than a page of 50 jobs
    assert cli.run("submit", "--json", "-", stdin=json.dumps([job(k) for k in keys])).code == 0
    asked = [keys[59], "nope-1", *keys[:59], keys[0], "nope-2"]
    result = cli.run("status", "--json", *asked)
    assert result.code == 4, result.stderr
    answered = result.json()
    assert [s["key"] for s in answered] == [k for k in asked if not k.startswith("nope")]
    assert answered[0] == cli.run("status", "--json", keys[59]).json()  # what one key gives
    one_error_line(result, "no job with keys 'nope-1', 'nope-2'")

    text = cli.run("status", keys[0], keys[1])
    assert text.code == 0 and text.stderr == ""
    first, second = text.stdout.rstrip("\n").split("\n\n")
    assert first == cli.run("status", keys[0]).stdout.rstrip("\n")
    assert second.startswith("key ") and keys[1] in second.splitlines()[0]


# -- configuration ---------------------------------------------------------------------


def test_config_from_environment_and_from_the_working_directory(cli: Any, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # $SENDLEDGER_CONFIG, run from another folder: the store is beside the config.
    via_env = cli.submit(
        job("via-env"), config=False, cwd=elsewhere, env={"SENDLEDGER_CONFIG": str(cli.config)}
    )
    assert via_env.code == 0, via_env.stderr
    assert not (elsewhere / "ledger.sqlite").exists()
    # ./sendledger.toml in the working directory.
    via_cwd = cli.run("status", "--json", "via-env", config=False, cwd=cli.root)
    assert via_cwd.code == 0, via_cwd.stderr
    assert via_cwd.json()["key"] == "via-env"
    # --config beats $SENDLEDGER_CONFIG.
    bogus = tmp_path / "missing.toml"
    via_flag = cli.run("status", "via-env", env={"SENDLEDGER_CONFIG": str(bogus)})
    assert via_flag.code == 0, via_flag.stderr


def test_no_config_anywhere_is_exit_2(cli: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli.run("status", "x", config=False, cwd=empty)
    assert result.code == 2
    one_error_line(result, "config file not found", str(empty / "sendledger.toml"))


def test_missing_config_file_is_exit_2_naming_the_path(cli: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "sendledger.toml"
    result = cli.run("--config", str(missing), "status", "x", config=False)
    assert result.code == 2
    one_error_line(result, str(missing))


def test_unknown_config_key_is_exit_2_naming_it(cli: Any) -> None:
    cli.config.write_text(
        cli.config.read_text(encoding="utf-8").replace(
            "[daemon]\n", '[daemon]\nflavour = "vanilla"\n'
        ),
        encoding="utf-8",
    )
    result = cli.submit(job())
    assert result.code == 2
    one_error_line(result, "flavour", "unknown key", str(cli.config))


def test_environment_override_redirects_the_store(cli: Any, tmp_path: Path) -> None:
    other = tmp_path / "other" / "ledger.sqlite"
    env = {"SENDLEDGER_STORE__URL": f"sqlite:///{other}"}
    result = cli.submit(job("redirected"), env=env)
    assert result.code == 0, result.stderr
    assert other.is_file()
    assert cli.run("status", "redirected", env=env).code == 0
    # The file's own store was never even created.
    assert cli.run("status", "redirected").code == 2
    assert not (cli.root / "ledger.sqlite").exists()


def test_bad_environment_override_is_exit_2(cli: Any) -> None:
    result = cli.run("status", "x", env={"SENDLEDGER_DAEMON__TICK": "soon"})
    assert result.code == 2
    one_error_line(result, "daemon.tick")


@pytest.mark.parametrize("url", ["memory://", "memory://shared", "sqlite:///:memory:"])
def test_a_store_that_ends_with_the_process_is_refused(cli: Any, url: str) -> None:
    # A command's jobs would be gone when it exits: exit 2 naming store.url, nothing written.
    cli.write_config(url)
    result = cli.submit(job())
    assert result.code == 2
    one_error_line(result, "store.url", str(cli.config))
    assert result.stdout == ""


# -- policy check / admin --------------------------------------------------------------


def test_policy_check(cli: Any) -> None:
    # The config's secret files are judged too (tests/e2e/test_policy_check_secrets.py).
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    good = cli.run("policy", "check")
    assert good.code == 0, good.stderr
    assert "receipts" in good.stdout
    explicit = cli.run("policy", "check", "--json", str(cli.policies))
    assert explicit.code == 0, explicit.stderr
    assert [row["channel"] for row in explicit.json()] == ["receipts"]

    broken = cli.policies / "alerts.toml"
    broken.write_text(
        'provider = "support"\nfrom = "Support <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\nmax_attempts = 0\n',
        encoding="utf-8",
    )
    result = cli.run("policy", "check")
    assert result.code == 2
    line = one_error_line(result)
    assert line.startswith(f"{broken}:max_attempts: "), line

    # The broken file's channel refuses new jobs, naming the file and field; the other
    # channels keep accepting (the same rule as POST /v1/jobs).
    refused = cli.submit(job("order-alerts", channel="alerts"))
    assert refused.code == 2
    one_error_line(refused, "job.channel", f"{broken}:max_attempts:")
    assert cli.submit(job()).code == 0


def test_admin_rebuild_index(cli: Any) -> None:
    assert cli.run("submit", "-", stdin=json.dumps([job("a"), job("b")])).code == 0
    result = cli.run("admin", "rebuild-index", "--json")
    assert result.code == 0, result.stderr
    assert result.json() == {"jobs": 2}
    plain = cli.run("admin", "rebuild-index")
    assert plain.code == 0
    assert "2 jobs" in plain.stdout
    assert cli.run("status", "b").code == 0


def test_usage_error_is_exit_2(cli: Any) -> None:
    result = cli.run("submit", "--no-such-flag")
    assert result.code == 2
    one_error_line(result, "--no-such-flag")


# -- PostgreSQL ------------------------------------------------------------------------


@pytest.mark.postgres
def test_submit_and_status_on_postgres(cli: Any, pg_url: str) -> None:
    cli.write_config(pg_url)
    first = cli.submit(job())
    assert first.code == 0, first.stderr
    assert first.json()["created"] is True
    again = cli.submit(job())
    assert (again.code, again.json()["created"]) == (0, False)
    conflict = cli.submit(job(subject="Changed"))
    assert conflict.code == 3
    one_error_line(conflict, "order-1001")
    status = cli.run("status", "--json", "order-1001")
    assert status.code == 0, status.stderr
    assert status.json()["state"] == "requested"
    assert status.json()["message_id"] == MESSAGE_ID
    assert [e["type"] for e in cli.run("history", "--json", "order-1001").json()] == ["Requested"]
    assert cli.run("admin", "rebuild-index", "--json").json() == {"jobs": 1}
    assert cli.run("status", "unknown").code == 4


def test_a_job_on_stdin_is_read_as_utf8_whatever_the_locale_says(cli: Any, tmp_path: Path) -> None:
    # The same UTF-8 file through `submit -` under a Latin-1 locale and through
    # `submit FILE`: one job, its subject as typed (not "CafÃ©", and no false conflict).
    text = json.dumps(job("order-utf8", subject="Café ✓"), ensure_ascii=False)
    path = tmp_path / "job.json"
    path.write_text(text, encoding="utf-8")
    latin = {"PYTHONIOENCODING": "latin-1", "PYTHONUTF8": "0"}
    first = cli.run("submit", "--json", "-", stdin=text, env=latin, fresh=True)
    assert first.code == 0, first.stderr
    again = cli.run("submit", "--json", str(path))
    assert again.code == 0, again.stderr
    assert again.json()["created"] is False
    assert cli.run("history", "--json", "order-utf8").json()[0]["subject"] == "Café ✓"


def test_a_job_on_stdin_that_is_not_utf8_is_exit_2_naming_stdin(cli: Any) -> None:
    result = cli.run("submit", "-", stdin='{"key": "caf\udce9"}')  # the byte 0xe9 alone
    assert result.code == 2
    one_error_line(result, "stdin: not UTF-8")


def test_policy_check_judges_the_store_url_as_the_store_s_commands_do(cli: Any) -> None:
    # `policy check` judges the whole file (docs/configuration.md): a store.url every command
    # refuses passed it, and the daemon it was run before then failed at its start.
    cli.write_config("sqlite://ledger.sqlite")
    checked = cli.run("policy", "check")
    assert checked.code == 2, checked.stderr
    one_error_line(checked, "store.url: 'sqlite://ledger.sqlite': use sqlite:///relative/path")
    assert checked.stdout == ""


def test_the_shipped_example_config_and_policies_check_without_a_word(
    cli: Any, tmp_path: Path
) -> None:
    # examples/policies/payouts.toml sent as payouts@ through a provider acting as support@:
    # the mismatch policy check now warns of (docs/policies.md).
    repo = Path(__file__).resolve().parents[2]
    site = tmp_path / "example"
    shutil.copytree(repo / "examples" / "policies", site / "policies")
    shutil.copy(repo / "config.example.toml", site / "sendledger.toml")
    # Its secret files put in place, as the check judges them as `run` does.
    write_service_account(site / "gmail-service-account.json", token_uri="http://127.0.0.1:1/t")
    for secret in ("mail-password", "graph-client-secret"):
        (site / secret).write_text("secret\n", encoding="utf-8")
        (site / secret).chmod(0o600)
    checked = cli.run("--config", str(site / "sendledger.toml"), "policy", "check", config=False)
    assert checked.code == 0 and checked.stderr == "", checked.stderr
