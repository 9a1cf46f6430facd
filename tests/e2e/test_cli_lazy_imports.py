"""A command imports only its own module (docs/architecture.md, "Layers"): `submit` and
`status` run without the test kit, APScheduler or the HTTP stack, which `demo`, `probe`,
`emulator`, `run` and `api` need. And a command imports only what it uses (docs/cli.md
"Many keys, one process"): no provider library, no PostgreSQL driver for a SQLite store;
the commands that read only `[store]` load neither pydantic nor the store cipher, and
`submit` and `cancel`, which judge the whole settings model and read the policies (both
pydantic), load neither pydantic-settings (only an override in the environment needs it)
nor the engine."""

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
#: submit judges the settings model and reads the policies (pydantic) and renders each
#: message (the email package's header parser checks the envelope): nothing else of the
#: lists, neither pydantic-settings nor the composition root and the engine (`OURS`).
SUBMIT_LOADS = {"pydantic", "email", "idna"}
#: Modules of ours a command that takes or settles jobs does without.
OURS = ("daemon.bootstrap", "daemon.engine", "daemon.providers.gmail")

# Runs the command in-process through the console script's `main`, then names every heavy
# package that got imported: the script's exit code is the command's, stdout the command's
# output followed by one JSON line of the imported heavy packages.
PROBE = (
    textwrap.dedent(
        """
    import json, sys
    from daemon.cli import main
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help
        code = exc.code
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    heavy += sorted(set(sys.modules) & set(OURS))
    print(json.dumps({"heavy": heavy}))
    sys.exit(code)
    """
    )
    .replace("HEAVY", repr(HEAVY + SETTINGS_AND_MORE))
    .replace("OURS", repr(OURS))
)

JOB = {
    "channel": "receipts",
    "key": "order-1001",
    "to": "Alice <alice@example.com>",
    "subject": "Your receipt",
    "body": "Thanks for your order.",
}


def run_probe(
    cli: CliEnv, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> tuple[int, str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "--config", str(cli.config), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cli.root,
        env=cli.env if env is None else env,
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
    assert "pydantic" in loaded  # the probe sees what a command does import
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
    provider says: it reads the settings and the policies, as submit does, and nothing
    of `HEAVY`, pydantic-settings or the engine."""
    code, out, _ = run_probe(cli, "submit", "--json", "-", stdin=json.dumps(JOB))
    assert code == 0, out
    code, out, loaded = run_probe(cli, "cancel", "order-1001")
    assert code == 0, out
    assert set(loaded) <= SUBMIT_LOADS, loaded


def test_an_override_in_the_environment_loads_pydantic_settings(cli: CliEnv) -> None:
    """pydantic-settings reads the `SENDLEDGER_*` overrides: a command loads it only when
    one is set (and the probe sees it then), and a bad value in any section is still
    refused by submit, naming it, as `run` refuses it."""
    env = {**cli.env, "SENDLEDGER_DAEMON__TICK": "2s"}
    code, out, loaded = run_probe(cli, "submit", "--json", "-", stdin=json.dumps(JOB), env=env)
    assert code == 0, out
    assert "pydantic_settings" in loaded
    config = cli.config.read_text(encoding="utf-8")
    cli.config.write_text(config.replace("[daemon]\n", "[daemon]\ntick = 0\n"), encoding="utf-8")
    refused = cli.run("submit", "-", stdin=json.dumps({**JOB, "key": "order-1002"}))
    assert refused.code == 2
    [line] = refused.error_lines
    assert line.startswith(f"sendledger: {cli.config}: daemon.tick: "), line
