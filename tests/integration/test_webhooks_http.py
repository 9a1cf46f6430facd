"""One webhook POST against real sockets on 127.0.0.1 (docs/http-api.md "Webhooks"): only a 2xx
counts, a redirect is not followed, and the attempt ends at its timeout whether the
receiver never answers or drips its answer a byte at a time."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import ssl
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook
from tests.integration.listeners import hold, serving, stop_all, stop_listening
from tests.integration.resolving import outside_address, resolving
from tests.unit.test_webhooks import SECRET, Rig, drain

from daemon.doubles.fake_provider import Scripted
from daemon.webhooks.delivery import post
from daemon.webhooks.events import WEBHOOK_TYPES
from daemon.webhooks.worker import Deliverer, Hook
from testkit.tls import TlsFiles, make_loopback_tls

Handler = Callable[[socket.socket], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], str]]:
    """A one-connection-at-a-time server running `handler` on each accepted socket."""
    listeners: list[socket.socket] = []

    def start(handler: Handler) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def loop() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn, contextlib.suppress(OSError):
                    handler(conn)

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/hook"

    serving()
    yield start
    stop_all(listeners)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


def answer(status: str, body: bytes = b"", extra: str = "") -> Handler:
    def handler(conn: socket.socket) -> None:
        _read_request(conn)
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}"
        conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)

    return handler


HEADERS = {"webhook-id": "evt_1", "webhook-timestamp": "1", "webhook-signature": "v1,x"}


def test_a_2xx_is_delivered_and_carries_the_headers(serve: Callable[[Handler], str]) -> None:
    seen: list[bytes] = []

    def handler(conn: socket.socket) -> None:
        seen.append(_read_request(conn))
        conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    outcome = post(serve(handler) + "?x=1", b'{"a":1}', HEADERS, 2.0)
    assert outcome.ok and outcome.status == 204
    request = seen[0].decode()
    assert request.startswith("POST /hook?x=1 HTTP/1.1\r\n")
    assert "webhook-id: evt_1" in request and "Content-Type: application/json" in request
    assert request.endswith('{"a":1}')


def test_an_error_status_fails_with_its_body_made_printable(
    serve: Callable[[Handler], str],
) -> None:
    outcome = post(serve(answer("503 Busy", b"down \x1b[31m" + b"x" * 1000)), b"{}", HEADERS, 2.0)
    assert not outcome.ok and outcome.status == 503
    assert outcome.error.startswith("HTTP 503: down \\x1b[31m") and len(outcome.error) < 260


def test_a_redirect_is_a_failure_and_is_not_followed(serve: Callable[[Handler], str]) -> None:
    followed: list[bytes] = []
    target = serve(lambda conn: followed.append(_read_request(conn)))
    outcome = post(serve(answer("307 Moved", extra=f"Location: {target}\r\n")), b"{}", HEADERS, 2.0)
    assert not outcome.ok and outcome.status == 307
    time.sleep(0.2)
    assert followed == []


def test_a_receiver_that_never_answers_times_out(serve: Callable[[Handler], str]) -> None:

    def never_answers(conn: socket.socket) -> None:
        _read_request(conn)
        hold(5)

    url = serve(never_answers)
    started = time.monotonic()
    outcome = post(url, b"{}", HEADERS, 0.5)
    assert not outcome.ok and outcome.error == "no answer within 0.5s"
    assert time.monotonic() - started < 2


def test_a_receiver_dripping_its_answer_is_cut_at_the_timeout(
    serve: Callable[[Handler], str],
) -> None:
    def drip(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(50):  # a header byte every 0.1 s: no single read ever times out
            conn.sendall(b"X")
            time.sleep(0.1)

    started = time.monotonic()
    outcome = post(serve(drip), b"{}", HEADERS, 0.6)
    assert not outcome.ok and outcome.error == "no answer within 0.6s"
    assert time.monotonic() - started < 2


def test_no_listener_is_a_failure_naming_the_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    outcome = post(f"http://127.0.0.1:{port}/", b"{}", HEADERS, 1.0)
    assert not outcome.ok and outcome.status is None
    assert "ConnectionRefusedError" in outcome.error


@pytest.fixture
def two_addresses(monkeypatch: pytest.MonkeyPatch, full_backlog_port: int) -> Callable[[str], str]:
    """A host name whose first address never completes a connection (a full backlog:
    the SYN is dropped, as by a broken IPv6 route) and whose second is `url`'s server."""
    real = socket.getaddrinfo

    def point(url: str) -> str:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        addresses = [("127.0.0.1", full_backlog_port), ("127.0.0.1", port)]

        def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
            if host == "dual.invalid":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", a) for a in addresses]
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return url.replace("127.0.0.1", "dual.invalid")

    return point


