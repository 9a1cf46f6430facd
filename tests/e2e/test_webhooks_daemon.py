"""Webhooks from the daemon as a process (docs/http-api.md "Webhooks"): a receiver on 127.0.0.1
that verifies every signature with the Standard Webhooks reference library, refuses the
first deliveries, is down for a while; the daemon is killed -9 half-way and restarted. In
the end every event was delivered at least once, under the same id on every attempt, in
order per job."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook
from tests.e2e.daemon_kit import PostgresRig, RefusingGmailEmulator, Rig, job

from daemon.webhooks.signing import new_secret
from ledger.job import job_id_for

REFUSED = "refused@example.com"
WEBHOOK_EVENTS = ("Confirmed", "Escalated", "Rejected", "Resolved")


class Receiver:
    """An HTTP server that verifies and records deliveries; `refuse` answers that many
    with 503 first; `down()` closes the port (connection refused) until `up()`."""

    def __init__(self, secret: str) -> None:
        self.verifier = Webhook(secret)
        self.lock = threading.Lock()
        self.refuse = 0
        self.delay = 0.0  # seconds each accepted delivery takes
        self.accepted: list[dict[str, Any]] = []
        self.attempts: list[str] = []  # webhook-id of every request, in arrival order
        self.bad: list[str] = []
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/sendledger"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver.take(body, headers)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def take(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            payload = self.verifier.verify(body, headers)
        except Exception as exc:
            with self.lock:
                self.bad.append(f"{type(exc).__name__}: {exc}")
            return 400
        with self.lock:
            self.attempts.append(headers["webhook-id"])
            if payload["event_id"] != headers["webhook-id"]:
                self.bad.append(f"event_id {payload['event_id']} != {headers['webhook-id']}")
            if self.refuse > 0:
                self.refuse -= 1
                return 503
            self.accepted.append(payload)
        time.sleep(self.delay)
        return 204

    def accepted_ids(self) -> set[str]:
        with self.lock:
            return {p["event_id"] for p in self.accepted}


def expected_events(rig: Rig) -> list[tuple[str, str]]:
    """(event id, key) of every event a webhook of all types hears, in log order."""
    keys = {job_id_for(row.key): row.key for row in rig.rows()}
    return [
        (f"evt_{event.originator_id.hex}_{event.originator_version}", keys[event.originator_id])
        for event in rig.ledger.job_events(types=list(WEBHOOK_EVENTS))
        if type(event).__name__ != "Resolved" or event.decision == "abandon"
    ]


def test_every_event_reaches_a_flaky_receiver_across_a_kill9(tmp_path: Path) -> None:
    secret = new_secret()
    receiver = Receiver(secret)
    receiver.refuse = 3
    receiver.delay = 0.3  # slow enough that the kill lands with deliveries to go
    emulator = RefusingGmailEmulator(
        refuse_to=[REFUSED], lag=0.3, acceptance_log=tmp_path / "acceptance.jsonl"
    )
    with Rig(tmp_path, emulator=emulator) as rig:
        (tmp_path / "webhook-secret").write_text(secret + "\n")
        (tmp_path / "webhook-secret").chmod(0o600)
        with rig.config.open("a") as config:
            config.write(
                "\n[webhooks.ops]\n"
                f'url = "{receiver.url}"\n'
                'secret_file = "webhook-secret"\n'
                'timeout = "500ms"\n'
                'retry_backoff = "100ms"\n'
                'retry_backoff_max = "400ms"\n'
            )
        first_keys = [f"wh-a-{n}" for n in range(8)]
        rig.submit([job(key) for key in first_keys] + [job("wh-refused", to=REFUSED)])
        first = rig.start_daemon()
        rig.wait_for(lambda: len(receiver.accepted) >= 3, "three deliveries accepted")
        assert first.kill9() < 0
        delivered_before_kill = len(receiver.accepted)
        receiver.delay = 0.0

        receiver.down()
        second_keys = [f"wh-b-{n}" for n in range(8)]
        rig.submit([job(key) for key in second_keys])
        second = rig.start_daemon()
        rig.wait_settled(second_keys)
        rig.wait_for(
            lambda: (
                (status := rig.cli_json("webhooks", "status")[0])["failures"] >= 2
                and status["behind"] > 0
            ),
            "deliveries failing while the receiver is down",
        )
        status = rig.cli_json("webhooks", "status")[0]
        assert status["name"] == "ops" and status["last_error"]
        assert status["lag_seconds"] is not None and status["lag_seconds"] > 0
        assert "Connection" in status["last_error"] or "refused" in status["last_error"]

        rig.cli("review", "resolve", "wh-refused", "--as", "abandon", "--note", "bad address")
        receiver.up()  # the same port
        expected = expected_events(rig)
        rig.wait_for(
            lambda: receiver.accepted_ids() >= {event_id for event_id, _key in expected},
            "every event delivered",
            timeout=60,
        )
        rig.wait_for(
            lambda: rig.cli_json("webhooks", "status")[0]["behind"] == 0, "status caught up"
        )
        assert second.terminate() == 0, second.tail()

    assert receiver.bad == []
    assert delivered_before_kill < len(expected) - len(second_keys)  # killed half-way
    accepted = receiver.accepted
    # Every event at least once; nothing that is not one.
    assert {p["event_id"] for p in accepted} == {event_id for event_id, _key in expected}
    # Stable ids: every attempt (refused ones too) carried an id that was later accepted.
    assert set(receiver.attempts) == {p["event_id"] for p in accepted}
    assert receiver.attempts[:4] == [receiver.attempts[0]] * 4  # the refused ones, retried
    # In log order (so per job too): each event first arrived after every earlier one.
    assert list(dict.fromkeys(p["event_id"] for p in accepted)) == [e for e, _key in expected]
    # In order per job: each job's first deliveries come in its own event order.
    for key in {key for _id, key in expected}:
        wanted = [event_id for event_id, k in expected if k == key]
        got = list(dict.fromkeys(p["event_id"] for p in accepted if p["key"] == key))
        assert got == wanted, key
    refused = [(p["type"], p["state"]) for p in accepted if p["key"] == "wh-refused"]
    assert list(dict.fromkeys(refused)) == [
        ("rejected", "attempted"),
        ("review", "review"),
        ("abandoned", "abandoned"),
    ]
    # The others are confirmed; one may also have a Rejected "not sent" first: a claim
    # withheld (its circuit opened while the claim was saved) or stopped by the kill makes
    # no call and is sent again (failed in CI once).
    others = [p for p in accepted if p["key"] != "wh-refused"]
    assert {p["type"] for p in others} - {"rejected"} == {"confirmed"}
    assert all(p["state"] == "confirmed" for p in others if p["type"] == "confirmed")
    assert all(p["channel"] == "receipts" and p["message_id"] for p in accepted)


def test_status_skip_and_secret_commands(tmp_path: Path) -> None:
    with Rig(tmp_path) as rig:
        with rig.config.open("a") as config:
            config.write(
                '\n[webhooks.ops]\nurl = "http://127.0.0.1:9/nobody-listens"\n'
                'secret_file = "webhook-secret"\nevents = ["confirmed", "review"]\n'
            )
        missing = rig.cli("webhooks", "status", check=False)
        assert missing.returncode == 2 and "no store at" in missing.stderr
        rig.submit([job("st-1")])
        # No daemon has run: the webhook is at the beginning, nothing is behind yet.
        [status] = rig.cli_json("webhooks", "status")
        assert (status["name"], status["position"], status["behind"]) == ("ops", 0, 0)
        assert status["last_error"] is None and status["configured"] is True
        text = rig.cli("webhooks", "status").stdout
        assert text.splitlines()[0].split()[:3] == ["NAME", "POSITION", "BEHIND"]
        assert text.splitlines()[1].split()[:3] == ["ops", "0", "0"]

        # A secret that is not one: the daemon refuses to start, naming the setting.
        (tmp_path / "webhook-secret").write_text("hunter2\n")
        daemon = rig.start_daemon()
        assert daemon.wait(30) == 2
        assert "webhooks.ops.secret_file: the secret must start with 'whsec_'" in (
            daemon.stderr_text()
        )
        assert "hunter2" not in daemon.stderr_text()
        assert rig.types("st-1") == ["Requested"]  # refused before anything was done

        secret = rig.cli("webhooks", "new-secret").stdout.strip()
        assert secret.startswith("whsec_") and len(secret) == len("whsec_") + 44
        assert rig.cli_json("webhooks", "new-secret")["secret"] != secret
        (tmp_path / "webhook-secret").write_text(secret + "\n")

        # `run --once` sends the job and tries its webhook once: nobody listens.
        rig.cli("run", "--once")
        assert rig.state("st-1") == "confirmed"
        [status] = rig.cli_json("webhooks", "status")
        assert status["behind"] == 1 and status["failures"] == 1
        assert "refused" in status["last_error"]

        # The operator gives up on that event: skipped, nothing behind.
        skipped = rig.cli_json("webhooks", "skip", "ops")
        assert skipped["skipped"] == 1 and skipped["position"] > skipped["from"]
        assert skipped["event_ids"][0].startswith("evt_")
        [status] = rig.cli_json("webhooks", "status")
        assert (status["behind"], status["failures"]) == (0, 0)
        again = rig.cli("webhooks", "skip", "ops").stdout
        assert "nothing undelivered to skip" in again
        unknown = rig.cli("webhooks", "skip", "nope", check=False)
        assert unknown.returncode == 2 and "no [webhooks.nope]" in unknown.stderr


@pytest.mark.postgres
def test_two_daemons_on_postgres_deliver_each_event_once(tmp_path: Path, pg_url: str) -> None:
    """Two daemons on one PostgreSQL store: each event reaches the receiver once between
    them; the one delivering is killed -9 and restarted under its name, and takes its
    webhook back at once (the event in flight then may arrive twice, none is skipped)."""
    secret = new_secret()
    receiver = Receiver(secret)
    receiver.delay = 0.2
    with PostgresRig(tmp_path, pg_url) as rig:
        (tmp_path / "webhook-secret").write_text(secret + "\n")
        with rig.config.open("a") as config:
            config.write(
                f'\n[webhooks.ops]\nurl = "{receiver.url}"\nsecret_file = "webhook-secret"\n'
                'timeout = "2s"\nretry_backoff = "100ms"\nretry_backoff_max = "400ms"\n'
            )
        rig.submit([job(f"pg-a-{n}") for n in range(10)])
        names = {
            "alpha": {"SENDLEDGER_DAEMON__NAME": "alpha"},
            "beta": {"SENDLEDGER_DAEMON__NAME": "beta"},
        }
        daemons = {name: rig.start_daemon(env) for name, env in names.items()}
        rig.wait_for(lambda: len(receiver.accepted) >= 4, "four deliveries")
        [row] = rig.ledger.positions().read_all()
        assert row.owner in names
        assert daemons[row.owner].kill9() < 0
        daemons[row.owner] = rig.start_daemon(names[row.owner])
        rig.submit([job(f"pg-b-{n}") for n in range(10)])
        receiver.delay = 0.0
        rig.wait_settled([f"pg-b-{n}" for n in range(10)], timeout=60)
        expected = expected_events(rig)
        rig.wait_for(
            lambda: receiver.accepted_ids() >= {event_id for event_id, _key in expected},
            "every event delivered",
            timeout=60,
            daemon_must_live=False,
        )
        for daemon in daemons.values():
            assert daemon.terminate() == 0, daemon.tail()
    got = [p["event_id"] for p in receiver.accepted]
    assert receiver.bad == []
    assert list(dict.fromkeys(got)) == [event_id for event_id, _key in expected]
    assert len(got) - len(set(got)) <= 1  # at most the one in flight at the kill
