"""A Gmail send refused with a 10 MB error body, through the real client stack
(google-api-python-client + httplib2) and the real classification, on a real store: the
job's events hold a bounded reason (docs/how-it-works.md "Another's words").

Gmail's error summary keeps 200 characters of `error.message` but every `errors[].reason`,
joined: a body listing a million reasons made a reason of millions of characters. The
fault relay's answers are fixed, so a loopback server stands in for Gmail's send."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from json.encoder import encode_basestring_ascii
from pathlib import Path

import pytest
from tests.integration.conftest import GmailProviderFactory
from tests.integration.test_engine import BASE_POLICY, Rig, write_policy

from daemon.doubles.fake_time import FakeClock
from ledger.characters import MAX_RECORDED
from ledger.job import job_id_for
from policies.loader import load_policy_dir
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultRelay

#: Gmail's error shape, its reasons listed 700,000 times: about 10 MB.
ERROR_BODY = json.dumps(
    {
        "error": {
            "code": 400,
            "message": "Invalid \x01 \U0001f44d request",
            "errors": [{"reason": "invalidArgument\u00e9"}] * 700_000,
            "status": "INVALID_ARGUMENT",
        }
    },
    ensure_ascii=False,
).encode()


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(400)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(ERROR_BODY)))
        self.end_headers()
        self.wfile.write(ERROR_BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test's output is not the place for a stand-in's access log


@pytest.fixture
def refusing_gmail() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_gmail_send_refused_with_a_10_mb_body_records_a_bounded_reason(
    store_url: str,
    relay: FaultRelay,
    emulator: GmailEmulator,
    gmail_provider: GmailProviderFactory,
    refusing_gmail: str,
    tmp_path: Path,
) -> None:
    assert len(ERROR_BODY) > 10_000_000
    write_policy(tmp_path, "receipts", **BASE_POLICY)
    provider = gmail_provider(url=refusing_gmail, name="gmail", read_history=False)
    rig = Rig(
        store_url,
        FakeClock(),
        relay,
        emulator,
        provider,
        lambda: load_policy_dir(tmp_path, known_providers={"gmail"}),
    )
    try:
        rig.submit("receipts", "k1")
        rig.tick()
        [rejected] = rig.of("k1", "Rejected")
        [escalated] = rig.of("k1", "Escalated")
        stored = rig.ledger.recorder.select_events(job_id_for("k1"))
    finally:
        rig.close()
    for words in (rejected.reason, escalated.detail):
        assert words.startswith("HTTP 400: invalidArgument\u00e9/invalidArgument\u00e9/")
        assert words.endswith(" more characters]")
        assert len(encode_basestring_ascii(words)) - 2 <= MAX_RECORDED
    quoting = [e for e in stored if b"invalidArgument" in e.state]
    assert len(quoting) == 2
    for event in quoting:
        assert len(event.state) < 2_500, len(event.state)