def test_a_silent_first_address_gives_way_to_the_next_after_a_short_delay(
    serve: Callable[[Handler], str], two_addresses: Callable[[str], str]
) -> None:
    """A host whose first address never answers (a dead IPv6 route) and whose second
    does: the addresses are raced as happy eyeballs do, the second starting a quarter of
    a second after the first, so the event is delivered. Each address in turn got the
    time left, so the first used the whole timeout and the host was never delivered to."""
    url = two_addresses(serve(answer("204 No Content")))
    started = time.monotonic()
    outcome = post(url, b"{}", HEADERS, 5.0)
    assert outcome.ok and outcome.status == 204, outcome
    assert time.monotonic() - started < 2.0


def test_an_attempt_past_a_silent_address_is_still_bounded_by_its_timeout(
    serve: Callable[[Handler], str], two_addresses: Callable[[str], str]
) -> None:
    """The race is inside the attempt's one deadline: the second address, reached after
    the first stayed silent, drips its answer, and the attempt still ends at its
    timeout, having sent the request once."""
    got: list[bytes] = []

    def drip(conn: socket.socket) -> None:
        got.append(_read_request(conn))
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(30):
            conn.sendall(b"X")
            time.sleep(0.1)

    url = two_addresses(serve(drip))
    started = time.monotonic()
    outcome = post(url, b"{}", HEADERS, 0.8)
    assert time.monotonic() - started < 1.8
    assert not outcome.ok and outcome.error == "no answer within 0.8s"
    assert len(got) == 1


