"""The local SMTP sink every system of bench/smtp_senders.py sends into: aiosmtpd (the
bench's own extra, `pip install -e '.[bench]'`), in a process of its own so that the CPU a
sender is measured with is the sender's alone.

It asks for AUTH (PLAIN or LOGIN, no TLS: loopback only), accepts every message with a
Postfix-like `250 2.0.0 Ok: queued as ID` and counts each one by its Message-ID header: the
copies a bench reports are the ones counted here, never a sender's own records. With
`file_sent` it also hands each accepted message to a Dovecot LMTP listener as
`sender+Sent@` (what Postfix's `sender_bcc_maps` does in `testkit.mailservers`), so the
sender's sent folder holds one copy per accepted message and a search can count them (the
`sent_copy = "server"` behaviour of docs/providers.md "Where the sent copy comes from").
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import smtplib
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

_MESSAGE_ID = re.compile(rb"(?im)^message-id:[ \t]*(<[^>\r\n]*>)")
_HEADER_END = re.compile(rb"\r?\n\r?\n")


def message_id_of(data: bytes) -> str:
    """The Message-ID header of a message's header block ("" when it has none)."""
    match = _HEADER_END.search(data)
    head = data[: match.start()] if match else data
    found = _MESSAGE_ID.search(head)
    return found.group(1).decode("ascii", "replace") if found else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Handler:
    def __init__(self, password: str, file_sent: tuple[int, str] | None) -> None:
        self.password = password.encode()
        self.lock = threading.Lock()
        self.copies: Counter[str] = Counter()
        self.connections = 0
        self.logins = 0
        self._queued = 0
        self._file_sent = file_sent
        self._lmtp: smtplib.LMTP | None = None

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth: Any
    ) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        ok = isinstance(auth, LoginPassword) and auth.password == self.password
        if ok:
            with self.lock:
                self.logins += 1
        return AuthResult(success=ok, handled=False)

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        # Offered as Postfix offers it (RFC 2920): aiosmtpd reads the commands of a
        # pipelined group one after the other from its stream and answers each in order.
        # smtplib never pipelines, so only sendledger's own submission uses it.
        return [*responses[:-1], "250-PIPELINING", responses[-1]]

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        data: bytes = envelope.original_content or envelope.content
        message_id = message_id_of(data)
        if self._file_sent is not None:
            self._file(envelope.mail_from, data)
        with self.lock:
            self.copies[message_id] += 1
            self._queued += 1
            queue_id = f"S{self._queued:09d}"
        return f"250 2.0.0 Ok: queued as {queue_id}"

    def _file(self, sender: str, data: bytes) -> None:
        # Blocking, in the sink's loop: only the kill -9 runs file copies, and there the
        # filing is part of what the server does before its 250.
        assert self._file_sent is not None
        port, domain = self._file_sent
        local = sender.split("@", 1)[0]
        for attempt in (1, 2):
            try:
                if self._lmtp is None:
                    self._lmtp = smtplib.LMTP("127.0.0.1", port, timeout=10)
                    self._lmtp.ehlo("sink")
                self._lmtp.sendmail(sender, [f"{local}+Sent@{domain}"], data)
                return
            except (OSError, smtplib.SMTPException):
                self._lmtp = None
                if attempt == 2:
                    raise


def _serve(conn: Connection, password: str, file_sent: tuple[int, str] | None) -> None:
    import warnings

    # AUTH without TLS is the point on loopback; aiosmtpd warns about it at every session.
    warnings.simplefilter("ignore")
    # ... and logs a deprecation of its own at every AUTH.
    logging.getLogger("mail.log").setLevel(logging.ERROR)
    from aiosmtpd.controller import Controller

    handler = _Handler(password, file_sent)
    port = free_port()
    controller = Controller(
        handler,
        hostname="127.0.0.1",
        port=port,
        authenticator=handler.authenticate,
        auth_required=True,
        auth_require_tls=False,
        # A whole bench run on one connection: the sink never closes an idle one first.
        timeout=600,
    )
    controller.start()
    conn.send(port)
    while True:
        command, arg = conn.recv()
        if command == "stop":
            controller.stop()
            conn.send(None)
            return
        with handler.lock:
            if command == "copies":
                conn.send({mid: handler.copies.get(mid, 0) for mid in arg})
            elif command == "total":
                conn.send(sum(handler.copies.values()))
            elif command == "logins":
                conn.send(handler.logins)


@dataclass
class Sink:
    port: int
    _conn: Connection

    def call(self, command: str, arg: Any = None) -> Any:
        self._conn.send((command, arg))
        return self._conn.recv()

    def copies(self, message_ids: list[str]) -> dict[str, int]:
        """{Message-ID: copies accepted} of the ids asked for."""
        counts: dict[str, int] = self.call("copies", message_ids)
        return counts

    def total(self) -> int:
        total: int = self.call("total")
        return total

    def logins(self) -> int:
        logins: int = self.call("logins")
        return logins


def receive(conn: Connection, process: BaseProcess, what: str) -> Any:
    """The next answer of a child process; SystemExit naming `what` when the child ended
    without one (an import that failed, a crash), instead of waiting for ever."""
    while not conn.poll(0.2):
        if not process.is_alive():
            raise SystemExit(f"{what} ended without answering (exit code {process.exitcode})")
    return conn.recv()


@contextmanager
def sink_process(password: str, *, file_sent: tuple[int, str] | None = None) -> Iterator[Sink]:
    """The sink in its own process; `file_sent`: (Dovecot LMTP port, mail domain)."""
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(child, password, file_sent), daemon=True
    )
    process.start()
    sink = Sink(receive(parent, process, "the SMTP sink"), parent)
    try:
        yield sink
    finally:
        sink.call("stop")
        process.join(timeout=10)


# -- a network's round trip --------------------------------------------------------------


def _delay_serve(conn: Connection, upstream: int, rtt: float) -> None:
    """A TCP proxy to the sink that holds every chunk half a round trip in each direction,
    in order: a server `rtt` seconds away, as a real submission server is."""
    import asyncio

    half = rtt / 2

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await held.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        with suppress(OSError):
            while data := await reader.read(65536):
                held.put_nowait((loop.time() + half, data))
        held.put_nowait((loop.time() + half, b""))
        with suppress(OSError):
            await delivering

    async def session(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))

    async def main() -> None:
        server = await asyncio.start_server(session, "127.0.0.1", 0)
        conn.send(server.sockets[0].getsockname()[1])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        server.close()

    asyncio.run(main())


@contextmanager
def round_trip(sink: Sink, rtt: float) -> Iterator[Sink]:
    """The sink as seen across a network with this round trip (seconds; 0: the sink)."""
    if rtt <= 0:
        yield sink
        return
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_delay_serve, args=(child, sink.port, rtt), daemon=True
    )
    process.start()
    try:
        yield Sink(receive(parent, process, "the round-trip proxy"), sink._conn)
    finally:
        parent.send("stop")
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
