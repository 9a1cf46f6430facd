"""A send made of many answers, each awaited within `timeout`, ends within its claim's
lease as last written (docs/architecture.md "Leases"): a server answering each SMTP
command just under `timeout` held a send (greeting, EHLO, AUTH, MAIL, a RCPT per
recipient, DATA, the final '.') many `timeout`s, measured 7.3 of them for one recipient
and 15.4 for ten, while its lease is `timeout` + `deadline_grace`: once the renewals stop
landing (the store lost), another daemon recovered the claim as Unknown and searched it
while the call went on. The lease's end as last written is what the wire bounds each wait
by (`providers.base.call_time_left`); renewals that land move it on."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from io import BufferedReader
from pathlib import Path
from typing import Any, cast

import pytest
from tests.unit.early_server import AnsweringServer
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.smtp_loopback import Message, converse, message_of_lines, submit_timed
from tests.unit.test_imap_append_hang import _smtp
from tests.unit.test_leases import finish, slow_send

from daemon.engine.leases import Leases
from daemon.providers.base import call_time_left, calls_end_in
from daemon.providers.early_answers import AnswerTooLong, EarlyAnswer
from daemon.providers.kept import MailEndpoint
from daemon.providers.outcomes import SendKind
from daemon.providers.slow_links import PIECE
from ledger.job import SendJob
from testkit.tls import TlsFiles, make_loopback_tls

LEASE = TIMEOUT + GRACE
#: The SMTP client's timeout here, and how long the server takes over each reply.
WAIT = 0.3
LAG = WAIT * 0.9


class _ToMany(Message):
    """A message to ten recipients: a RCPT each."""

    @property
    def recipients(self) -> list[str]:
        return [f"to{n}@example.net" for n in range(10)]


class _Lagging:
    """A server's socket whose every reply is written `LAG` after it is ready."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def sendall(self, data: bytes) -> None:
        time.sleep(LAG)
        self.conn.sendall(data)


def _slow_each(conn: socket.socket, reader: BufferedReader) -> None:
    """An SMTP server that answers every command, and the greeting, `LAG` after it."""
    _smtp(cast(socket.socket, _Lagging(conn)), reader)


@pytest.fixture
def endpoint() -> Iterator[MailEndpoint]:
    server = AnsweringServer(_slow_each)
    context = ssl.create_default_context()
    yield MailEndpoint("127.0.0.1", server.port, "none", "u", "p", WAIT, context)
    server.close()


def _message() -> _ToMany:
    lines = message_of_lines(2, "<lease-1@mail.example.com>")
    return _ToMany(lines.data, lines.message_id)


def test_a_send_whose_lease_stops_moving_ends_by_it(endpoint: MailEndpoint) -> None:
    """Before: 15 waits of almost `timeout` each, 4 s here, the lease long gone."""
    ends = time.monotonic() + 3 * WAIT
    with calls_end_in(lambda: ends - time.monotonic()):
        outcome, took = submit_timed(endpoint, _message())
    assert took < 3 * WAIT + 0.5, f"{took:.2f}s"
    # Cut among the RCPTs, before any content: not sent, a hang for the circuit.
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert outcome.timed_out, outcome


def _slow_reader(server: AnsweringServer, conn: socket.socket, reader: BufferedReader) -> None:
    """An SMTP server that takes the content a piece per 0.6 `timeout` (until the test
    ends), and answers at once."""

    def on_data() -> bool:
        conn.sendall(b"354 go on\r\n")
        taken = 0
        while (piece := reader.read1(PIECE)) and not piece.endswith(b"\r\n.\r\n"):
            taken += len(piece)
            if taken >= PIECE:
                taken = 0
                if server._done.wait(WAIT * 0.6):
                    return False
        conn.sendall(b"250 queued\r\n")
        return True

    converse(conn, reader, on_data)


def test_an_upload_whose_lease_stops_moving_ends_by_it() -> None:
    """A message of 2 MB taken a piece per 0.6 `timeout`: before, its upload went on
    while its bytes moved, 6 s here, the lease long gone."""
    server = AnsweringServer(lambda conn, reader: _slow_reader(server, conn, reader))
    context = ssl.create_default_context()
    endpoint = MailEndpoint("127.0.0.1", server.port, "none", "u", "p", WAIT, context)
    ends = time.monotonic() + 3 * WAIT
    try:
        with calls_end_in(lambda: ends - time.monotonic()):
            outcome, took = submit_timed(endpoint, message_of_lines(2000))
    finally:
        server.close()
    assert took < 3 * WAIT + 0.5, f"{took:.2f}s"
    # Cut while the content waited to leave this host, its final '.' queued: Unknown.
    assert outcome.kind is SendKind.UNKNOWN and outcome.timed_out, outcome


