"""`sendledger.client.Client` against the real server (uvicorn on loopback, SQLite store),
directly and through the fault relay: each call's answer, one exception class per refusal,
and the retries the job key makes safe (docs/http-api.md "Python client")."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.integration.api_kit import (
    OTHER_TOKEN,
    Api,
    free_port,
    job,
    running_api,
    write_config,
)
from tests.integration.listeners import hold, serving, stop_all
from tests.integration.test_api import to_review

import sendledger.client as client_module
from daemon.api.build import api_context, server_for
from daemon.engine import PolicyHolder
from daemon.from_settings import load_policies
from ledger.application import Ledger
from sendledger.client import (
    Client,
    Conflict,
    ConnectionLost,
    Forbidden,
    Invalid,
    NotFound,
    ServerError,
    TooLarge,
    Unauthorized,
)
from testkit.relay import FaultPlan, FaultRelay
from testkit.tls import make_loopback_tls

TOKEN = "alice-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
NO_WAIT: dict[str, Any] = {"backoff": 0.0, "max_backoff": 0.0}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}", max_body="8KB")
    with (tmp_path / "api-tokens").open("a") as tokens:
        tokens.write(f"reader:{READER}:read\n")
    with running_api(settings) as running:
        yield running


@pytest.fixture
def client(api: Api) -> Client:
    return Client(api.url, TOKEN, timeout=5, **NO_WAIT)


def test_submit_status_events_and_the_same_key_again(api: Api, client: Client) -> None:
    key = "shop/order 7?#%"  # every character that means something in a URL
    first = client.submit(job(key))
    assert (first["key"], first["created"], first["state"]) == (key, True, "requested")
    assert client.submit(job(key))["created"] is False
    with pytest.raises(Conflict) as conflict:
        client.submit(job(key, subject="Other"))
    assert conflict.value.status == 409 and "other content" in conflict.value.error
    assert client.status(key)["subject"] == "Your receipt"
    assert [e["type"] for e in client.events(key)] == ["Requested"]
    many = client.submit_many([job("m1"), job("m2")])
    assert [(r["key"], r["created"]) for r in many] == [("m1", True), ("m2", True)]
    with pytest.raises(NotFound):
        client.status("nope")


def test_a_key_of_dots_leaves_as_one_encoded_segment(api: Api, client: Client) -> None:
    # A proxy that normalizes paths would turn /v1/jobs/.. into /v1/: another route.
    assert (client_module._job_path("."), client_module._review_path("..")) == (
        "/v1/jobs/%2E",
        "/v1/review/%2E%2E",
    )
    for key in (".", ".."):
        assert client.submit(job(key))["created"] is True
        assert client.status(key)["key"] == key


def test_invalid_input_lists_each_field(client: Client) -> None:
    with pytest.raises(Invalid) as invalid:
        client.submit_many([job("a"), job("b", to="not an address"), job("c", channel="")])
    assert [(e.index, e.field) for e in invalid.value.errors][:1] == [(1, "to")]
    assert invalid.value.total >= 1 and invalid.value.status == 422
    with pytest.raises(Invalid) as bad_query:
        client.page(state="lost", limit=0)
    assert [e.field for e in bad_query.value.errors] == ["state", "limit"]


def test_list_walks_every_page(client: Client) -> None:
    client.submit_many([job(f"k{i}") for i in range(7)])
    client.cancel("k3")
    assert sorted(row["key"] for row in client.list(page_size=2)) == [f"k{i}" for i in range(7)]
    assert [row["key"] for row in client.list(state="cancelled")] == ["k3"]
    assert client.page(limit=3)["next_cursor"]
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    assert len(list(client.list(since=hour_ago))) == 7
    assert list(client.list(since=datetime.now(UTC) + timedelta(hours=1))) == []


def test_cancel_resolve_check_triage(api: Api, client: Client) -> None:
    client.submit(job("c1"))
    assert client.cancel("c1", note="not needed")["state"] == "cancelled"
    with pytest.raises(Conflict) as refused:
        client.cancel("c1")
    assert refused.value.may_have_applied is False
    client.submit(job("r1"))
    to_review(api, "r1")
    assert [item["key"] for item in client.review()] == ["r1"]
    # No mailbox can be searched from this test server: 503, retried, then ServerError.
    with pytest.raises(ServerError) as unavailable:
        Client(api.url, TOKEN, retries=1, **NO_WAIT).check("r1")
    assert unavailable.value.status == 503 and unavailable.value.may_have_applied is False
    triaged = client.triage(dry_run=True)
    assert [(t["key"], t["action"]) for t in triaged] == [("r1", "search-failed")]
    assert client.resolve("r1", "abandon", note="duplicate order")["state"] == "abandoned"
    with pytest.raises(Conflict):
        client.resolve("r1", "abandon")


def test_tokens_roles_and_size(api: Api, client: Client) -> None:
    with pytest.raises(Unauthorized) as unauthorized:
        Client(api.url, "wrong-token-0123456789").submit(job("x"))
    reader = Client(api.url, READER)
    with pytest.raises(Forbidden) as forbidden:
        reader.submit(job("x"))
    assert "submit role" in forbidden.value.error
    with pytest.raises(NotFound) as not_found:
        client.cancel("x")
    with pytest.raises(TooLarge) as too_large:
        client.submit(job("big", body="x" * 9000))
    with pytest.raises(Invalid) as invalid:
        client.submit(job("bad", to="not an address"))
    for refused in (unauthorized, forbidden, not_found, too_large, invalid):
        assert refused.value.may_have_applied is False  # refused before the server acted
    assert list(client.list()) == []


def test_lost_answers_are_retried_where_a_repeat_is_safe(api: Api) -> None:
    plan = FaultPlan(other=["drop-response", "500-after-forward", "503", "429"])
    slept: list[float] = []
    with FaultRelay(api.url, plan=plan, retry_after=0.01) as relay:
        client = Client(relay.url, TOKEN, timeout=5, backoff=0.001, sleep=slept.append)
        answer = client.submit(job("retried"))
        # Stored by the first try; the repeats found the same content: 200, one job.
        assert answer["created"] is False
        assert relay.forwarded() == 3 and len(relay.log) == 5
        assert [row.key for row in api.ledger.jobs()] == ["retried"]
        assert len(slept) == 4
        # A cancel whose answer was lost: the repeat's 409 is its own success.
        relay.set_plan(FaultPlan(other=["drop-response"]))
        assert client.cancel("retried")["state"] == "cancelled"
        # A decision whose answer was lost is not sent again.
        api.client.post("/v1/jobs", json=job("decided"), headers=api.auth())
        to_review(api, "decided")
        relay.set_plan(FaultPlan(other=["drop-response"]))
        before = relay.forwarded()
        with pytest.raises(ConnectionLost) as lost:
            client.resolve("decided", "abandon")
        assert lost.value.sent is True and relay.forwarded() == before + 1
        assert lost.value.may_have_applied is True
        assert api.ledger.get_job("decided").state.value == "abandoned"
        # A 500 after the server acted: the resolve was applied, and the error says it may
        # have been (127b519 said "look before deciding again" only for ConnectionLost).
        api.client.post("/v1/jobs", json=job("applied"), headers=api.auth())
        to_review(api, "applied")
        relay.set_plan(FaultPlan(other=["500-after-forward"]))
        with pytest.raises(ServerError) as failed:
            client.resolve("applied", "abandon")
        assert failed.value.status == 500 and failed.value.may_have_applied is True
        assert api.ledger.get_job("applied").state.value == "abandoned"
        # A cancel retried after a lost answer, then refused: the first try may have applied.
        relay.set_plan(FaultPlan(other=["drop-response", "503", "503", "503", "503"]))
        api.client.post("/v1/jobs", json=job("withdrawn"), headers=api.auth())
        with pytest.raises(ServerError) as unavailable:
            client.cancel("withdrawn")
        assert unavailable.value.status == 503 and unavailable.value.may_have_applied is True
        # A check whose answer was lost is not searched again (its 503s were retried).
        api.client.post("/v1/jobs", json=job("checked"), headers=api.auth())
        to_review(api, "checked")
        relay.set_plan(FaultPlan(other=["drop-response"]))
        before = relay.forwarded()
        with pytest.raises(ConnectionLost) as checked:
            client.check("checked")
        assert checked.value.may_have_applied is True and relay.forwarded() == before + 1


def test_timeouts_and_refused_connections(api: Api, dead_url: str) -> None:
    with FaultRelay(api.url, plan=FaultPlan(other=["hang"]), hang_seconds=3) as relay:
        client = Client(relay.url, TOKEN, timeout=0.3, retries=0)
        with pytest.raises(ConnectionLost) as hung:
            client.status("x")
        assert hung.value.sent is True and hung.value.may_have_applied is False  # a read
    slept: list[float] = []
    nowhere = Client(dead_url, TOKEN, retries=2, sleep=slept.append)
    with pytest.raises(ConnectionLost) as refused:
        nowhere.resolve("x", "sent")  # nothing reached a server: safe to try again
    assert refused.value.sent is False and len(slept) == 2
    assert refused.value.may_have_applied is False


def test_a_triage_that_outlives_the_timeout_is_not_started_again(api: Api) -> None:
    """A triage searches every job in review, one after the other: after an outage, with
    hundreds of them, it runs past any client timeout while healthy. Sent again, each
    repeat is one more triage running beside the first, every job searched once more per
    repeat (the quota spent the moment the provider came back), and the answer still
    lost. The relay's hang is that slow server: forwarded, the answer held."""
    api.client.post("/v1/jobs", json=job("t1"), headers=api.auth())
    to_review(api, "t1")
    with FaultRelay(api.url, plan=FaultPlan(other="hang"), hang_seconds=1) as relay:
        client = Client(relay.url, TOKEN, timeout=0.3, retries=2, **NO_WAIT)
        for dry_run in (False, True):
            before = relay.forwarded()
            with pytest.raises(ConnectionLost) as lost:
                client.triage(dry_run=dry_run)
            assert lost.value.sent is True and relay.forwarded() == before + 1
            assert lost.value.may_have_applied is not dry_run


