"""A command imports only its own module (docs/architecture.md, "Layers"): `submit` and
`status` run without the test kit, APScheduler or the HTTP stack, which `demo`, `probe`,
`emulator`, `run` and `api` need. And a command imports only what it uses (docs/cli.md
"Many keys, one process"): no provider library, no PostgreSQL driver for a SQLite store;
the commands that read only `[store]` load neither pydantic nor the store cipher."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.e2e.conftest import CliEnv

#: What none of the job commands (submit, status, history, review list, cancel, audit)
#: loads: the test kit, the scheduler, the web stack, the providers' libraries, PostgreSQL.
HEAVY = (
    "testkit",
    "apscheduler",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "googleapiclient",
    "google",
    "httplib2",
    "msal",
    "imapclient",
    "psycopg",
    "psycopg_pool",
)
#: What a command that reads only `[store]` of a plain SQLite store does without as well:
#: the settings model, the policies (both pydantic), the cipher, the message writer's email
#: package and idna.
SETTINGS_AND_MORE = ("pydantic", "pydantic_settings", "cryptography", "email", "idna")
#: submit reads the whole settings and the policies, and renders each message with the
#: daemon's renderer, whose envelope check is the SMTP provider's parser (its module
#: imports imapclient): nothing else of the lists.
SUBMIT_LOADS = {*SETTINGS_AND_MORE, "imapclient"}

# Runs the command in-process through the console script's `main`, then names every heavy
# package that got imported: the script's exit code is the command's, stdout the command's
# output followed by one JSON line of the imported heavy packages.
PROBE = textwrap.dedent(
    """
    import json, sys
    from daemon.cli import main
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help
        code = exc.code
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    print(json.dumps({"heavy": heavy}))
    sys.exit(code)
    """
).replace("HEAVY", repr(HEAVY + SETTINGS_AND_MORE))

JOB = {
    "channel": "receipts",
    "key": "order-1001",
    "to": "Alice <alice@example.com>",
    "subject": "Your receipt",
    "body": "Thanks for your order.",
}


def run_probe(cli: CliEnv, *args: str, stdin: str = "") -> tuple[int, str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "--config", str(cli.config), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cli.root,
        env=cli.env,
        timeout=60,
    )
    *output, last = proc.stdout.splitlines()
    return proc.returncode, "\n".join(output), json.loads(last)["heavy"]


def test_submit_and_status_import_neither_the_testkit_nor_the_scheduler(cli: CliEnv) -> None:
    code, out, heavy = run_probe(cli, "submit", "--json", "-", stdin=json.dumps(JOB))
    assert code == 0, out
    assert json.loads(out)["key"] == "order-1001"
    assert set(heavy) <= SUBMIT_LOADS, heavy

    code, out, heavy = run_probe(cli, "status", "--json", "order-1001")
    assert code == 0, out
    assert json.loads(out)["key"] == "order-1001"
    assert heavy == []


def test_each_job_command_imports_only_what_it_uses(cli: CliEnv) -> None:
    code, out, loaded = run_probe(cli, "submit", "--json", "-", stdin=json.dumps(JOB))
    assert code == 0, out
    assert set(loaded) <= SUBMIT_LOADS, loaded
    assert "pydantic_settings" in loaded  # the probe sees what a command does import
    for argv in (
        ["status", "order-1001"],
        ["status", "order-1001", "order-1001", "--json"],
        ["history", "order-1001"],
        ["review", "list"],
        ["review", "show", "order-1001"],
        ["audit"],
    ):
        code, out, loaded = run_probe(cli, *argv)
        assert code == 0, (argv, out)
        assert loaded == [], (argv, loaded)


def test_cancel_reads_the_settings_and_nothing_heavy(cli: CliEnv) -> None:
    """A cancel settles the job, so it schedules the deletion of its drafts as its
    provider says: it reads the settings and the policies, and nothing of `HEAVY`."""
    code, out, _ = run_probe(cli, "submit", "--json", "-", stdin=json.dumps(JOB))
    assert code == 0, out
    code, out, loaded = run_probe(cli, "cancel", "order-1001")
    assert code == 0, out
    assert set(loaded) <= SUBMIT_LOADS, loaded


def test_the_probe_sees_a_command_that_imports_the_testkit(cli: CliEnv) -> None:
    # The check above can fail: `emulator --help` loads the test kit's command module.
    code, _, heavy = run_probe(cli, "emulator", "--help")
    assert code == 0
    assert "testkit" in heavy