@pytest.mark.parametrize("lease", ["ends", "keeps moving"])
def test_a_write_the_server_does_not_take_ends_with_the_lease_not_with_its_timeout(
    lease: str,
) -> None:
    """A write waits its socket's `timeout` (1 s here) for the server to take a byte:
    before, a lease that had ended did not end it. One that keeps moving (renewals
    landing) is waited on: the server takes the bytes after 0.4 s, and the write ends."""
    ours, theirs = socket.socketpair()
    ours.settimeout(1.0)
    ends = time.monotonic() + 0.2
    seconds_left = (lambda: ends - time.monotonic()) if lease == "ends" else (lambda: 0.1)
    data = b"x" * (8 << 20)

    def take() -> None:
        time.sleep(0.4)
        while theirs.recv(1 << 20):
            pass

    taker = threading.Thread(target=take, daemon=True)
    if lease == "keeps moving":
        taker.start()
    started = time.monotonic()
    try:
        with calls_end_in(seconds_left):
            if lease == "ends":
                with pytest.raises(TimeoutError, match="lease"):
                    EarlyAnswer(ours).sendall(data)
            else:
                EarlyAnswer(ours).sendall(data)
        took = time.monotonic() - started
    finally:
        ours.close()
        if taker.is_alive():
            taker.join(5)
        theirs.close()
    assert took < 0.6 if lease == "ends" else took > 0.3, f"{took:.2f}s"


def test_a_send_whose_lease_keeps_moving_goes_on_however_slow(endpoint: MailEndpoint) -> None:
    """Renewals that land keep less than one wait's `timeout` ahead of the call at all
    times: each wait outlives the lease as it was when the wait began, and none is cut."""
    with calls_end_in(lambda: 0.5 * WAIT):
        outcome, took = submit_timed(endpoint, _message())
    assert outcome.kind is SendKind.CONFIRMED, outcome
    assert took > 10 * LAG  # it was slow: no wait was cut short


def test_the_engine_bounds_a_send_by_its_lease_as_last_written() -> None:
    """What the call is told it has left: the deadline of the renewal that landed, not
    of one that could not, less the grace the recovering daemon's clock may be off by."""
    rig = EngineRig(policy("legal", on_unknown="review"))
    try:
        seen: list[float | None] = []
        rig.provider.during_send = lambda: seen.append(call_time_left())
        release = slow_send(rig, "k1")
        rig.clock.advance(LEASE / 2)
        rig.engine.renew_leases()  # lands: the deadline is now LEASE from here
        rig.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]  # store lost
        rig.clock.advance(LEASE / 2)
        finish(rig, release)
    finally:
        rig.close()
    assert seen == [pytest.approx(LEASE / 2 - GRACE)]


def test_a_slow_call_whose_renewals_land_is_never_told_its_lease_ended() -> None:
    """With a grace over twice the timeout (Graph's defaults: 10 s and 30 s, the grace
    covering a send of several requests plus `confirm_wait`), the call's bound, the lease
    less the grace, is one `timeout` from each renewal: renewed every third of the lease
    (13.3 s there), it ran out before each renewal was due, a call answering well within
    each wait's timeout cut at 10 s. The renewals come before it now."""
    rig = EngineRig(policy("legal", on_unknown="review"))
    timeout, grace = TIMEOUT, 3 * TIMEOUT
    daemon = rig.settings.daemon.model_copy(update={"deadline_grace": grace})
    rig.settings = rig.settings.model_copy(update={"daemon": daemon})
    rig.service = rig.new_service()
    rig.engine = rig.service.engine
    release = slow_send(rig, "k1")
    try:
        lease = rig.engine.leases.lease("k1")
        assert lease is not None
        least = timeout
        for _ in range(int(3 * (timeout + grace) / 0.5)):  # three leases, renewals landing
            rig.clock.advance(0.5)
            rig.engine.renew_leases()
            # What the engine tells the call it has left (`Dispatch.send`'s bound).
            least = min(least, rig.engine.leases.time_left(lease))
    finally:
        finish(rig, release)
        rig.close()
    assert least > 0, f"told {least:.2f}s left while its renewals landed"