def test_a_token_no_header_can_carry_is_refused_before_anything_is_sent() -> None:
    """A token pasted with a character outside latin-1 (an ellipsis of a shortened
    display) failed to encode in every attempt, which read as an answer lost: four retries,
    then `ConnectionLost(sent=True)` and `may_have_applied` on a resolve that never left."""
    slept: list[float] = []
    for token in ("alice-token-0123456789\u2026", "alice-token-0123456789\u00e9"):
        with pytest.raises(ValueError, match="token"):
            Client(f"http://127.0.0.1:{free_port()}", token, sleep=slept.append)
    assert slept == []


def test_the_client_imports_nothing_of_the_daemon() -> None:
    code = (
        "import sys, sendledger.client\n"
        "inner = {'daemon', 'ledger', 'policies', 'testkit', 'httpx', 'pydantic', 'fastapi'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & inner))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert "token" not in repr(Client("http://h:1", TOKEN)).lower()


def test_a_cancel_repeated_after_a_refusal_does_not_claim_another_persons_cancel(
    api: Api,
) -> None:
    """A 409 to a repeat is the client's own success only when an earlier try may have
    cancelled the job. Here the first try was refused (429: nothing done) and, while the
    client waited, Bob cancelled the job: the client said `cancelled` as if it had."""
    api.client.post("/v1/jobs", json=job("bobs"), headers=api.auth())

    def bob_cancels(_seconds: float) -> None:
        api.client.post(
            "/v1/jobs/bobs/cancel", json={"note": "bob's"}, headers=api.auth(OTHER_TOKEN)
        )

    with FaultRelay(api.url, plan=FaultPlan(other=["429"])) as relay:
        client = Client(relay.url, TOKEN, timeout=5, backoff=0.001, sleep=bob_cancels)
        with pytest.raises(Conflict) as refused:
            client.cancel("bobs", note="mine")
        assert refused.value.may_have_applied is False


def test_a_cancel_whose_lost_try_never_arrived_does_not_claim_another_persons_cancel(
    api: Api,
) -> None:
    """The first try timed out before the server saw it (it may have applied, as far as
    the client knows); meanwhile Bob cancelled with his own note. The repeat's 409 is
    Bob's cancel, which the job's Cancelled event shows: not the client's success."""
    for key in ("bobs", "mine"):
        api.client.post("/v1/jobs", json=job(key), headers=api.auth())
    others = {"bobs": "bob's", "mine": "withdrawn"}
    current = {"key": ""}

    def someone_cancels(_seconds: float) -> None:
        key = current["key"]
        api.client.post(
            f"/v1/jobs/{key}/cancel", json={"note": others[key]}, headers=api.auth(OTHER_TOKEN)
        )

    plan = FaultPlan(other=["hang-before-forward"])
    with FaultRelay(api.url, plan=plan, hang_seconds=1) as relay:
        client = Client(relay.url, TOKEN, timeout=0.3, backoff=0.001, sleep=someone_cancels)
        current["key"] = "bobs"
        with pytest.raises(Conflict) as refused:
            client.cancel("bobs", note="withdrawn")
        assert refused.value.may_have_applied is False
        # The same note: what the lost try would have recorded, so taken as its own.
        relay.set_plan(plan)
        current["key"] = "mine"
        assert client.cancel("mine", note="withdrawn")["state"] == "cancelled"


def test_a_check_that_outlives_the_timeout_is_not_searched_again(api: Api) -> None:
    """A check searches the mailbox, which a slow but healthy provider answers after the
    client's timeout: sent again, each repeat was one more search (and one more Checked
    event, one more quota unit) beside the first, as for triage."""
    api.client.post("/v1/jobs", json=job("slow"), headers=api.auth())
    to_review(api, "slow")
    with FaultRelay(api.url, plan=FaultPlan(other="hang"), hang_seconds=1) as relay:
        client = Client(relay.url, TOKEN, timeout=0.3, retries=2, **NO_WAIT)
        before = relay.forwarded()
        with pytest.raises(ConnectionLost) as lost:
            client.check("slow")
        assert lost.value.sent is True and relay.forwarded() == before + 1
        assert lost.value.may_have_applied is True


def test_a_walk_since_a_duration_ago_skips_no_job_between_pages(tmp_path: Path) -> None:
    """`since="1h"` is read by the server on each page, an hour before *that* page's
    request: a walk that took a while moved its lower bound past jobs it had not listed
    yet (changed after the last row shown, before the new bound), which no page showed.
    The cursor already starts after a row the first page's bound let in."""
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    now = [datetime(2026, 5, 1, 12, 0, tzinfo=UTC)]
    with Ledger(settings.store.url, base_dir=settings.base_dir, clock=lambda: now[0]) as ledger:
        policies = PolicyHolder(lambda: load_policies(settings))
        ctx = api_context(settings, ledger, policies, dict.fromkeys(settings.providers))
        server = server_for(settings, ctx)
        server.start()
        try:
            client = Client(f"http://{settings.api.listen}", TOKEN, timeout=5, **NO_WAIT)
            for key in ("a1", "a2", "a3"):
                client.submit(job(key))
                now[0] += timedelta(seconds=1)
            walk = client.list(since="1h", page_size=1)
            assert next(walk)["key"] == "a1"
            # The next page's "1h ago" falls between a2's change and a3's.
            now[0] += timedelta(hours=1, seconds=-1.5)
            assert [row["key"] for row in walk] == ["a2", "a3"]
        finally:
            server.stop()


def test_a_cancel_that_cannot_look_at_the_job_after_a_lost_try_says_it_may_have_applied(
    api: Api,
) -> None:
    """The lost first try cancelled the job, the repeat was refused (409), and the read of
    the job's events that decides whose cancel it was failed (503 after its retries): the
    read's error said `may_have_applied` False, for a cancel the server had applied."""
    api.client.post("/v1/jobs", json=job("unseen"), headers=api.auth())
    plan = FaultPlan(other=["drop-response", "pass", "503", "503"])
    with FaultRelay(api.url, plan=plan) as relay:
        client = Client(relay.url, TOKEN, timeout=5, retries=1, **NO_WAIT)
        with pytest.raises(ServerError) as unseen:
            client.cancel("unseen", note="withdrawn")
        assert unseen.value.status == 503 and unseen.value.may_have_applied is True
    assert api.ledger.get_job("unseen").state.value == "cancelled"


def test_a_certificate_the_client_does_not_trust_sends_nothing(api: Api, tmp_path: Path) -> None:
    """The TLS handshake fails before a byte of the request leaves: the client said
    `sent=True` and `may_have_applied` True for a resolve that never reached the server,
    so an operator whose CA file was missing was told to look at the job first."""
    api.client.post("/v1/jobs", json=job("tls"), headers=api.auth())
    to_review(api, "tls")
    with FaultRelay(api.url, tls=make_loopback_tls(tmp_path)) as relay:
        client = Client(relay.url, TOKEN, timeout=5, retries=0)
        with pytest.raises(ConnectionLost) as untrusted:
            client.resolve("tls", "abandon")
        assert untrusted.value.sent is False and untrusted.value.may_have_applied is False
        assert "certificate" in str(untrusted.value) and relay.forwarded() == 0


# The listeners `_raw_server` opened in the running test, stopped at its teardown.
_LISTENERS: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _raw_servers_stop() -> Iterator[None]:
    serving()
    yield
    stop_all(_LISTENERS)


def _raw_server(handler: Callable[[socket.socket], None]) -> tuple[str, list[bytes]]:
    """A loopback TCP server running `handler` on each connection; what each sent. It
    stops listening at the test's teardown."""
    listener = socket.create_server(("127.0.0.1", 0))
    _LISTENERS.append(listener)
    got: list[bytes] = []

    def loop() -> None:
        with listener:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn, contextlib.suppress(OSError):
                    conn.settimeout(3)
                    got.append(conn.recv(65536))
                    handler(conn)

    threading.Thread(target=loop, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", got


def test_a_connection_never_made_is_not_sent(full_backlog_port: int) -> None:
    """A connect that times out before the TCP handshake completed (a host that drops
    SYNs) sent nothing: the client said `sent=True`, and a resolve was neither retried nor
    safe to repeat by its own account (`may_have_applied`), though no server saw it."""
    slept: list[float] = []
    silent = Client(
        f"http://127.0.0.1:{full_backlog_port}", TOKEN, timeout=0.3, retries=1,
        sleep=slept.append,
    )  # fmt: skip
    with pytest.raises(ConnectionLost) as lost:
        silent.resolve("x", "sent")
    assert lost.value.sent is False and lost.value.may_have_applied is False
    assert len(slept) == 1  # tried again: nothing had reached a server


def test_a_silent_first_address_gives_way_to_the_next(
    api: Api, full_backlog_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server name whose first address never answers (a dead IPv6 route) and whose
    second is the API: the addresses are raced, the second starting 250 ms after the
    first, so the call is answered well within its timeout. Each address got the whole
    timeout in turn: the call failed as not sent once its retries were spent."""
    port = int(api.url.rsplit(":", 1)[1])
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "dual.invalid":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", full_backlog_port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    client = Client(f"http://dual.invalid:{port}", TOKEN, timeout=3, retries=0)
    started = time.monotonic()
    assert client.submit(job("dual-1"))["created"] is True
    assert time.monotonic() - started < 2.5


def test_a_connect_ends_at_the_timeout_however_many_silent_addresses(
    full_backlog_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeout bounds the connect as a whole: three silent addresses are not three
    timeouts."""
    silent = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", full_backlog_port))] * 3
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: silent)
    client = Client("http://many.invalid:8025", TOKEN, timeout=0.6, retries=0)
    started = time.monotonic()
    with pytest.raises(ConnectionLost) as lost:
        client.check("x")
    assert lost.value.sent is False
    assert time.monotonic() - started < 1.2


@pytest.mark.parametrize("server", ["closes", "speaks-plain-http", "never-answers"])
def test_a_tls_handshake_that_fails_sends_nothing(server: str) -> None:
    """A TLS handshake that fails (the server hangs up, is no TLS server, or never
    answers the hello) fails before the request's bytes are written: not sent, whatever
    the reason, not only a certificate refused."""

    def handle(conn: socket.socket) -> None:
        if server == "speaks-plain-http":
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        elif server == "never-answers":
            hold(1)

    address, got = _raw_server(handle)
    client = Client(f"https://{address}", TOKEN, timeout=0.4, retries=0)
    with pytest.raises(ConnectionLost) as lost:
        client.check("x")
    assert lost.value.sent is False and lost.value.may_have_applied is False
    assert got and all(b"/v1/review" not in data for data in got)  # a hello, never the request


def test_a_name_that_does_not_resolve_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    client = Client("http://api.invalid:8025", TOKEN, retries=0)
    with pytest.raises(ConnectionLost) as lost:
        client.triage()
    assert lost.value.sent is False and lost.value.may_have_applied is False


def test_a_connection_cut_after_the_request_left_is_sent() -> None:
    """The request was written, then the server hung up without an answer: it may have
    acted, so `sent` stays True and a resolve is not repeated."""
    address, got = _raw_server(lambda conn: None)  # reads the request, closes
    client = Client(f"http://{address}", TOKEN, timeout=2, retries=2, **NO_WAIT)
    with pytest.raises(ConnectionLost) as lost:
        client.resolve("x", "sent")
    assert lost.value.sent is True and lost.value.may_have_applied is True
    assert len(got) == 1 and got[0].startswith(b"POST /v1/review/x/resolve")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:99999",  # taken modulo 65536 by the socket: another port
        "http://127.0.0.1:80x",  # http.client's InvalidURL at the first call, no ClientError
        "http://127.0.0.1:8025/api v1",  # likewise
        "http://127.0.0.1:8025\n",  # failed in every attempt: "sent", may have applied
        "http://127.0.0.1:8025/caf\u00e9",  # likewise (UnicodeEncodeError)
    ],
)
def test_a_url_that_cannot_be_requested_as_written_is_refused_at_once(url: str) -> None:
    """A base URL the connection would reach elsewhere, or fail on in every attempt, is
    refused when the client is made, naming `url`: it was taken, then each call raised an
    exception that is no `ClientError`, or retried and reported the request sent."""
    with pytest.raises(ValueError, match=r"^url: "):
        Client(url, TOKEN)