def test_a_2xx_counts_even_if_its_body_never_ends(serve: Callable[[Handler], str]) -> None:
    """The status decides: a receiver that took the event and answered 200 without a
    length, then kept the connection open, has the event; calling that a failure would
    resend it on every retry and hold back every later event."""

    def keeps_open(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nok")
        hold(2)

    started = time.monotonic()
    outcome = post(serve(keeps_open), b"{}", HEADERS, 0.5)
    assert outcome.ok and outcome.status == 200
    assert time.monotonic() - started < 1.5


def test_what_is_signed_is_the_bytes_on_the_wire_as_the_reference_library_reads_them(
    serve: Callable[[Handler], str],
) -> None:
    """A whole delivery, from the log to a socket: the receiver verifies the raw body and
    headers it read with `standardwebhooks` (its own clock, its own parsing), and a
    provider's hostile words (controls, an escape sequence, U+2028, an emoji, a BOM, quotes
    and a backslash) arrive as the JSON string that was stored."""
    said = 'no \x00\x1b[31m \u2028\u2029 \U0001f600 caf\u00e9 \x7f \ufeff "q" \\'
    got: list[tuple[dict[str, str], bytes]] = []

    def receive(conn: socket.socket) -> None:
        head, _, body = _read_request(conn).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")[1:]
        got.append(({k.strip(): v.strip() for k, _, v in (x.partition(":") for x in lines)}, body))
        conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    rig = Rig()
    try:
        rig.provider.script(Scripted.rejected(transient=False, reason=said))
        rig.submit("receipts", "hostile")
        rig.tick()
        hook = Hook("ops", serve(receive), SECRET, frozenset(WEBHOOK_TYPES), timeout=2.0)
        drain(Deliverer(rig.ledger, hook, owner="a", clock=time.time))
    finally:
        rig.close()
    assert got
    verified = [Webhook(SECRET).verify(body, headers) for headers, body in got]
    assert [p["event_id"] for p in verified] == [h["webhook-id"] for h, _ in got]
    [rejected] = [p for p in verified if p["type"] == "rejected"]
    # As recorded: NUL, which no store keeps in text, is U+FFFD (ledger.characters.storable).
    assert rejected["detail"] == said.replace("\x00", "\ufffd")


def test_a_certificate_nobody_trusts_is_a_failure_that_says_so(tmp_path: Path) -> None:
    tls = make_loopback_tls(tmp_path)  # its CA is in no trust store
    context = tls.server_context()
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def loop() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            # The handshake inside `with`: one failed in `wrap_socket` leaves its socket to
            # the collector, which closes it in whichever test is running then.
            wrapped = context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            with contextlib.suppress(OSError), wrapped as s:
                s.do_handshake()
                got.append(s.recv(65536))

    threading.Thread(target=loop, daemon=True).start()
    try:
        port = listener.getsockname()[1]
        outcome = post(f"https://127.0.0.1:{port}/hook", b'{"a":1}', HEADERS, 2.0)
    finally:
        stop_listening(listener)
    assert not outcome.ok and outcome.status is None
    assert outcome.error.startswith("SSLCertVerificationError: ")
    assert "certificate verify failed" in outcome.error and got == []


@contextlib.contextmanager
def black_holes(hosts: list[str]) -> Iterator[list[tuple[str, int]]]:
    """A loopback listener per host whose listen queue is full: a SYN to it gets no
    answer and connect() waits (as `full_backlog_port`, tests/conftest.py)."""
    opened: list[socket.socket] = []
    addresses: list[tuple[str, int]] = []
    try:
        for host in hosts:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            server = socket.socket(family, socket.SOCK_STREAM)
            opened.append(server)
            server.bind((host, 0))
            server.listen(0)
            port = server.getsockname()[1]
            for _ in range(4):
                probe = socket.socket(family, socket.SOCK_STREAM)
                probe.settimeout(0.2)
                opened.append(probe)
                try:
                    probe.connect((host, port))
                except TimeoutError:
                    break
            else:
                pytest.skip("this kernel accepts connections beyond the listen backlog")
            addresses.append((host, port))
        yield addresses
    finally:
        for sock in opened:
            sock.close()


def test_an_attempt_over_several_silent_addresses_ends_at_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host with several addresses that never answer (a broken route, a firewall that
    drops): the timeout is the whole attempt's, not each address's, so three addresses
    do not make it three timeouts (a webhook thread held that long, and a lease of
    3 x timeout outlived by one attempt)."""
    with black_holes(["127.0.0.1", "127.0.0.2", "::1"]) as addresses:
        infos = [
            (socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, 6, "",
             (host, port) if ":" not in host else (host, port, 0, 0))
            for host, port in addresses
        ]  # fmt: skip
        resolving(monkeypatch, "many.invalid", lambda: infos)
        started = time.monotonic()
        outcome = post("http://many.invalid:8080/hook", b"{}", HEADERS, 0.6)
        took = time.monotonic() - started
    assert not outcome.ok and outcome.error == "no answer within 0.6s"
    assert took < 1.1


def test_a_resolver_that_never_answers_ends_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The name's lookup is part of the attempt: a resolver that hangs (a DNS server
    that drops queries) ends the attempt at its timeout, not at the resolver's."""
    release = threading.Event()

    def hang() -> Any:
        release.wait(10)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    resolving(monkeypatch, "slow.invalid", hang)
    started = time.monotonic()
    try:
        outcome = post("http://slow.invalid:8080/hook", b"{}", HEADERS, 0.5)
    finally:
        took = time.monotonic() - started
        release.set()
    assert not outcome.ok and outcome.status is None
    assert outcome.error == "no answer within 0.5s"
    assert took < 1.0


def test_a_name_that_does_not_resolve_is_a_failure_naming_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail() -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    resolving(monkeypatch, "nowhere.invalid", fail)
    outcome = post("http://nowhere.invalid:8080/hook", b"{}", HEADERS, 2.0)
    assert not outcome.ok and outcome.status is None
    assert outcome.error.startswith("gaierror: ") and "not known" in outcome.error


def test_localhost_is_reached_on_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`http://localhost` is accepted without `allow_http` as loopback, checked on the
    name as written; the name is then resolved, and a resolver that answers another
    address (no `localhost` line in /etc/hosts, a DNS search domain that has one) would
    get the payload in clear text. Only a loopback address of it is connected to."""
    outside = outside_address()
    listener = socket.create_server((outside, 0))
    got: list[bytes] = []

    def loop() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                got.append(_read_request(conn))
                conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    threading.Thread(target=loop, daemon=True).start()
    port = listener.getsockname()[1]
    info = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (outside, port))]
    resolving(monkeypatch, "localhost", lambda: info)
    try:
        outcome = post(f"http://localhost:{port}/hook", b"{}", HEADERS, 1.0)
    finally:
        stop_listening(listener)
    assert not outcome.ok and outcome.status is None
    assert "loopback" in outcome.error and got == []


def test_localhost_races_its_loopback_addresses_only(
    monkeypatch: pytest.MonkeyPatch, serve: Callable[[Handler], str]
) -> None:
    """The race takes only `localhost`'s loopback addresses: an outside one answered
    first by the resolver is never connected to, the loopback one is delivered to."""
    url = serve(answer("204 No Content"))
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    outside = outside_address()
    listener = socket.create_server((outside, port))
    touched: list[bool] = []

    def loop() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            touched.append(True)
            conn.close()

    threading.Thread(target=loop, daemon=True).start()
    info = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (outside, port)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
    ]
    resolving(monkeypatch, "localhost", lambda: info)
    try:
        outcome = post(f"http://localhost:{port}/hook", b"{}", HEADERS, 2.0)
        time.sleep(0.1)
    finally:
        stop_listening(listener)
    assert outcome.ok and touched == []


def test_a_stop_gives_the_lease_up_while_an_attempt_is_in_flight(
    serve: Callable[[Handler], str],
) -> None:
    """The receiver answers after the daemon's wait for its threads (`stop`): the lease
    was released only by the thread once its attempt ended, which a stopping daemon does
    not wait for, so another daemon waited for the lease to run out (60 s to 15 min). It
    is given up at the stop, and the attempt that ends afterwards writes nothing (its
    event goes out again from the next daemon: at least once)."""
    from daemon.webhooks.delivery_threads import WebhookThreads

    got, answer_now = threading.Event(), threading.Event()

    def slow(conn: socket.socket) -> None:
        _read_request(conn)
        got.set()
        answer_now.wait(10)
        conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    url = serve(slow)
    rig = Rig()
    try:
        rig.confirmed("k-1")
        hook = Hook("ops", url, SECRET, frozenset(WEBHOOK_TYPES), timeout=10.0)
        threads = WebhookThreads(rig.ledger, [hook], owner="a", poll=0.05).start()
        assert got.wait(10), "the POST never came"
        threads.stop(lock_wait=0.2)  # the attempt still in flight
        [row] = rig.ledger.positions().read_all()
        assert row.lease_until == 0.0, "the lease was kept by the attempt in flight"
        answer_now.set()
        threads.stop(lock_wait=10)  # the attempt ends: nothing more is written
        [after] = rig.ledger.positions().read_all()
        assert (after.lease_until, after.position) == (0.0, row.position)
    finally:
        answer_now.set()
        rig.close()


def test_a_refused_address_frees_its_turn_at_once() -> None:
    """An address that refuses at once (nothing listening) does not hold the next one
    for the delay: the next starts then, whatever the delay."""
    from sendledger.connecting import race

    with socket.create_server(("127.0.0.1", 0)) as probe:
        closed = probe.getsockname()[1]
    with socket.create_server(("127.0.0.1", 0)) as live:
        found = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", closed)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", closed)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", live.getsockname()),
        ]
        started = time.monotonic()
        sock = race(found, time.monotonic() + 30.0, delay=10.0)
        with sock:
            assert sock.getpeername() == live.getsockname()
        assert time.monotonic() - started < 3.0
        with pytest.raises(ConnectionRefusedError):
            race(found[:2], time.monotonic() + 30.0, delay=10.0)


def test_the_addresses_not_taken_are_closed(full_backlog_port: int) -> None:
    """The silent address still connecting when another won is closed, not left to
    finish its handshake later as a connection nobody uses."""
    from sendledger.connecting import race

    with socket.create_server(("127.0.0.1", 0)) as live:
        found = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", full_backlog_port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", live.getsockname()),
        ]
        before = _open_files()
        with race(found, time.monotonic() + 5.0, delay=0.05) as sock:
            assert sock.getpeername() == live.getsockname()
            assert len(_open_files() - before) == 1  # the winner only
        assert not _open_files() - before


def _open_files() -> set[tuple[int, str]]:
    """This process's open descriptors with what each is: compared as sets, a file that an
    earlier test's thread closes meanwhile does not count as one this test closed."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            found.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
    return found


def _connected_to(ports: Sequence[int]) -> int:
    """How many of this process's sockets are connected to one of `ports` (a client's
    end: a server's accepted ones are connected from an ephemeral port)."""
    count = 0
    for fd, what in _open_files():
        if not what.startswith("socket:"):
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # a server's end, closed by its thread since the listing
        try:
            # Only the internet sockets: a Unix one (a store's or the test runner's
            # connection) names its peer by a path, not (host, port).
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    count += sock.getpeername()[1] in ports
        finally:
            sock.detach()
    return count


def _hangs_up(how: str) -> Handler:
    """A listener that takes the connection and drops it in the TLS handshake (a
    middlebox on one address): closed, or reset (no lingering: an RST)."""

    def handler(conn: socket.socket) -> None:
        if how == "resets":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    return handler


def _tls(tls: TlsFiles, then: Handler) -> Handler:
    """`then` behind a TLS handshake with `tls`'s certificate (localhost, 127.0.0.1)."""
    context = tls.server_context()

    def handler(conn: socket.socket) -> None:
        conn.settimeout(5)
        # The handshake inside `with` (see test_a_certificate_nobody_trusts_...).
        with context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False) as wrapped:
            wrapped.do_handshake()
            then(wrapped)

    return handler