def _rig_with_grace(grace: float) -> EngineRig:
    rig = EngineRig(policy("legal", on_unknown="review"))
    daemon = rig.settings.daemon.model_copy(update={"deadline_grace": grace})
    rig.settings = rig.settings.model_copy(update={"daemon": daemon})
    rig.engine.close()
    rig.service = rig.new_service()
    rig.engine = rig.service.engine
    return rig


class _SlowSaves:
    """The store on a stalled disk: each renewal's save takes `seconds` of the rig's time
    before it commits; what the call is told it has left is noted right before each."""

    def __init__(self, rig: EngineRig, key: str, seconds: float) -> None:
        self._rig = rig
        self._key = key
        self._seconds = seconds
        self.told: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rig.ledger, name)

    def save_job(self, job: SendJob, **kwargs: Any) -> None:
        self._rig.clock.advance(self._seconds)
        lease = self._rig.engine.leases.lease(self._key)
        assert lease is not None
        self.told.append(self._rig.engine.leases.time_left(lease))
        self._rig.ledger.save_job(job, **kwargs)


def test_a_renewal_whose_save_takes_half_a_timeout_lands_before_the_call_is_cut() -> None:
    """The CI's red run of tests/e2e/test_races.py: timeout 0.5 s, grace 0.5 s, renewals
    every two thirds of a timeout, so one whose look and save took more than a third of
    a timeout (~170 ms: a stalled fsync) came after the call's bound, and a healthy call
    ended Unknown ("timed out: its claim's lease ends"). Renewed every third of a timeout,
    a renewal has two thirds of it to land."""
    timeout = TIMEOUT
    rig = _rig_with_grace(timeout)  # the grace of the e2e test: one timeout
    release = slow_send(rig, "k1")
    slow = _SlowSaves(rig, "k1", 0.45 * timeout)
    rig.engine.leases._ledger = slow  # type: ignore[assignment]
    try:
        for _ in range(int(4 * timeout / (0.05 * timeout))):  # the renewer's looks
            rig.clock.advance(0.05 * timeout)
            rig.engine.renew_leases()
        lease = rig.engine.leases.lease("k1")
        assert lease is not None
        left = rig.engine.leases.time_left(lease)
    finally:
        finish(rig, release)
        rig.close()
    assert len(slow.told) >= 3, slow.told  # renewals landed all along the call
    assert min(slow.told) > 0, f"told {min(slow.told):.2f}s left as a renewal landed"
    assert left > 0
    assert rig.events("k1")[-1] == "Confirmed"


def test_a_clock_stepped_forward_does_not_cut_a_call_no_time_reached() -> None:
    """The wall clock set forward a whole lease (an NTP step) while a call runs: no time
    passed, another daemon's clock did not move, and the claim's deadline as written is
    as far off as it was. The call's bound is counted in monotonic seconds: it is not cut
    before its next renewal could land."""
    rig = EngineRig(policy("legal", on_unknown="review"))
    release = slow_send(rig, "k1")
    try:
        lease = rig.engine.leases.lease("k1")
        assert lease is not None
        before = rig.engine.leases.time_left(lease)
        rig.clock.jump(LEASE)
        after = rig.engine.leases.time_left(lease)
    finally:
        finish(rig, release)
        rig.close()
    assert before == pytest.approx(TIMEOUT)
    assert after == pytest.approx(before)


class _TlsServer:
    """The server's end of a TLS connection on `conn`, its records' bytes written by the
    test as it likes (a record trickled in pieces)."""

    def __init__(self, conn: socket.socket, tls: TlsFiles) -> None:
        context = tls.server_context()
        context.maximum_version = ssl.TLSVersion.TLSv1_2  # no session tickets after it
        self.conn = conn
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                self.conn.sendall(self.outgoing.read())
                self.incoming.write(self.conn.recv(1 << 16))
                continue
            self.conn.sendall(self.outgoing.read())
            return

    def record(self, data: bytes) -> bytes:
        self.tls.write(data)
        return self.outgoing.read()


