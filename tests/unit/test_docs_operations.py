"""docs/operations.md against the code it describes: the systemd steps and the two units
(`sendledger init`'s and packaging/), the notify protocol's STATUS line, the demo's options
and words, the example commands (each parses as the CLI parses it, each fault mode is one
the relay has, and the list of modes is the relay's), and the names the "Outages and quotas"
section uses (settings, policy fields, reasons, health checks)."""

from __future__ import annotations

import inspect
import re
import shlex
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.unit import docs_page
from tests.unit.docs_page import DOCS, flat
from tests.unit.engine_rig import EngineRig, policy

from daemon.cli import build_parser, main
from daemon.cli.init_command import Installation, unit_text
from daemon.config.settings import DaemonSettings
from daemon.exit_codes import EXIT_BAD_INPUT
from daemon.providers.base import Provider
from daemon.runtime import Daemon
from daemon.tools import demo
from ledger.vocabulary import OPEN_STATES, EscalationReason
from policies.model import ChannelPolicy
from testkit.graph_emulator import GraphEmulator
from testkit.relay import MODES, FaultRelay, classify
from testkit.smtp_relay import SMTP_MODES

PAGE = DOCS / "operations.md"
PACKAGED = DOCS.parent / "packaging" / "sendledger.service"


def section(heading: str) -> str:
    return docs_page.section(PAGE, heading)


