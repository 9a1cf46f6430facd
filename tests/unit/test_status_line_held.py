"""systemd's `STATUS=` line names the scopes whose sends are held, an open circuit and a
pause after sends closed with no response, so an operator without the HTTP API sees them
in `systemctl status` (docs/operations.md "Running under systemd"); and nothing from a
scope's name or a policy error leaves the process as more than that one line."""

from __future__ import annotations

import socket
import unicodedata
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import CircuitSettings
from daemon.runtime import Daemon
from daemon.systemd import Notifier

GRAPH = "graph/ops@example.com"


def status_of(rig: EngineRig) -> str:
    return Daemon.status_line(SimpleNamespace(engine=rig.engine))  # type: ignore[arg-type]


def test_the_status_line_names_a_paused_scope_and_an_open_circuit_with_their_next_probe() -> None:
    """Two sends closed unanswered pause the rig's scope (`pause_after_unanswered = 2`), and
    three refused calls open another's circuit: before, the line said only the job
    counts, the pause and the outage in the log alone."""
    with closing(EngineRig(policy("receipts", pause_after_unanswered=2), concurrency=1)) as rig:
        circuits = rig.engine.circuits
        circuits.settings = CircuitSettings(probe_after=40, probe_max=600)
        assert "sends held" not in status_of(rig)
        rig.provider.script(Scripted.unanswered(), Scripted.unanswered())
        for key in ("k1", "k2", "k3"):
            rig.submit("receipts", key)
        rig.tick()
        for _ in range(3):
            circuits.unavailable(GRAPH, rig.clock())
        rig.clock.advance(10)
        assert status_of(rig).endswith(
            "; sends held: fake paused (2 unanswered, next probe in 30s),"
            f" {GRAPH} open (3 failures, next probe in 30s)"
        ), status_of(rig)
        rig.clock.advance(31)
        assert status_of(rig).endswith(
            "; sends held: fake paused (2 unanswered, probe due),"
            f" {GRAPH} open (3 failures, probe due)"
        ), status_of(rig)
        circuits.answered(GRAPH, rig.clock())
        assert status_of(rig).endswith("; sends held: fake paused (2 unanswered, probe due)")


def test_hostile_scope_names_and_policy_errors_leave_as_one_bounded_printable_line(
    tmp_path: Path,
) -> None:
    """A scope's name carries a mailbox address (with `user = "{from}"`, the job's From),
    and a policy error quotes a file's value. Sent raw, a line break in either became an
    sd_notify assignment of its own (READY=1, MAINPID=...), an escape sequence reached the
    operator's terminal through `systemctl status`, and a lone surrogate did not encode
    (the status thread died). Now every control is escaped, a long name cut, at most
    three scopes named, and systemd reads exactly one STATUS= assignment."""
    hostile = [
        "graph/a" + "a" * 300 + "@example.com",
        "graph/b\nREADY=1@example.com",
        "graph/c\x1b[2J\u202e\udcff@example.com",
        "graph/d@example.com",
        "graph/e@example.com",
    ]
    with closing(EngineRig(policy("receipts"))) as rig:
        for scope in hostile:
            for _ in range(3):
                rig.engine.circuits.unavailable(scope, rig.clock())
        rig.engine.policies.last_error = "legal.toml: x\nMAINPID=1 " + "y" * 10_000
        line = status_of(rig)
        assert not [c for c in line if unicodedata.category(c) in ("Cc", "Cs")], line
        assert "\u202e" not in line and "\\x0aREADY=1" in line and "\\udcff" in line
        assert line.count(" open (3 failures") == 3 and line.count("and 2 more") == 1
        assert "graph/a" + "a" * 70 + "... open" in line and "graph/d" not in line
        assert len(line) < 1_000, len(line)
        path = str(tmp_path / "notify")
        with closing(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)) as server:
            server.bind(path)
            with closing(Notifier(path)) as notifier:
                assert notifier.status(line)
            [assignment] = server.recv(65536).decode("utf-8").splitlines()
        assert assignment.startswith("STATUS=jobs: ")


def test_the_overview_page_shows_the_held_scopes_escaped() -> None:
    """The review page's overview, in the daemon, lists the scopes whose sends are held
    in the status line's words (before: only `/healthz` and `/metrics` showed them); a
    name's markup and controls are shown, never acted on; `sendledger api`, with no
    engine, shows no such section."""
    from fastapi.testclient import TestClient
    from tests.unit.test_api_routes import AUTH, api_context

    from daemon.api.app import create_app

    with closing(EngineRig(policy("receipts"))) as rig:
        scope = "graph/<b>x</b>\x1b@example.com"
        for _ in range(3):
            rig.engine.circuits.unavailable(scope, rig.clock())
        ctx = api_context(rig)
        with TestClient(create_app(ctx)) as client:
            page = client.get("/ui/overview", headers=AUTH).text
            assert "Sends held" not in page  # no engine here
            ctx.health.circuits = list
            assert "No scope's sends are held" in client.get("/ui/overview", headers=AUTH).text
            ctx.health.circuits = rig.engine.open_circuits
            page = client.get("/ui/overview", headers=AUTH).text
        assert "graph/&lt;b&gt;x&lt;/b&gt;\\x1b@example.com</td>" in page, page
        assert ">open (3 failures, next probe in 1s)</td>" in page, page