@pytest.fixture
def trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TlsFiles:
    """A throw-away CA the webhooks trust (the default context reads SSL_CERT_FILE)."""
    tls = make_loopback_tls(tmp_path / "trusted")
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca_file))
    return tls


def _localhost_at(monkeypatch: pytest.MonkeyPatch, *urls: str) -> str:
    """`localhost` (a name the certificate has) resolving to each of `urls`' listeners, in
    order; the https URL of the first's path on it."""
    ports = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in urls]
    info = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in ports]
    resolving(monkeypatch, "localhost", lambda: info)
    return f"https://localhost:{ports[0]}/hook"


@pytest.mark.parametrize("how", ["closes", "resets", "is silent"])
def test_an_address_that_fails_the_tls_handshake_gives_way_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Handler], str],
    trusted: TlsFiles,
    how: str,
) -> None:
    """A host whose first address takes the connection and then drops it in the TLS
    handshake, or never answers the hello (a middlebox on that address), and whose second
    serves TLS: the event is delivered on the second, in the one attempt, a silent
    handshake holding it a delay as a silent connect does. The first address had
    connected, so it won the race and its handshake failure ended the attempt
    (ConnectionResetError or SSLEOFError, every retry alike), or its silence the timeout."""
    first = serve(lambda conn: hold(3)) if how == "is silent" else serve(_hangs_up(how))
    url = _localhost_at(monkeypatch, first, serve(_tls(trusted, answer("204 No Content"))))
    started = time.monotonic()
    outcome = post(url, b"{}", HEADERS, 2.5)
    assert outcome.ok and outcome.status == 204, outcome
    assert time.monotonic() - started < 1.5