def test_an_address_that_drops_the_tls_handshake_gives_way_to_the_next(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's name has two addresses: the first takes the connection and resets it
    in the TLS handshake (a middlebox on that address), the second is the API over TLS.
    The call is answered on the second within its one attempt; the first, connected first,
    was the only one tried (the handshake came after the race), so the call failed."""
    tls = make_loopback_tls(tmp_path)
    address, _got = _raw_server(_resets)
    reset_port = int(address.rsplit(":", 1)[1])
    with FaultRelay(api.url, tls=tls) as relay:
        port = int(relay.url.rsplit(":", 1)[1])
        _localhost_at(monkeypatch, reset_port, port)
        context = ssl.create_default_context(cafile=str(tls.ca_file))
        client = Client(
            f"https://localhost:{port}", TOKEN, timeout=3, retries=0, ssl_context=context
        )
        assert client.submit(job("tls-2"))["created"] is True
        assert relay.forwarded() == 1


def test_a_deadline_inside_the_tls_handshake_is_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name's lookup takes half the timeout and the one address never answers the
    TLS hello: the connect ends at the timeout, as a timeout, nothing sent. The handshake
    was given the whole timeout again once connected, so the connect took one and a half."""
    address, _got = _raw_server(lambda conn: hold(3))
    port = int(address.rsplit(":", 1)[1])
    info = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    def slow(host: str, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return info

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    context = ssl.create_default_context(cafile=str(make_loopback_tls(tmp_path).ca_file))
    client = Client(f"https://localhost:{port}", TOKEN, timeout=1, retries=0, ssl_context=context)
    started = time.monotonic()
    with pytest.raises(ConnectionLost) as lost:
        client.check("x")
    assert time.monotonic() - started < 1.3
    assert lost.value.sent is False and "timed out" in str(lost.value)


def _resets(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _localhost_at(monkeypatch: pytest.MonkeyPatch, *ports: int) -> None:
    """`localhost` (a name the test certificate has) resolving to 127.0.0.1 at `ports`."""
    real = socket.getaddrinfo
    info = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in ports]

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        return info if host == "localhost" else real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def _connect_proxy(delay: float = 0.0) -> tuple[int, list[bytes]]:
    """A loopback HTTP proxy that takes CONNECT only (`_raw_server`: one tunnel at a
    time): it answers 200 `delay` seconds after the request (a proxy far away, or busy),
    then pipes both ways; its port, and each request it read."""

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def tunnel(conn: socket.socket) -> None:
        host, _, port = seen[-1].split()[1].decode().rpartition(":")
        time.sleep(delay)
        with socket.create_connection((host, int(port)), timeout=5) as upstream:
            conn.sendall(b"HTTP/1.0 200 Connection established\r\n\r\n")
            back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
            back.start()
            pipe(conn, upstream)
            back.join(5)

    address, seen = _raw_server(tunnel)
    return int(address.rsplit(":", 1)[1]), seen


def _through_proxy(monkeypatch: pytest.MonkeyPatch, proxy: str) -> None:
    """`https_proxy` as a user sets it, read by the client's urllib when it is made."""
    for name in ("no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("https_proxy", proxy)


def test_through_a_proxy_the_tunnel_and_the_tls_handshake_share_the_one_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through an https proxy that answers the CONNECT after most of the timeout, to a
    server that never answers the TLS hello: the connect ends at the one timeout, as a
    timeout, nothing sent. The handshake was given the whole timeout again once the
    tunnel was up (the standard library's way), so it took one and three quarters."""
    address, got = _raw_server(lambda conn: hold(5))
    port = int(address.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(make_loopback_tls(tmp_path).ca_file))
    proxy_port, seen = _connect_proxy(delay=1.5)
    _through_proxy(monkeypatch, f"http://127.0.0.1:{proxy_port}")
    client = Client(f"https://localhost:{port}", TOKEN, timeout=2, retries=0,
                    ssl_context=context)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ConnectionLost) as lost:
        client.check("x")
    took = time.monotonic() - started
    assert seen and seen[0].startswith(f"CONNECT localhost:{port} HTTP/".encode())
    assert lost.value.sent is False and "timed out" in str(lost.value)
    assert took < 3.0, took
    assert all(b"/v1/review" not in data for data in got)  # a hello at most


def test_a_proxy_whose_first_address_is_silent_is_reached_on_the_next(
    api: Api, tmp_path: Path, full_backlog_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's name has a silent first address (a dead IPv6 route) and the proxy
    second: its addresses are raced as the server's are, and the call goes through the
    tunnel to the API over TLS within its timeout."""
    tls = make_loopback_tls(tmp_path)
    proxy_port, seen = _connect_proxy()
    with FaultRelay(api.url, tls=tls) as relay:
        real = socket.getaddrinfo
        proxy_at = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", full_backlog_port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", proxy_port)),
        ]

        def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
            return proxy_at if host == "proxy.invalid" else real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        _through_proxy(monkeypatch, f"http://proxy.invalid:{proxy_port}")
        port = int(relay.url.rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(tls.ca_file))
        client = Client(f"https://localhost:{port}", TOKEN, timeout=3, retries=0,
                        ssl_context=context)  # fmt: skip
        started = time.monotonic()
        assert client.submit(job("proxied-1"))["created"] is True
        assert time.monotonic() - started < 2.5
        assert relay.forwarded() == 1 and len(seen) == 1
