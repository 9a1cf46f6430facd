"""The example commands of docs/operations.md "The emulator and the fault relay", run as
printed (only each `--port` swapped for a free one, so runs side by side do not clash): the
Gmail emulator and the relay with the config lines the page gives, the real Gmail provider
sending through them, each fault mode taken in the order the example lists; and the Graph
emulator's one JSON line, with the keys the page shows."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from tests.integration.api_kit import free_port
from tests.unit.docs_page import section
from tests.unit.test_docs_examples import commands as shell_commands

from daemon.providers.base import SendKind
from daemon.providers.gmail import GmailProvider
from ledger.mime import build_message

SENDLEDGER = str(Path(sys.executable).parent / "sendledger")
SECTION = "### The emulator and the fault relay"


def with_ports(argv: list[str], ports: dict[str, str]) -> list[str]:
    """`argv` with every port of the page (`--port N`, `127.0.0.1:N`) mapped to a free one."""
    out: list[str] = []
    for word in argv:
        for old, new in ports.items():
            word = word.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        out.append(ports.get(word, word) if out and out[-1] == "--port" else word)
    return out


@contextmanager
def running(argv: list[str], cwd: Path) -> Iterator[str]:
    """The command as a process; yields the first line it prints (its URL or facts)."""
    proc = subprocess.Popen(
        [SENDLEDGER, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first, proc.stderr.read() if proc.stderr else argv
        yield first
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def _message(n: int) -> bytes:
    return build_message(
        from_addr="Support <support@example.com>",
        to=["bob@example.com"],
        subject=f"Receipt {n}",
        body="Thanks.",
        message_id=f"<job-example-{n}@mail.example.com>",
        date=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_the_gmail_example_runs_as_printed(tmp_path: Path) -> None:
    text = section("operations.md", SECTION)
    emulator_argv, relay_argv = [c for c in shell_commands(text) if "gmail" in c or "relay" in c][
        :2
    ]
    assert emulator_argv[:2] == ["emulator", "gmail"] and relay_argv[0] == "relay"
    ports = {emulator_argv[emulator_argv.index("--port") + 1]: str(free_port())}
    ports[relay_argv[relay_argv.index("--port") + 1]] = str(free_port())
    config = dict(re.findall(r'(\w+) = "([^"]+)"', text.split("# in sendledger.toml:", 1)[1])[:3])
    with (
        running(with_ports(emulator_argv, ports), tmp_path) as emulator_url,
        running(with_ports(relay_argv, ports), tmp_path) as relay_url,
    ):
        assert with_ports([config["api_endpoint"]], ports) == [relay_url]
        [token_uri] = with_ports([config["token_uri"]], ports)
        assert token_uri == emulator_url + "/token"
        sa = tmp_path / config["credentials_file"]
        assert json.loads(sa.read_text(encoding="utf-8"))["token_uri"] == token_uri
        provider = GmailProvider(
            "gmail",
            credentials_file=sa,
            user="support@example.com",
            api_endpoint=relay_url,
            token_uri=token_uri,
            timeout=5.0,
        )
        try:
            # --send drop-response,fail-before-forward,pass: one send each, in that order.
            outcomes = [provider.send_raw(_message(n)).kind for n in (1, 2, 3)]
        finally:
            provider.close()
    assert outcomes[0] is SendKind.UNKNOWN and outcomes[2] is SendKind.CONFIRMED
    accepted = [json.loads(line)["message_id"] for line in (tmp_path / "accepted.jsonl").open()]
    # The dropped answer's message arrived; the one failed before forwarding did not.
    assert accepted == ["<job-example-1@mail.example.com>", "<job-example-3@mail.example.com>"]


def test_the_graph_emulator_prints_the_line_the_page_shows(tmp_path: Path) -> None:
    text = section("operations.md", SECTION)
    [argv] = [c for c in shell_commands(text) if c[:2] == ["emulator", "graph"]]
    printed = text.split("# {", 1)[1].split("}", 1)[0]
    keys = re.findall(r'"(\w+)":', printed)
    port = argv[argv.index("--port") + 1]
    with running(with_ports(argv, {port: str(free_port())}), tmp_path) as line:
        facts = json.loads(line)
    assert list(facts) == keys
    assert facts["authority"] == facts["url"]
    assert facts["api_endpoint"] == facts["url"] + "/v1.0"
    assert Path(facts["ca_file"]) == tmp_path / "graph-tls" / "ca.pem"
    assert Path(facts["client_secret_file"]) == tmp_path / "graph-tls" / "client-secret"
