"""The CLI's table of commands (daemon/cli/__init__.py) against what each module registers:
a command missing from it, or named for the wrong module, would not parse lazily."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.unit.host_config import write_host_config

import daemon.cli.job_commands
from daemon.cli import COMMANDS, build_parser, command_named, main
from daemon.cli.init_command import Installation, planned_files, summary, write_all
from daemon.cli.service import positive_int
from daemon.config.settings import SmtpImapProviderSettings, load_settings
from daemon.exit_codes import EXIT_BAD_INPUT, CliError
from daemon.tools import probe, probe_drafts
from ledger.addresses import parse_mailbox
from policies.loader import load_policy_dir


def registered_by(module: str) -> set[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub)
    return set(sub.choices)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_table_names_each_command_with_the_module_that_registers_it() -> None:
    for module in set(COMMANDS.values()):
        assert registered_by(module) == {c for c, m in COMMANDS.items() if m == module}, module


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_lazy_parser_parses_a_command_as_the_whole_one_does(command: str) -> None:
    lazy = subcommands(build_parser(command))
    assert lazy[command].format_help() == subcommands(build_parser())[command].format_help()


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["submit", "-"], "submit"),
        (["--config", "f.toml", "status", "k"], "status"),
        (["--config=f.toml", "history", "k"], "history"),
        (["status", "--config", "f.toml", "k"], "status"),
        (["--help"], None),
        ([], None),
        (["--config", "submit"], None),
    ],
)
def test_the_command_is_read_as_argparse_reads_it(argv: list[str], command: str | None) -> None:
    assert command_named(argv) == command


# -- what docs/cli.md says of every command ------------------------------------------------


def test_an_interrupted_command_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(daemon.cli.job_commands, "cmd_status", interrupted)
    assert main(["status", "any-key"]) == 130


def test_a_ctrl_c_while_the_commands_modules_load_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import daemon.cli.admin_copy

    def loading(admin: object) -> None:
        raise KeyboardInterrupt  # as a SIGINT 0.1-0.3 s after the start arrives

    monkeypatch.setattr(daemon.cli.admin_copy, "register", loading)
    assert main(["admin", "backup", "b.sqlite"]) == 130  # before: the traceback, killed by SIGINT
    assert capsys.readouterr().err == ""


def test_a_ctrl_c_while_the_command_line_itself_loads_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script imported `daemon.cli` (some 40 ms) before `main` could catch
    anything: a SIGINT then printed the import's traceback and ended the process by it."""
    import importlib.abc
    import sys
    import tomllib

    from daemon import console
    from daemon.exit_codes import EXIT_INTERRUPTED

    class Interrupted(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, *_: object) -> None:
            if name == "daemon.cli":
                raise KeyboardInterrupt  # as a SIGINT in the first tens of milliseconds
            return None

    monkeypatch.delitem(sys.modules, "daemon.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupted(), *sys.meta_path])
    assert console.main() == console.INTERRUPTED == EXIT_INTERRUPTED
    assert capsys.readouterr().err == ""
    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["scripts"] == {"sendledger": "daemon.console:main"}


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


@pytest.mark.parametrize("provider", ["gmail", "smtp-imap", "graph"])
def test_init_writes_the_policies_and_mailbox_the_page_says(provider: str, tmp_path: Path) -> None:
    mailbox = parse_mailbox("shop@shop.example")
    here = Installation(tmp_path, ["sendledger"], "user", "group")
    write_all(tmp_path, planned_files(provider, mailbox, here))
    settings = load_settings(tmp_path / "sendledger.toml")
    (name, config), *others = settings.providers.items()
    assert others == [] and config.kind == provider
    user = config.username if isinstance(config, SmtpImapProviderSettings) else config.user
    assert user == "shop@shop.example"
    policies = load_policy_dir(tmp_path / "policies", known_providers=[name])
    assert {(p.channel, p.on_unknown, p.irreversible) for p in policies.values()} == {
        ("receipts", "retry", False),
        ("notices", "review", True),
    }
    assert {p.from_address for p in policies.values()} == {"shop@shop.example"}
    assert (tmp_path / "api-tokens").read_text(encoding="utf-8").startswith("admin:")
    job = json.loads((tmp_path / "first-job.json").read_text(encoding="utf-8"))
    assert (job["key"], job["channel"], job["to"]) == ("first-job-1", "receipts", user)
    said = summary(provider, mailbox, here, planned_files(provider, mailbox, here))
    steps = [line.split()[3:5] for line in said.splitlines() if line.startswith("  sendledger ")]
    assert steps == [
        ["run"],
        ["submit", str(tmp_path / "first-job.json")],
        ["status", "first-job-1"],
    ]


def test_keep_refuses_a_folder_that_holds_a_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ledger.sqlite").write_bytes(b"")
    assert main(["demo", "--keep", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "already holds a demo (ledger.sqlite)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.sqlite"]  # nothing ran


@pytest.mark.parametrize(
    ("lag", "recommended"), [(0.3, 60.0), (20.0, 60.0), (21.0, 120.0), (60.0, 180.0)]
)
def test_the_probe_recommends_three_times_the_lag_in_whole_minutes(
    lag: float, recommended: float
) -> None:
    assert probe_drafts.recommend_search_after(lag) == recommended


def refused_probe(tmp_path: Path, user: str, **given: Any) -> CliError:
    """How `sendledger probe` refuses to start on a gmail provider whose `user` is given,
    with no terminal to ask on: its CliError."""
    config = tmp_path / "sendledger.toml"
    (tmp_path / "policies").mkdir()
    config.write_text(
        '[daemon]\npolicies_dir = "policies"\n[providers.support]\ncredentials_file = "sa.json"\n'
        f'user = "{user}"\n',
        encoding="utf-8",
    )
    fields = {"from_addr": None, "yes": False, "max_wait": "10m", "interval": "2s", **given}
    args = argparse.Namespace(
        config=str(config), provider="support", to="you@example.com", json=False, **fields
    )
    with pytest.raises(CliError) as refused:
        probe.cmd_probe(args)
    return refused.value


def test_the_probe_without_yes_and_without_a_terminal_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    refused = refused_probe(tmp_path, "me@example.com")
    assert refused.code == EXIT_BAD_INPUT == 2
    assert "--yes" in str(refused)


def test_the_probe_of_a_from_placeholder_provider_needs_from(tmp_path: Path) -> None:
    refused = refused_probe(tmp_path, "{from}", yes=True)
    assert refused.code == EXIT_BAD_INPUT
    assert str(refused).startswith("--from: ")


def test_policy_check_refuses_retry_on_a_client_copy_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from daemon.cli.job_commands import cmd_policy_check

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "receipts.toml").write_text(
        'provider = "mail"\nfrom = "a@example.com"\nmessage_id_domain = "example.com"\n'
        'on_unknown = "retry"\n',
        encoding="utf-8",
    )
    config = tmp_path / "sendledger.toml"
    (tmp_path / "pw").write_text("secret\n", encoding="utf-8")  # judged as `run` reads it
    settings = (
        '[daemon]\npolicies_dir = "policies"\n[providers.mail]\nkind = "smtp-imap"\n'
        'smtp_host = "smtp.example.com"\nimap_host = "imap.example.com"\n'
        'username = "a@example.com"\npassword_file = "pw"\nsent_copy = "{copy}"\n'
    )
    config.write_text(settings.format(copy="client"), encoding="utf-8")
    args = argparse.Namespace(config=str(config), dir=None, json=False)
    assert cmd_policy_check(args) == EXIT_BAD_INPUT
    assert "receipts.toml:on_unknown: " in capsys.readouterr().err
    config.write_text(settings.format(copy="server"), encoding="utf-8")
    assert cmd_policy_check(args) == 0


def test_an_unknown_review_reason_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--reason unknown` (for unknown-outcome) used to answer "no jobs in review", exit 0:
    # a typo that hides the queue from the person it was meant to show it to.
    from ledger.application import Ledger

    store = tmp_path / "ledger.sqlite"
    Ledger(f"sqlite:///{store}").close()
    config = tmp_path / "sendledger.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{store}"\n')
    assert main(["review", "list", "--config", str(config)]) == 0  # the store opens
    capsys.readouterr()
    for command in ("list", "triage"):
        with pytest.raises(SystemExit) as exit_:
            main(["review", command, "--reason", "unknown", "--config", str(config)])
        assert exit_.value.code == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "--reason" in err and "unknown-outcome" in err


@pytest.mark.parametrize(
    "lookup_error",
    [KeyError("getpwuid(): uid not found: 12345"), OSError("No username set in the environment")],
)
def test_a_login_name_the_system_cannot_give_still_submits_and_cancels(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    lookup_error: Exception,
) -> None:
    # A container run as an arbitrary uid (no passwd entry, no USER): getpass.getuser()
    # raises (KeyError on 3.11/3.12, OSError from 3.13), and `submit` failed as an
    # "unexpected failure" (exit 1) after the job was validated.
    import getpass

    from ledger.application import Ledger

    config = write_host_config(tmp_path, "sqlite:///ledger.sqlite")
    job = {"channel": "receipts", "key": "k1", "to": "a@example.com", "subject": "s", "body": "b"}
    (tmp_path / "job.json").write_text(json.dumps(job))

    def no_name() -> str:
        raise lookup_error

    monkeypatch.setattr(getpass, "getuser", no_name)
    assert main(["--config", str(config), "submit", str(tmp_path / "job.json")]) == 0, (
        capsys.readouterr().err
    )
    assert main(["--config", str(config), "cancel", "k1"]) == 0, capsys.readouterr().err
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        job_now = ledger.get_job("k1")
    uid = f"uid-{os.getuid()}"
    assert job_now.submitted_by == uid
    assert job_now.state.value == "cancelled"


@pytest.mark.parametrize("command", ["run", "api"])
def test_a_sighup_while_a_service_imports_its_modules_is_kept(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`run` and `api` import their modules (a fraction of a second) before their start-up
    handlers are set: a SIGHUP then met the default action and ended the process. From
    the first line of `main` it is kept (`daemon.cli.HANGUPS`), for the reload once the
    service runs."""
    import signal

    import daemon.cli

    seen: list[object] = []
    build = daemon.cli.build_parser

    def building(name: str | None = None) -> argparse.ArgumentParser:
        seen.append(signal.getsignal(signal.SIGHUP))
        return build(name)

    previous = signal.getsignal(signal.SIGHUP)
    monkeypatch.setattr(daemon.cli, "build_parser", building)
    try:
        # A config that is not there: refused (exit 2) once the command's module is in.
        assert main(["--config", str(tmp_path / "none.toml"), command]) == EXIT_BAD_INPUT
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert seen and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, None), seen


@pytest.mark.parametrize("text", ["+3", "1_000", " 7", "7 ", "\uff13", "\u0663", "0x1", "-1", ""])
def test_a_version_is_taken_in_ascii_digits_only(text: str) -> None:
    """As the API and the review page read it: `int` alone took "+3", "1_000", "\\uff13"."""
    with pytest.raises(argparse.ArgumentTypeError):
        positive_int(text)
    assert positive_int("12") == 12