def test_a_certificate_refused_on_one_address_lets_the_next_try(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Handler], str],
    trusted: TlsFiles,
    tmp_path: Path,
) -> None:
    """Every address must show a certificate valid for the name, so one that does not
    (another CA's) is that address failing: the next one that verifies gets the event."""
    stranger = make_loopback_tls(tmp_path / "stranger")
    url = _localhost_at(
        monkeypatch,
        serve(_tls(stranger, answer("204 No Content"))),
        serve(_tls(trusted, answer("204 No Content"))),
    )
    outcome = post(url, b"{}", HEADERS, 5.0)
    assert outcome.ok and outcome.status == 204, outcome


@pytest.mark.parametrize("refused_first", [True, False])
def test_when_every_address_fails_the_certificate_refusal_is_the_reason(
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Handler], str],
    trusted: TlsFiles,
    tmp_path: Path,
    refused_first: bool,
) -> None:
    """One address refuses the certificate, the other hangs up in the handshake: the
    reason given is the certificate, whichever came first (the address that got
    furthest), not the hang-up that happened to be last."""
    stranger = serve(_tls(make_loopback_tls(tmp_path / "stranger"), answer("204 No Content")))
    hangs_up = serve(_hangs_up("resets"))
    order = (stranger, hangs_up) if refused_first else (hangs_up, stranger)
    outcome = post(_localhost_at(monkeypatch, *order), b"{}", HEADERS, 5.0)
    assert not outcome.ok and outcome.status is None
    assert outcome.error.startswith("SSLCertVerificationError: "), outcome


def test_a_deadline_inside_the_tls_handshake_is_a_timeout(
    monkeypatch: pytest.MonkeyPatch, serve: Callable[[Handler], str], trusted: TlsFiles
) -> None:
    """The only address connects and never answers the hello: the attempt ends at its
    timeout and says so, as any attempt out of time."""
    url = _localhost_at(monkeypatch, serve(lambda conn: hold(3)))
    started = time.monotonic()
    outcome = post(url, b"{}", HEADERS, 0.5)
    assert not outcome.ok and outcome.error == "no answer within 0.5s", outcome
    assert time.monotonic() - started < 1.0