@pytest.mark.parametrize("lease", ["ends", "keeps moving"])
def test_a_tls_record_trickled_in_pieces_is_waited_for_within_the_lease(
    lease: str, tmp_path: Path
) -> None:
    """Half of the answer's TLS record arrives at once, the rest 0.8 s later: the socket
    was readable, the lease's wait ended, and the read then waited for the record's rest
    its own timeout (2 s), past the lease's end (0.2 s): a call the lease had cut went on.
    The wait now goes on until a record is whole, within the lease; a lease that keeps
    moving gets the answer."""
    tls = make_loopback_tls(tmp_path)
    ours, theirs = socket.socketpair()
    server = _TlsServer(theirs, tls)
    shaking = threading.Thread(target=server.handshake, daemon=True)
    shaking.start()
    client_context = ssl.create_default_context(cafile=str(tls.ca_file))
    client_context.check_hostname = False
    client = client_context.wrap_socket(ours)
    shaking.join(5)
    record = server.record(b"250 OK\r\n")
    client.settimeout(2.0)
    ends = time.monotonic() + 0.2
    seconds_left = (lambda: ends - time.monotonic()) if lease == "ends" else (lambda: 0.1)
    theirs.sendall(record[: len(record) // 2])
    rest = threading.Timer(0.8, theirs.sendall, args=(record[len(record) // 2 :],))
    rest.start()
    reader = EarlyAnswer(client).reader(within=2.0)
    started = time.monotonic()
    try:
        with calls_end_in(seconds_left):
            if lease == "ends":
                with pytest.raises(TimeoutError, match="lease"):
                    reader.readline()
            else:
                assert reader.readline() == b"250 OK\r\n"
        took = time.monotonic() - started
    finally:
        rest.join(5)
        client.close()
        theirs.close()
    assert took < 0.5 if lease == "ends" else took > 0.7, f"{took:.2f}s"


@pytest.mark.parametrize("end", ["its timeout", "its lease"])
def test_an_answer_that_came_in_time_is_read_after_a_pause_of_this_process(end: str) -> None:
    """The server answers at once; this process is paused (a loaded machine, 2 shared
    cores) past the answer's wait (0.2 s) or the claim's lease (0.1 s) before it reads.
    The reader looked at the clock first and ended the call "timed out" with the answer
    in its socket: a healthy send taken for ambiguous (the CI's four Unknowns within
    63 ms). What arrived is taken without waiting; nothing more is waited for."""
    ours, theirs = socket.socketpair()
    ours.settimeout(2.0)
    ends = time.monotonic() + 0.1
    seconds_left = (lambda: ends - time.monotonic()) if end == "its lease" else None
    try:
        reader = EarlyAnswer(ours).reader(within=0.2 if end == "its timeout" else 2.0)
        theirs.sendall(b"250 OK\r\n")
        time.sleep(0.3)  # the pause
        with calls_end_in(seconds_left):
            assert reader.readline() == b"250 OK\r\n"
            started = time.monotonic()
            with pytest.raises(TimeoutError):  # the next answer is not waited for
                reader.readline()
            assert time.monotonic() - started < 0.1
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("end", ["its timeout", "its lease"])
@pytest.mark.parametrize("how", ["closed", "reset"])
def test_a_hang_that_ends_during_a_pause_of_this_process_is_a_timeout(end: str, how: str) -> None:
    """The server holds the request and gives up on it (a hang's far end, a relay that
    closes what it held), while this process is paused past the answer's wait (0.2 s)
    or the claim's lease (0.1 s). The read found the connection's end and the call ended
    "connection closed without a response", an answer for the circuit: the four sends
    of a hang so ended closed the circuit, and the next four went into the hang unprobed
    (tests/e2e/test_races.py's hang, the daemon stopped 0.7 s every 1.3 s). No answer
    came within the wait: it timed out."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname(), timeout=2.0)
        theirs, _ = listener.accept()
    ends = time.monotonic() + 0.1
    seconds_left = (lambda: ends - time.monotonic()) if end == "its lease" else None
    try:
        reader = EarlyAnswer(ours).reader(within=0.2 if end == "its timeout" else 2.0)
        if how == "reset":
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        theirs.close()
        time.sleep(0.3)  # the pause
        with calls_end_in(seconds_left), pytest.raises(TimeoutError) as raised:
            reader.readline()
        assert ("lease" in str(raised.value)) is (end == "its lease")
    finally:
        ours.close()


def test_a_close_found_by_a_read_begun_in_time_but_ended_past_the_wait_is_a_timeout() -> None:
    """The read began within the answer's wait, in the socket's own timeout (begun that
    early, `AnswerReader` leaves it), and the process was paused across the wait's end
    (the e2e harness's SIGSTOP): the read found the connection's end past it. Here the
    end comes between the wait's end (0.2 s) and the socket's timeout (0.24 s)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname(), timeout=0.24)
        theirs, _ = listener.accept()
    closing = threading.Timer(0.22, theirs.close)
    try:
        reader = EarlyAnswer(ours).reader(within=0.2)
        closing.start()
        with pytest.raises(TimeoutError, match="timed out"):
            reader.readline()
    finally:
        closing.join(5)
        ours.close()


def test_a_connection_closed_within_the_wait_is_not_a_timeout() -> None:
    """The other side of the above: a close read before the wait's end says what it
    says (no answer, not a hang of the wait's length)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(2.0)
    try:
        reader = EarlyAnswer(ours).reader(within=2.0)
        theirs.close()
        assert reader.readline() == b""
    finally:
        ours.close()


def test_an_answer_read_within_the_lease_is_held_to_its_bound() -> None:
    """The lease's wait reads what is readable without waiting, a piece at a time, and
    hands it to the reader a buffer at a time: each piece counts whole against the
    answer's bound as it comes, so a server flooding an answer without end is cut at
    the bound, not at several times it."""
    ours, theirs = socket.socketpair()
    ours.settimeout(10.0)  # longer than the lease: its wait reads
    bound = 1 << 20
    stop = threading.Event()

    def flood() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                theirs.sendall(b"x" * PIECE)

    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    read = 0
    reader = EarlyAnswer(ours).reader(within=10.0, bound=bound)
    try:
        with calls_end_in(lambda: 5.0), pytest.raises(AnswerTooLong):
            while chunk := reader.read(8192):
                read += len(chunk)
    finally:
        stop.set()
        reader.close()  # the socket's reader holds it open
        ours.close()
        theirs.close()
        flooding.join(5)
    assert read <= bound + 2 * PIECE, read


def test_a_clock_set_back_during_the_claims_save_does_not_stretch_the_call() -> None:
    """The claim's deadline is written by the clock before its save; the call's bound is
    placed in monotonic seconds by a look at the clock after it. A clock set back 10 s
    during the save put the bound those 10 s past the deadline as written (another
    daemon, its clock right, recovers the claim then, the call still running). The bound
    is never further than the lease from that look."""
    rig = EngineRig(policy("legal", on_unknown="review"))
    try:
        rig.submit("legal", "k1")
        leases = Leases(rig.ledger, rig.clock, "d", rig.clock.elapsed)
        claimed_at = rig.clock()
        rig.clock.advance(0.5)  # the claim's save
        rig.clock.jump(-10.0)  # an NTP step back meanwhile
        lease = leases.hold(rig.job("k1"), LEASE, claimed_at, GRACE)
        left = leases.time_left(lease)
    finally:
        rig.close()
    assert left <= LEASE - GRACE, left  # at most one timeout, not 10 s more


class _Counting(socket.socket):
    """A socket that counts the changes of its blocking mode and timeout (each a system
    call that lets go of the interpreter lock)."""

    changes = 0

    def settimeout(self, value: float | None) -> None:
        self.changes += 1
        super().settimeout(value)

    def setblocking(self, flag: bool) -> None:
        self.changes += 1
        super().setblocking(flag)


@pytest.mark.parametrize(("ends_before", "waited"), [(0.02, False), (0.5, True)])
def test_an_ordinary_answer_within_its_lease_is_read_as_any(
    ends_before: float, waited: bool
) -> None:
    """A send's lease is counted from before its claim's save, so its bound ends a few
    milliseconds before its answer's `timeout`: every answer of every healthy send went
    through the lease's wait (a poll, and the socket's timeout changed and put back: four
    system calls where a read makes two). A read the socket's timeout ends by the lease's
    end plus `ANSWER_SLACK` is made as any read; a lease shorter still is waited for.
    The lease stands still here (as a renewal keeps it), so that a pause of this process
    before the read changes neither way."""
    mine, theirs = socket.socketpair()
    ours = _Counting(mine.family, mine.type, mine.proto, fileno=mine.detach())
    ours.settimeout(2.0)
    ours.changes = 0
    try:
        reader = EarlyAnswer(ours).reader(within=2.0)
        theirs.sendall(b"250 OK\r\n")
        with calls_end_in(lambda: 2.0 - ends_before):
            assert reader.readline() == b"250 OK\r\n"
    finally:
        ours.close()
        theirs.close()
    assert (ours.changes > 0) is waited, ours.changes