def shell_commands(text: str) -> list[list[str]]:
    """The `sendledger ...` commands of the section's shell blocks and inline code, as argv
    (the words after the program, which is a line's first word or follows `sudo`;
    continuation lines joined, comments and `[optional]` parts removed)."""
    found = []
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    inline = re.findall(r"`(sendledger (?:relay|emulator)[^`]+)`", flat(text))
    for block in [*blocks, *inline]:
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(re.sub(r"\[[^\]]*\]", "", line), posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for word in [*lexer, ";"]:
                if word not in (";", "&&", "&", "|"):
                    words.append(word)
                    continue
                for i, program in enumerate(words):
                    named = program == "sendledger" or program.endswith("/bin/sendledger")
                    if named and words[:i] in ([], ["sudo"]):
                        found.append(words[i + 1 :])
                        break
                words = []
    return found


# -- Running under systemd ---------------------------------------------------------------


def test_every_systemd_step_command_parses() -> None:
    commands = shell_commands(section("## Running under systemd"))
    assert [c[0] for c in commands] == ["init"]
    args = build_parser("init").parse_args(commands[0])
    assert (args.dir, args.mailbox, args.provider) == ("/var/lib/sendledger", "you@example.com",
                                                       "gmail")  # fmt: skip


def test_the_written_unit_is_the_one_the_steps_edit(tmp_path: Path) -> None:
    """`init` run as root (the steps use sudo) writes `User=root`/`Group=root`, which the
    steps' sed replaces; the unit is Type=notify with the watchdog the page gives, and its
    ExecStart, WorkingDirectory and ReadWritePaths point at the installation and DIR."""
    text = flat(section("## Running under systemd"))
    here = Installation(tmp_path, ["/opt/sendledger/.venv/bin/sendledger"], "root", "root")
    unit = unit_text(here).splitlines()
    assert "User=root" in unit and "Group=root" in unit
    assert "s/^User=root/User=sendledger/; s/^Group=root/Group=sendledger/" in text
    config = tmp_path / "sendledger.toml"
    assert f"ExecStart=/opt/sendledger/.venv/bin/sendledger --config {config} run" in unit
    assert f"WorkingDirectory={tmp_path}" in unit and f"ReadWritePaths={tmp_path}" in unit
    watchdog = re.search(r"`WatchdogSec=(\d+)`", text)
    assert watchdog is not None
    for lines in (unit, PACKAGED.read_text(encoding="utf-8").splitlines()):
        assert "Type=notify" in lines and f"WatchdogSec={watchdog.group(1)}" in lines


def test_the_packaged_unit_has_the_layout_the_page_gives() -> None:
    text = flat(section("## Running under systemd"))
    assert "layout of `/opt/sendledger/.venv` and `/etc/sendledger/sendledger.toml`" in text
    unit = PACKAGED.read_text(encoding="utf-8").splitlines()
    assert (
        "ExecStart=/opt/sendledger/.venv/bin/sendledger --config "
        "/etc/sendledger/sendledger.toml run"
    ) in unit


def test_the_status_line_names_the_open_states_and_the_loud_warnings() -> None:
    text = flat(section("## Running under systemd"))
    states = re.search(r"open jobs per state \(([^)]+)\)", text)
    assert states is not None
    assert states.group(1).split(", ") == [str(s) for s in OPEN_STATES]
    assert "(and loud warnings: an unreliable provider handle, a failed policy reload)" in text
    with closing(EngineRig(policy("legal"))) as rig:
        rig.submit("legal", "k1")
        calm = SimpleNamespace(engine=rig.engine)
        assert Daemon.status_line(calm) == (  # type: ignore[arg-type]
            "jobs: " + ", ".join(f"{s} {1 if s == 'requested' else 0}" for s in OPEN_STATES)
        )
        loud = SimpleNamespace(
            engine=SimpleNamespace(
                ledger=rig.ledger,
                unreliable_providers=lambda: ["gmail"],
                policies=SimpleNamespace(last_error="legal.toml: bad"),
            )
        )
        line = Daemon.status_line(loud)  # type: ignore[arg-type]
        assert line.endswith("; HANDLE UNRELIABLE: gmail; policy reload failed: legal.toml: bad")


# -- Testing against faults --------------------------------------------------------------


def test_the_demo_options_and_words() -> None:
    text = flat(section("## Testing against faults"))
    parser = build_parser("demo")
    for provider in ("smtp-imap", "graph"):
        assert f"sendledger demo --provider {provider}" in text
        assert parser.parse_args(["demo", "--provider", provider]).provider == provider
    assert parser.parse_args(["demo", "--keep", "d", "--lag", "3s"]).keep == "d"
    smtp_modes = re.search(r"behind the SMTP fault relay \(([^)]+)\)", text)
    assert smtp_modes is not None and tuple(smtp_modes.group(1).split(", ")) == SMTP_MODES
    assert f"runs the same {_number(len(demo.JOBS))} jobs" in text
    # "drops responses, fails before forwarding, answers 500/503/429 and hangs"
    assert set(demo.SEND_FAULTS) == set(MODES) - {"hang-before-forward", "403-rate-limit", "slow"}
    assert set(demo.SMTP_FAULTS) == set(SMTP_MODES)
    source = Path(demo.__file__).read_text(encoding="utf-8")
    said = text.split("OUTCOME column says", 1)[1].split(";", 1)[0]
    outcomes = re.findall(r"`([^`]+)`", said)
    assert outcomes == [
        "confirmed",
        "confirmed by a human",
        "confirmed, resent by a human",
        "WAITING FOR A HUMAN",
    ]
    for outcome in outcomes:
        assert f'"{outcome}"' in source, outcome


def test_keep_refuses_a_folder_that_holds_a_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "`--keep` refuses (exit 2) a folder that already holds a demo" in flat(
        section("### What the demo shows")
    )
    (tmp_path / "ledger.sqlite").write_bytes(b"")
    assert main(["demo", "--keep", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "already holds a demo (ledger.sqlite)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.sqlite"]  # nothing ran


def _number(n: int) -> str:
    return {12: "twelve"}.get(n, str(n))


def test_the_relay_modes_are_the_relay_s() -> None:
    text = flat(section("### The emulator and the fault relay"))
    listed = text.split("Relay modes:", 1)[1].split("A comma-separated", 1)[0]
    assert tuple(re.findall(r"`([^`]+)`", listed)) == MODES


def test_every_example_command_parses_and_names_real_modes() -> None:
    commands = shell_commands(section("## Testing against faults"))
    assert {tuple(c[:2]) for c in commands} == {
        ("emulator", "gmail"),
        ("emulator", "graph"),
        ("relay", "--upstream"),
    }
    assert len(commands) == 5  # the emulator, twice, in "Trying it"
    for argv in commands:
        args = build_parser(argv[0]).parse_args(argv)
        for kind in ("send", "search", "token", "other"):
            for mode in (getattr(args, kind, None) or "").split(","):
                assert not mode or mode in MODES, (argv, mode)


def test_the_relay_counts_graph_sends_and_searches() -> None:
    assert classify("POST", "/v1.0/users/u/messages/AAM=/send") == "send"
    assert classify("POST", "/v1.0/users/u/sendMail") == "send"
    assert classify("GET", "/v1.0/users/u/messages?$filter=x") == "search"
    assert classify("GET", "/v1.0/users/u/mailFolders/sentitems/messages/AAM=") == "search"
    assert classify("POST", "/v1.0/users/u/messages") == "other"  # the draft's creation


def test_the_relay_serves_tls_in_front_of_an_https_upstream() -> None:
    text = flat(section("### The emulator and the fault relay"))
    assert "`FaultRelay(upstream, tls=..., upstream_ca=...)` in `testkit.relay`" in text
    parameters = inspect.signature(FaultRelay).parameters
    assert next(iter(parameters)) == "upstream" and {"tls", "upstream_ca"} <= set(parameters)


def test_graph_s_mailbox_concurrency_is_four() -> None:
    text = flat(section("### The emulator and the fault relay"))
    assert "a fifth request in flight for one mailbox" in text
    parameters = inspect.signature(GraphEmulator).parameters
    assert parameters["mailbox_concurrency"].default == 4
    assert "latency" in parameters and hasattr(GraphEmulator, "throttle")


# -- Outages and quotas ------------------------------------------------------------------


def test_the_outage_section_names_settings_fields_and_reasons_that_exist() -> None:
    text = section("## Outages and quotas")
    for name in re.findall(r"`daemon\.(\w+)`", text):
        assert name in DaemonSettings.model_fields, name
    for name in re.findall(r"`(circuit_\w+)`", text):
        assert name in DaemonSettings.model_fields, name
    for name in ("give_up_after", "max_attempts"):
        if f"`{name}`" in text:
            assert name in ChannelPolicy.model_fields, name
    for reason in re.findall(r"reason `([a-z-]+)`", text):
        assert reason in {r.value for r in EscalationReason}, reason
    for method in re.findall(r"`Provider\.(\w+)`", text):
        assert hasattr(Provider, method), method