def test_two_hundred_raced_tls_connects_leave_no_socket_open(
    serve: Callable[[Handler], str], trusted: TlsFiles
) -> None:
    """Each race opens a socket to a listener that hangs up in the handshake and one to
    a TLS server: while the winner is open it is the only socket of ours to either, and
    after 200 races none is left (every loser closed, every winner once closed)."""
    from sendledger.connecting import race

    ports = [
        int(url.rsplit(":", 1)[1].split("/")[0])
        for url in (serve(_hangs_up("resets")), serve(_tls(trusted, lambda conn: None)))
    ]
    found = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in ports]
    context = ssl.create_default_context(cafile=str(trusted.ca_file))
    for _ in range(200):
        with race(found, time.monotonic() + 5.0, tls=context, server_hostname="localhost") as sock:
            assert sock.getpeername()[1] == ports[1]
            assert _connected_to(ports) == 1  # the winner only
    assert _connected_to(ports) == 0


class _SlowToWrap(ssl.SSLContext):
    """A client context whose `wrap_socket` of a connected socket first lets the peer
    reset it (a loaded machine, a middlebox on that address): `peer_reset` is set, and
    `reset` awaited, before the standard library wraps it."""

    peer_reset: threading.Event
    reset: threading.Event

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        with contextlib.suppress(OSError):
            sock.getpeername()  # connected: the reset lands between its checks and the wrap
            self.peer_reset.set()
            self.reset.wait(2)
        return super().wrap_socket(sock, *args, **kwargs)


def test_an_address_reset_while_its_tls_is_set_up_leaves_no_socket_to_the_collector(
    trusted: TlsFiles,
) -> None:
    """The only address takes the connection and resets it just as TLS is set up on it
    (after the connect was seen, before the wrap): the race fails with that address's
    error and closes every socket it made. The standard library's `wrap_socket` of a
    connected socket whose peer reset it raised with the socket it had made still open,
    left to the collector (an unclosed `SSLSocket` ResourceWarning, its descriptor open
    until then); the sockets are wrapped before they connect now."""
    from sendledger.connecting import race

    context = _SlowToWrap(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(trusted.ca_file))
    context.peer_reset, context.reset = threading.Event(), threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def loop() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            context.peer_reset.wait(0.5)  # set only by a wrap of a connected socket
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            context.reset.set()

    threading.Thread(target=loop, daemon=True).start()
    found = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", listener.getsockname())]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(OSError):
                race(found, time.monotonic() + 5.0, tls=context, server_hostname="localhost")

    finally:
        stop_listening(listener)
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


def test_a_bound_source_address_is_raced_too(
    monkeypatch: pytest.MonkeyPatch, full_backlog_port: int
) -> None:
    """`create_connection` with a `source_address` (what `http.client` passes when one
    is set): each attempt is bound to it and the addresses are raced, so a silent first
    address gives way to the next after a delay. It went to the standard library's
    `socket.create_connection`, which gave the silent first address the whole timeout."""
    from sendledger.connecting import create_connection

    with socket.create_server(("127.0.0.1", 0)) as live:
        infos = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", full_backlog_port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", live.getsockname()),
        ]
        resolving(monkeypatch, "dual.invalid", lambda: infos)
        started = time.monotonic()
        with create_connection(("dual.invalid", 80), 3.0, ("127.0.0.2", 0)) as sock:
            took = time.monotonic() - started
            assert sock.getpeername() == live.getsockname()
            assert sock.getsockname()[0] == "127.0.0.2" and sock.gettimeout() == 3.0
    assert took < 2.0, took


def test_a_delivery_past_a_failed_address_closes_its_socket_when_it_returns(
    monkeypatch: pytest.MonkeyPatch, serve: Callable[[Handler], str], trusted: TlsFiles
) -> None:
    """The first address hangs up in the TLS handshake, the second takes the event:
    once `post` returns, no socket of ours to either is open, without waiting for the
    garbage collector. The race kept each failed address's error, whose traceback held
    the race's frame (and through it the winner and the delivery's response): a cycle
    only the collector broke, which then closed the winner's socket unclosed (a
    ResourceWarning under -W error::ResourceWarning), its descriptor open until then."""
    urls = [serve(_hangs_up("closes")), serve(_tls(trusted, answer("204 No Content")))]
    ports = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in urls]
    url = _localhost_at(monkeypatch, *urls)
    enabled = gc.isenabled()
    gc.disable()
    try:
        outcome = post(url, b"{}", HEADERS, 5.0)
        assert outcome.ok, outcome
        assert _connected_to(ports) == 0
    finally:
        gc.collect()
        if enabled:
            gc.enable()
