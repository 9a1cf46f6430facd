"""The fault relay in front of the emulator: what the client sees, and what reached the
provider (counted in the emulator's acceptance log, never on the client side)."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httplib2
import pytest

from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay, Mode

MESSAGE_ID = "<job-relay@mail.example.com>"
RAW = (
    f"From: support@example.com\r\nTo: a@example.org\r\nSubject: s\r\nMessage-ID: {MESSAGE_ID}"
    "\r\n\r\nbody\r\n"
).encode()
SEND_PATH = "/gmail/v1/users/me/messages/send"
SEND_BODY = json.dumps({"raw": base64.urlsafe_b64encode(RAW).decode()}).encode()


@pytest.fixture
def emulator() -> Iterator[GmailEmulator]:
    with GmailEmulator(require_auth=False) as emu:
        yield emu


def make_relay(emulator: GmailEmulator, **kwargs: Any) -> FaultRelay:
    kwargs.setdefault("hang_seconds", 1.0)
    return FaultRelay(emulator.url, **kwargs).start()


def connect(relay: FaultRelay, timeout: float = 2.0) -> http.client.HTTPConnection:
    parts = urlsplit(relay.url)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)


def send(conn: http.client.HTTPConnection) -> tuple[int, dict[str, str], Any]:
    conn.request("POST", SEND_PATH, body=SEND_BODY, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), json.loads(response.read())


def test_pass_forwards_once_and_returns_the_upstream_answer(emulator: GmailEmulator) -> None:
    with make_relay(emulator) as relay:
        conn = connect(relay)
        status, _, body = send(conn)
        conn.close()

    assert status == 200
    assert body["labelIds"] == ["SENT"]
    assert emulator.copies(MESSAGE_ID) == 1
    [entry] = relay.log
    assert entry["kind"] == "send"
    assert entry["mode"] == "pass"
    assert entry["forwarded"] is True
    assert entry["upstream_status"] == 200


def test_fail_before_forward_closes_without_reaching_the_provider(
    emulator: GmailEmulator,
) -> None:
    with make_relay(emulator, plan=FaultPlan(send="fail-before-forward")) as relay:
        conn = connect(relay)
        with pytest.raises(http.client.RemoteDisconnected):
            send(conn)
        conn.close()

    assert emulator.copies(MESSAGE_ID) == 0
    assert relay.log[0]["forwarded"] is False


def test_drop_response_reaches_the_provider_but_not_the_client(emulator: GmailEmulator) -> None:
    with make_relay(emulator, plan=FaultPlan(send="drop-response")) as relay:
        conn = connect(relay)
        with pytest.raises(http.client.RemoteDisconnected):
            send(conn)
        conn.close()

    assert emulator.copies(MESSAGE_ID) == 1
    assert relay.log[0]["forwarded"] is True
    assert relay.log[0]["upstream_status"] == 200


def test_drop_response_with_reset(emulator: GmailEmulator) -> None:
    with make_relay(emulator, plan=FaultPlan(send="drop-response"), reset=True) as relay:
        conn = connect(relay)
        with pytest.raises(ConnectionResetError):
            send(conn)
        conn.close()

    assert emulator.copies(MESSAGE_ID) == 1


@pytest.mark.parametrize(("mode", "copies"), [("hang", 1), ("hang-before-forward", 0)])
def test_hang_outlasts_the_client_timeout(emulator: GmailEmulator, mode: Mode, copies: int) -> None:
    with make_relay(emulator, plan=FaultPlan(send=mode), hang_seconds=1.0) as relay:
        conn = connect(relay, timeout=0.3)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            send(conn)
        assert time.monotonic() - started < 0.9
        conn.close()
        # The forward may still be in flight when the client gives up.
        deadline = time.monotonic() + 2
        while emulator.copies(MESSAGE_ID) < copies and time.monotonic() < deadline:
            time.sleep(0.01)
        assert emulator.copies(MESSAGE_ID) == copies


def test_slow_forwards_late_and_returns_the_upstream_answer(emulator: GmailEmulator) -> None:
    plan = FaultPlan(send="slow")
    with make_relay(emulator, plan=plan, slow_seconds=0.4, slow_jitter=0.2, seed=3) as relay:
        conn = connect(relay, timeout=2.0)
        started = time.monotonic()
        status, _, body = send(conn)
        took = time.monotonic() - started
        conn.close()

    [entry] = relay.log
    assert 0.4 <= entry["delay"] <= 0.6 and took >= entry["delay"]
    assert status == 200 and body["labelIds"] == ["SENT"]  # the answer, as with pass
    assert (entry["mode"], entry["forwarded"], entry["upstream_status"]) == ("slow", True, 200)
    # The upstream acted only after the wait: the copy was accepted late, once.
    [accepted] = emulator.accepted()
    accepted_at = datetime.fromisoformat(accepted["at"]).timestamp()
    assert accepted_at >= entry["at"] + entry["delay"] - 0.001  # the log keeps milliseconds
    assert emulator.copies(MESSAGE_ID) == 1


def test_500_after_forward(emulator: GmailEmulator) -> None:
    with make_relay(emulator, plan=FaultPlan(send="500-after-forward")) as relay:
        conn = connect(relay)
        status, _, body = send(conn)
        conn.close()

    assert status == 500
    assert body["error"]["errors"][0]["reason"] == "backendError"
    assert emulator.copies(MESSAGE_ID) == 1
    assert relay.log[0]["upstream_status"] == 200


@pytest.mark.parametrize(
    ("mode", "status", "reason"),
    [
        ("503", 503, "backendError"),
        ("429", 429, "rateLimitExceeded"),
        ("403-rate-limit", 403, "userRateLimitExceeded"),
    ],
)
def test_refusals_do_not_forward(
    emulator: GmailEmulator, mode: Mode, status: int, reason: str
) -> None:
    with make_relay(emulator, plan=FaultPlan(send=mode), retry_after=2.5) as relay:
        conn = connect(relay)
        got_status, headers, body = send(conn)
        # The connection stays usable after a refusal.
        got_again, _, _ = send(conn)
        conn.close()

    assert got_status == got_again == status
    assert headers["Retry-After"] == "2.5"
    assert body["error"]["code"] == status
    assert body["error"]["errors"][0]["reason"] == reason
    assert emulator.copies(MESSAGE_ID) == 0
    assert [e["forwarded"] for e in relay.log] == [False, False]


def test_no_retry_after_when_disabled(emulator: GmailEmulator) -> None:
    with make_relay(emulator, plan=FaultPlan(send="429"), retry_after=None) as relay:
        conn = connect(relay)
        _, headers, _ = send(conn)
        conn.close()
    assert "Retry-After" not in headers


def test_sequence_is_consumed_then_default_applies_over_keep_alive(
    emulator: GmailEmulator,
) -> None:
    plan = FaultPlan(send=["503", "500-after-forward"], default="pass")
    with make_relay(emulator, plan=plan) as relay:
        conn = connect(relay)
        statuses = [send(conn)[0] for _ in range(4)]
        conn.close()

    assert statuses == [503, 500, 200, 200]
    assert emulator.copies(MESSAGE_ID) == 3
    assert [e["mode"] for e in relay.log] == ["503", "500-after-forward", "pass", "pass"]
    assert relay.forwarded("send") == 3


def test_kinds_get_their_own_modes(emulator: GmailEmulator) -> None:
    plan = FaultPlan(search="503", token="429")
    with make_relay(emulator, plan=plan) as relay:
        conn = connect(relay)
        assert send(conn)[0] == 200
        conn.request("GET", "/gmail/v1/users/me/messages?q=rfc822msgid%3Ax")
        listed = conn.getresponse()
        listed.read()
        conn.request("GET", "/gmail/v1/users/me/messages/0123456789abcdef?format=minimal")
        got = conn.getresponse()
        got.read()
        conn.request("POST", "/token", body=b"grant_type=refresh_token")
        token = conn.getresponse()
        token_body = json.loads(token.read())
        conn.close()

    assert (listed.status, got.status, token.status) == (503, 503, 429)
    assert token_body["error"] == "rate_limit_exceeded"
    assert [e["kind"] for e in relay.log] == ["send", "search", "search", "token"]


def test_set_plan_switches_modes(emulator: GmailEmulator) -> None:
    with make_relay(emulator) as relay:
        conn = connect(relay)
        assert send(conn)[0] == 200
        relay.set_plan(FaultPlan(send="503"))
        assert send(conn)[0] == 503
        conn.close()


@pytest.mark.parametrize(("mode", "copies"), [("hang", 1), ("slow", 0)])
def test_stop_releases_held_connections(emulator: GmailEmulator, mode: Mode, copies: int) -> None:
    """A held answer (hang: forwarded, 1 copy) and a slow wait (never forwarded, none)."""
    relay = make_relay(emulator, plan=FaultPlan(send=mode), hang_seconds=30.0, slow_seconds=30.0)
    conn = connect(relay, timeout=5)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            send(conn)
        except (OSError, http.client.HTTPException) as exc:
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    deadline = time.monotonic() + 2
    while (not relay.log or emulator.copies(MESSAGE_ID) < copies) and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    relay.stop()
    thread.join(timeout=3)

    assert time.monotonic() - started < 2
    assert not thread.is_alive()
    assert len(errors) == 1
    assert emulator.copies(MESSAGE_ID) == copies
    assert relay.log[0]["forwarded"] is bool(copies)


def test_upstream_down_is_502_and_not_forwarded() -> None:
    with GmailEmulator(require_auth=False) as emu:
        upstream = emu.url
    with FaultRelay(upstream) as relay:
        conn = connect(relay)
        status, _, body = send(conn)
        conn.close()
    assert status == 502
    assert body["error"]["code"] == 502
    assert relay.log[0]["forwarded"] is False


def test_httplib2_resends_after_a_dropped_response(emulator: GmailEmulator) -> None:
    """The hazard DESIGN.md names: httplib2 repeats a request once when the connection
    closes without a status line. The relay forwards each request it receives once, so the
    provider sees both: a client that uses httplib2 for sends must switch this off."""
    with make_relay(emulator, plan=FaultPlan(send=["drop-response"])) as relay:
        http = httplib2.Http(timeout=2)
        response, _ = http.request(
            relay.url + SEND_PATH,
            "POST",
            body=SEND_BODY,
            headers={"Content-Type": "application/json"},
        )

    assert response.status == 200
    assert [e["mode"] for e in relay.log] == ["drop-response", "pass"]
    assert emulator.copies(MESSAGE_ID) == 2
